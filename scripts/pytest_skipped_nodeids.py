"""A pytest plugin for CI: ``python -m pytest -p scripts.pytest_skipped_nodeids --skipped-nodeids=FILE``
appends the node ids of the tests that were skipped to FILE, one a line.

A plugin's tests run in its isolation venv, where a test that needs a sibling plugin skips; the
main run, with every plugin installed, runs those node ids again, so each test runs somewhere.
"""

from __future__ import annotations

from pathlib import Path

import pytest

_skipped: list[str] = []  # one pytest session per process: plain module state


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--skipped-nodeids", metavar="FILE", help="append the node ids of skipped tests to FILE")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):  # an xfail is reported as a skip too
        _skipped.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = session.config.getoption("skipped_nodeids")
    if path:
        with Path(path).open("a") as out:
            out.writelines(f"{nodeid}\n" for nodeid in _skipped)
