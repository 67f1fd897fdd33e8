"""Helpers for testing llmp and its plugins against the real CLI and real installs."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def run_llmp(
    *args: str, env: dict[str, str] | None = None, pythonpath: Path | None = None, check: bool = True,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m llmp ARGS`` with no inherited ``LLMP_*`` variables; ``env`` adds some."""
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("LLMP_")}
    if pythonpath is not None:
        child_env["PYTHONPATH"] = str(pythonpath)
    child_env.update(env or {})
    result = subprocess.run(
        [sys.executable, "-m", "llmp", *args], capture_output=True, text=True, env=child_env, timeout=timeout
    )
    if check and result.returncode != 0:
        raise AssertionError(f"llmp {' '.join(args)} exited {result.returncode}:\n{result.stderr}")
    return result


def pip_install_target(target: Path, *projects: Path) -> None:
    """A real ``pip install`` of plugin projects into ``target``: no deps, no build isolation, no network."""
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", "--target", str(target), *map(str, projects)],
        check=True, capture_output=True, text=True, timeout=300,
    )


@contextmanager
def registered(plugin: object, name: str | None = None) -> Iterator[str]:
    """Register ``plugin`` in-process for the duration of a ``with`` block."""
    from llmp import plugins

    registered_name = plugins.register(plugin, name)
    try:
        yield registered_name
    finally:
        plugins.unregister(registered_name)
