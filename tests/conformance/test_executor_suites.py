"""llmp's own executor, scheduler and KV-cache manager pass their suites; an executor that hangs on a
dead worker fails the executor suite precisely, without hanging the run.

(The ``mp`` and ``ray`` executors are verified in their own test folders.)
"""

from __future__ import annotations

import pickle
import re
import time

import pytest

from llmp import hookimpl
from llmp.api import ExecutorSpec
from llmp.conformance import verify
from llmp.testing import pid_alive, registered

try:
    from llmp_executors_mp.executor import MultiprocExecutor
except ImportError:  # the mp executor plugin is not installed: the hanging executor's test skips
    MultiprocExecutor = object


def test_llmps_own_executor_scheduler_and_kv_manager_conform():
    report = verify("llmp-engine", kinds=["executor", "scheduler", "kv_manager"])
    assert report.passed, "\n".join(f"{r.kind} {r.check}: {r.detail}" for r in report.failed)
    skipped = {(r.kind, r.check): r.detail for r in report.results if r.status == "skipped"}
    # uniproc runs the model in the engine's process: no worker process to kill; nothing else skips
    assert list(skipped) == [("executor", "a killed worker fails requests with EngineDeadError, without hanging")]
    assert "the engine's own process" in next(iter(skipped.values()))
    kinds = {r.kind for r in report.results}
    assert kinds == {"executor", "scheduler", "kv_manager"}


class DeafToDeath(MultiprocExecutor):
    """The mp executor, less its watch over its workers: it waits for every answer however long it
    takes, taking no notice of a failed or dead worker (a minute, here: then its thread ends)."""

    def __init__(self, config, model) -> None:
        super().__init__(config, model)
        self.timeout = 60  # how long a command waits for a dead worker's socket: the stuck thread ends then

    def check_health(self) -> None:
        pass

    def _wait(self, ranks, timeout=None, fatal_timeout=True):
        pending, replies = set(ranks), {}
        deadline = time.monotonic() + min(timeout or 60, 60)
        while pending:
            if self.results.poll(100):
                rank, call, ok, payload = pickle.loads(self.results.recv())
                if ok and call == self._call:  # a failed worker's answer goes unnoticed
                    replies[rank] = payload
                    pending.discard(rank)
            elif time.monotonic() > deadline:
                raise TimeoutError(f"workers {sorted(pending)} did not answer within {timeout} s")
        return replies


class HangingExecutorPlugin:
    @hookimpl
    def llmp_register_executors(self):
        yield ExecutorSpec(name="deaf-to-death", impl=f"{__name__}:DeafToDeath", distributed=True)


def test_an_executor_hanging_on_a_dead_worker_fails_precisely_and_leaves_no_process():
    if MultiprocExecutor is object:
        pytest.skip("needs the mp executor plugin (llmp-executors-mp), which is not installed")
    with registered(HangingExecutorPlugin(), "hanging-executor"):
        report = verify("hanging-executor", executor_death_timeout_s=3)
    results = {r.check: r for r in report.results}
    assert not report.passed
    assert results["greedy output equals uniproc's (tensor-parallel 2)"].status == "passed"
    assert results["collective_rpc runs on every rank, in rank order"].status == "passed"
    death = results["a killed worker fails requests with EngineDeadError, without hanging"]
    assert death.status == "failed" and death.seconds < 30
    match = re.fullmatch(
        r"after worker rank 1 \(pid (\d+)\) of executor 'deaf-to-death' \(tensor-parallel 2\) was killed, generate\(\) "
        r"neither failed nor returned within 3 s: the executor hangs on a dead worker\. It must notice one \(poll the "
        r"worker processes, bound every wait\) and raise llmp\.api\.EngineDeadError",
        death.detail,
    )
    assert match, death.detail
    shutdown = results["shutdown() leaves no worker process"]
    assert shutdown.status == "skipped" and "the engine hung in an earlier check" in shutdown.detail
    assert not pid_alive(int(match[1]))
