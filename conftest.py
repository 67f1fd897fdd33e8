"""Hooks for every test of the repository: tests/ and each plugin's tests."""

from __future__ import annotations

import faulthandler

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Python's fatal-signal handler again before each test. Ray's core worker (in a process that was a Ray
    driver) replaces it with its own, which prints nothing to the terminal: a later crash of the process would
    leave no traceback, and pytest-xdist would say only "node down: Not properly terminated"."""
    try:
        from _pytest.faulthandler import fault_handler_stderr_fd_key
    except ImportError:  # another pytest: its faulthandler is left as it is
        return
    stderr = item.config.stash.get(fault_handler_stderr_fd_key, None)
    if stderr is not None and faulthandler.is_enabled():
        faulthandler.disable()  # enable() alone keeps a handler it thinks is still installed
        faulthandler.enable(file=stderr, all_threads=True)
