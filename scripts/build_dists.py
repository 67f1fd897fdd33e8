"""Build each project's sdist, then its wheel from that sdist (as ``python -m build`` does).

Usage: python scripts/build_dists.py PROJECT OUTDIR [PROJECT OUTDIR ...]

Every distribution in this repository is built by hatchling, but for the compiled one
(plugins/kernels/cpu-native: setuptools, against this interpreter's torch), so one interpreter that
has both (``.venv``) builds them all by calling the PEP 517 hooks itself: a tenth of a second a
project, where a build front-end (``uv build``, ``python -m build``) spends one to two seconds of CPU
on each, in an isolated environment and a process per hook. In place of that isolation, each
project's ``[build-system]`` must name one of these backends with requirements this interpreter
satisfies, or the project fails to build here. The archives hold the same files as ``uv build``'s.
"""

from __future__ import annotations

import importlib
import os
import sys
import tarfile
import tempfile
import tomllib
from contextlib import chdir
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from packaging.requirements import Requirement

BACKENDS = ("hatchling.build", "setuptools.build_meta")


def build_system(project: Path) -> dict:
    """The project's ``[build-system]`` table."""
    return tomllib.loads((project / "pyproject.toml").read_text()).get("build-system", {})


def unmet_build_requirements(project: Path) -> list[str]:
    """What of the project's ``[build-system]`` this interpreter does not provide."""
    spec = build_system(project)
    backend = spec.get("build-backend")
    unmet = [] if backend in BACKENDS else [f"build-backend {backend!r} (not {' or '.join(BACKENDS)})"]
    for requirement in map(Requirement, spec.get("requires", [])):
        try:
            installed = version(requirement.name)
        except PackageNotFoundError:
            installed = None
        if installed is None or not requirement.specifier.contains(installed, prereleases=True):
            unmet.append(f"{requirement} (installed: {installed or 'none'})")
    return unmet


def build(project: Path, out: Path) -> None:
    """The project's sdist into ``out``, then the wheel built from that sdist, unpacked."""
    backend = importlib.import_module(build_system(project)["build-backend"])
    # setuptools logs every file it copies: quiet, as hatchling is (a compiler's errors still show)
    settings = {"quiet": "1"} if backend.__name__ == "setuptools.build_meta" else None

    out.mkdir(parents=True, exist_ok=True)
    with chdir(project):
        sdist = out / backend.build_sdist(str(out), settings)
    with tempfile.TemporaryDirectory() as unpacked:
        with tarfile.open(sdist) as archive:
            archive.extractall(unpacked, filter="data")
        (root,) = Path(unpacked).iterdir()
        with chdir(root):
            backend.build_wheel(str(out), settings)


def main(arguments: list[str]) -> int:
    if not arguments or len(arguments) % 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    status = 0
    pairs = [(Path(p).resolve(), Path(o).resolve()) for p, o in zip(arguments[::2], arguments[1::2])]
    for project, out in pairs:
        name = os.path.relpath(project)
        if unmet := unmet_build_requirements(project):
            print(f"FAIL: {name}: build: this interpreter lacks {', '.join(unmet)}", file=sys.stderr)
            status = 1
            continue
        try:
            build(project, out)
        except Exception as error:  # one project's failure is reported and the others still build
            print(f"FAIL: {name}: build: {type(error).__name__}: {error}", file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
