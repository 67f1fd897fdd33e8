"""Functions the mp tests send to worker processes through ``collective_rpc``: pickled by reference,
so the workers import this module by name (the tests put this directory on their ``PYTHONPATH``)."""

from __future__ import annotations

import time
from typing import Any


def rank_and_pid(worker: Any) -> tuple[int, int]:
    import os

    return worker.rank, os.getpid()


def sleep_then_rank(worker: Any, seconds: float) -> int:
    time.sleep(seconds)
    return worker.rank
