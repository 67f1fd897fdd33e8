"""Shared fixtures: pip-installed fixture plugins, a clean in-process plugin state."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmp.testing import pip_install_target

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"


@pytest.fixture(scope="session")
def third_party_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding the pip-installed out-of-tree example plugin and the broken fixture."""
    target = tmp_path_factory.mktemp("site")
    pip_install_target(target, REPO / "examples" / "llmp-hello", FIXTURES / "llmp-example-broken")
    return target


@pytest.fixture
def clean_plugin_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Run in-process tests with a fresh plugin state and no LLMP_* switches."""
    from llmp import plugins

    for key in list(os.environ):
        if key.startswith("LLMP_"):
            monkeypatch.delenv(key)
    monkeypatch.setattr(plugins, "_state", plugins._State())
    yield


# Ray clusters in these tests live on loopback for a few seconds: no token
# authentication, decided before any test starts Ray in this process (a driver
# keeps the auth mode of its first connection).
os.environ.setdefault("RAY_AUTH_MODE", "disabled")


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem: str, report: pytest.TestReport, sched: object) -> None:
    """Name the test a pytest-xdist worker died in, at once: the summary that would name it may never come
    (xdist can hang after replacing a crashed worker), and a worker killed for memory leaves no traceback."""
    import sys

    print(f"\n[conftest] a worker died running {crashitem}", file=sys.stderr, flush=True)
