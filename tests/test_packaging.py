"""Every distribution's metadata is complete enough to publish (docs/publishing.md).

Cheap checks of the pyproject.toml files; CI builds each sdist and wheel and runs
``twine check --strict`` on them (scripts/check_plugin_isolation.sh, scripts/build_dists.py).
"""

from __future__ import annotations

import re
import tomllib
from functools import cache
from pathlib import Path

import pytest
import trove_classifiers
from packaging.requirements import Requirement
from packaging.version import Version

import llmp

REPO = Path(__file__).resolve().parents[1]
PROJECTS = [REPO, *sorted(p.parent for p in REPO.glob("plugins/*/*/pyproject.toml"))]
PROJECT_URL = "https://github.com/llmp-project/llmp"
LICENSE = REPO / "LICENSE"
BUILD_SYSTEM = {"requires": ["hatchling>=1.27"], "build-backend": "hatchling.build"}
COMPILED_BUILD_SYSTEM = {"requires": ["setuptools>=77"], "build-backend": "setuptools.build_meta"}


def relative(project_dir: Path) -> str:
    return project_dir.relative_to(REPO).as_posix() or "."


@cache
def pyproject(project_dir: Path) -> dict:
    return tomllib.loads((project_dir / "pyproject.toml").read_text())


@cache
def versions() -> dict[str, Version]:
    """Each in-repo distribution's version, by name."""
    found = {"llmp": Version(llmp.__version__)}
    for project_dir in PROJECTS[1:]:
        project = pyproject(project_dir)["project"]
        found[project["name"]] = Version(project["version"])
    return found


@pytest.fixture(params=PROJECTS, ids=relative)
def project_dir(request: pytest.FixtureRequest) -> Path:
    return request.param


def test_the_build_system_is_the_one_build_dists_provides(project_dir: Path):
    # scripts/build_dists.py builds with .venv's hatchling or setuptools (requirements-dev.txt), not in isolation;
    # setuptools only for a compiled plugin (torch.utils.cpp_extension), which builds against .venv's torch
    expected = COMPILED_BUILD_SYSTEM if (project_dir / "setup.py").is_file() else BUILD_SYSTEM
    assert pyproject(project_dir)["build-system"] == expected, relative(project_dir)


def test_the_core_fields_are_there(project_dir: Path):
    project, where = pyproject(project_dir)["project"], relative(project_dir)
    assert project["name"] == "llmp" or project["name"].startswith("llmp-"), where
    assert "version" in project or "version" in project.get("dynamic", []), where
    assert project.get("description", "").strip(), f"{where}: no description"
    assert project.get("requires-python") == ">=3.11", where
    assert project.get("authors"), f"{where}: no authors"
    assert project.get("keywords"), f"{where}: no keywords"
    assert project.get("entry-points", {}).get("llmp"), f"{where}: no entry point in group llmp"


def test_the_readme_is_the_long_description_and_its_links_work_on_pypi(project_dir: Path):
    project, where = pyproject(project_dir)["project"], relative(project_dir)
    assert project.get("readme") == "README.md", f'{where}: readme = "README.md" is missing'
    readme = (project_dir / "README.md").read_text()
    assert readme.startswith("# "), f"{where}: README.md has no title"
    # PyPI shows the README away from the repository: a relative link there leads nowhere
    relative_links = re.findall(r"\]\((?!https?://|#|mailto:)([^)]*)\)", readme)
    assert not relative_links, f"{where}: README.md links relatively to {relative_links}: use {PROJECT_URL}/..."


def test_the_license_is_apache_2_with_its_text_shipped(project_dir: Path):
    project, where = pyproject(project_dir)["project"], relative(project_dir)
    assert project.get("license") == "Apache-2.0", where
    assert project.get("license-files") == ["LICENSE"], f'{where}: license-files = ["LICENSE"] is missing'
    shipped = project_dir / "LICENSE"
    assert shipped.is_file(), f"{where}: no LICENSE"
    assert shipped.read_bytes() == LICENSE.read_bytes(), f"{where}/LICENSE differs from the repository's LICENSE"
    assert "Apache License" in LICENSE.read_text() and "Version 2.0, January 2004" in LICENSE.read_text()


def test_the_classifiers_are_real_and_say_what_pypi_lists(project_dir: Path):
    classifiers, where = pyproject(project_dir)["project"].get("classifiers", []), relative(project_dir)
    unknown = [c for c in classifiers if c not in trove_classifiers.classifiers]
    assert not unknown, f"{where}: not trove classifiers: {unknown}"
    for prefix in ("Development Status :: ", "Operating System :: ", "Topic :: "):
        assert any(c.startswith(prefix) for c in classifiers), f"{where}: no {prefix!r} classifier"
    assert "Programming Language :: Python :: 3.11" in classifiers, where
    # the SPDX `license` replaces them: PyPI refuses an upload that has both (PEP 639)
    assert not [c for c in classifiers if c.startswith("License :: ")], f"{where}: a License classifier"


def test_the_urls_point_at_the_project(project_dir: Path):
    urls, where = pyproject(project_dir)["project"].get("urls", {}), relative(project_dir)
    assert {"Homepage", "Documentation", "Source", "Issues"} <= urls.keys(), f"{where}: urls {sorted(urls)}"
    assert all(url.startswith(PROJECT_URL) for url in urls.values()), f"{where}: {urls}"
    if project_dir != REPO:
        assert urls["Source"] == f"{PROJECT_URL}/tree/main/{where}", where


def test_llmp_distributions_are_required_within_a_range_that_holds_this_release(project_dir: Path):
    # a plugin may break with llmp's next minor release (docs/plugins.md, "API versioning"): an
    # upper bound keeps pip from pairing it with one; the lower bound must admit the llmp beside it
    where, known = relative(project_dir), versions()
    requirements = [Requirement(r) for r in pyproject(project_dir)["project"]["dependencies"]]
    ours = [r for r in requirements if r.name in known]
    if project_dir != REPO:
        assert any(r.name == "llmp" for r in ours), f"{where}: no dependency on llmp"
    for requirement in ours:
        operators = {spec.operator for spec in requirement.specifier}
        assert operators & {">=", "~=", "=="} and operators & {"<", "~=", "=="}, f"{where}: {requirement} is not ranged"
        assert requirement.specifier.contains(known[requirement.name]), (
            f"{where}: {requirement} excludes {requirement.name} {known[requirement.name]} of this repository"
        )
