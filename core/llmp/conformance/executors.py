"""The executor suite: greedy parity with ``uniproc``, ``collective_rpc``, a killed worker, shutdown.

One engine of the executor under test (an ``LLM`` in this process, on the tiny Llama; tensor
parallelism of 2 when its record says ``distributed=True``) serves every check, in this order:

1. its greedy output equals the built-in ``uniproc`` executor's;
2. ``collective_rpc`` (optional in the API) runs a worker method and a function on every rank in
   rank order, refuses an unknown method naming the rank, and keeps a late answer out of the next call;
3. a worker process killed with SIGKILL makes the next request fail with
   :class:`llmp.api.EngineDeadError` within seconds (never a hang);
4. ``shutdown()`` returns, is idempotent, and leaves no worker process running.

Worker processes are found through ``collective_rpc("describe")`` (each rank's pid), else as the
child processes this process gained with the engine. An executor whose worker runs in the engine's
own process (``uniproc``) has nothing to kill: those checks skip.

Options (``verify(..., **options)``): ``executor_options`` (a dict of extra engine options for the
executor under test, e.g. ``{"ray_address": "127.0.0.1:6379"}``), ``executor_death_timeout_s``
(how long a request may take to fail after a worker died; default 15).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from typing import Any

from llmp.api import EngineDeadError, ExecutorSpec
from llmp.conformance.engines import (
    ENGINE_OPTIONS,
    EngineHandle,
    Timeout,
    first_difference,
    greedy,
    once_or_raise,
    reference_engine,
    tiny_llama,
    token_prompts,
    within,
)
from llmp.conformance.runner import Check, Context, SkipCheck
from llmp.testing import pid_alive

__all__ = ["sleep_then_rank", "suite", "worker_pid"]

MAX_TOKENS = 8
DEATH_TIMEOUT_S = 15.0
CALL_TIMEOUT_S = 120.0  # a healthy call into the tiny engine takes well under a second
EXIT_WAIT_S = 10.0  # how long stopped workers may take to be gone


def worker_pid(worker: Any) -> int:
    """Run on a rank by ``collective_rpc``: the pid of the process hosting it."""
    return os.getpid()


def sleep_then_rank(worker: Any, seconds: float) -> int:
    """Run on a rank by ``collective_rpc``: answer late."""
    time.sleep(seconds)
    return worker.rank


def suite(spec: ExecutorSpec, context: Context) -> Iterator[Check]:
    run = _ExecutorRun(spec, context)
    parallel = f" (tensor-parallel {run.world_size})" if run.world_size > 1 else ""
    yield Check(f"greedy output equals uniproc's{parallel}", run.check_parity)
    yield Check("collective_rpc runs on every rank, in rank order", run.check_collective_rpc)
    yield Check("a killed worker fails requests with EngineDeadError, without hanging", run.check_worker_death)
    yield Check("shutdown() leaves no worker process", run.check_shutdown)


class _ExecutorRun:
    def __init__(self, spec: ExecutorSpec, context: Context) -> None:
        self.spec = spec
        self.context = context
        self.world_size = 2 if spec.distributed else 1
        self.death_timeout = float(context.options.get("executor_death_timeout_s", DEATH_TIMEOUT_S))
        self.extra_options = dict(context.options.get("executor_options") or {})
        self.prompts = token_prompts(4, seed=30)
        self.pids: list[int] | None = None  # the workers' pids, in rank order

    @property
    def label(self) -> str:
        return f"executor {self.spec.name!r}" + (f" (tensor-parallel {self.world_size})" if self.world_size > 1 else "")

    # -- the engine under test ---------------------------------------------------------------------

    def handle(self) -> EngineHandle:
        def build() -> EngineHandle:
            from llmp import LLM

            path = tiny_llama(self.context)
            before = _child_pids()
            llm = LLM(
                str(path),
                executor=self.spec.name,
                tensor_parallel_size=self.world_size,
                **ENGINE_OPTIONS,
                **self.extra_options,
            )
            return EngineHandle(llm, new_children=sorted(_child_pids() - before))

        handle = once_or_raise(self.context, f"executors:{self.spec.plugin}:{self.spec.name}", build)
        if handle.wedged:
            raise SkipCheck("the engine hung in an earlier check: it was not shut down (its workers were killed)")
        return handle

    def worker_pids(self) -> list[int]:
        """Each rank's pid, in rank order (from ``describe``), else the engine's new child processes;
        asked once, while the engine is healthy."""
        if self.pids is None:
            handle = self.handle()
            try:
                described = within(CALL_TIMEOUT_S, lambda: handle.llm.collective_rpc("describe"))
                self.pids = [int(d["pid"]) for d in described]
            except NotImplementedError:
                self.pids = list(handle.new_children)
            except Timeout:
                self.wedge(handle)
                raise AssertionError(
                    f"collective_rpc('describe') on {self.label} did not return within {CALL_TIMEOUT_S:g} s"
                ) from None
        return self.pids

    def wedge(self, handle: EngineHandle) -> None:
        """A call into the engine never returned: it is left as it is (shutting it down could hang
        too, and it is never closed), and its worker processes are killed."""
        handle.wedged = True
        _kill([pid for pid in (self.pids or handle.new_children) if pid != os.getpid()])

    def out_of_process_pids(self) -> list[int]:
        pids = [pid for pid in self.worker_pids() if pid != os.getpid()]
        if not pids:
            raise SkipCheck(
                "the workers run in the engine's own process, or could not be found (no collective_rpc and "
                "no child process): there is no worker process to kill or stop"
            )
        return pids

    # -- the checks ----------------------------------------------------------------------------------

    def check_parity(self) -> None:
        expected = greedy(reference_engine(self.context), self.prompts, MAX_TOKENS)
        handle = self.handle()
        try:
            got = within(CALL_TIMEOUT_S, lambda: greedy(handle.llm, self.prompts, MAX_TOKENS))
        except Timeout:
            self.wedge(handle)
            raise AssertionError(f"generate() on {self.label} did not return within {CALL_TIMEOUT_S:g} s") from None
        difference = first_difference(expected, got)
        assert not difference, f"greedy output of {self.label} differs from uniproc's on the tiny Llama: {difference}"

    def check_collective_rpc(self) -> None:
        llm = self.handle().llm

        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return within(CALL_TIMEOUT_S, lambda: llm.collective_rpc(*args, **kwargs))
            except Timeout:
                self.wedge(self.handle())
                raise AssertionError(
                    f"collective_rpc{args} on {self.label} did not return within {CALL_TIMEOUT_S:g} s"
                ) from None

        try:
            described = call("describe")
        except NotImplementedError:
            raise SkipCheck(
                "the executor has no collective_rpc (optional: without it the engine cannot sleep or profile)"
            ) from None
        ranks = [d.get("rank") for d in described]
        assert ranks == list(range(self.world_size)), (
            f"collective_rpc('describe') answered for ranks {ranks}; expected one answer per rank in rank order, "
            f"{list(range(self.world_size))}"
        )
        pids = call(worker_pid)
        assert pids == [d["pid"] for d in described], (
            f"collective_rpc(worker_pid), a function, answered {pids}; the ranks' pids are "
            f"{[d['pid'] for d in described]} (a function must run as function(worker, *args) on each rank)"
        )
        try:
            call("no_such_method")
        except ValueError as refused:
            assert "rank 0" in str(refused), (
                f"collective_rpc('no_such_method') raised ValueError({str(refused)!r}), which does not name the "
                "rank that refused it (use llmp.executor.raise_rpc_failures)"
            )
        except Exception as error:
            raise AssertionError(
                f"collective_rpc('no_such_method') raised {type(error).__name__}: {error}; expected a ValueError "
                "naming rank 0 (run llmp.executor.rpc_outcome on each rank, then raise_rpc_failures)"
            ) from None
        else:
            raise AssertionError("collective_rpc('no_such_method') returned instead of raising a ValueError")
        try:
            late = call(sleep_then_rank, timeout=0.1, args=(0.5,))
        except TimeoutError:
            pass
        else:
            raise AssertionError(
                f"collective_rpc(timeout=0.1) of a call taking 0.5 s returned {late} instead of raising TimeoutError"
            )
        again = call(sleep_then_rank, args=(0.0,))
        assert again == list(range(self.world_size)), (
            f"after a call that timed out, the next collective_rpc answered {again}, expected "
            f"{list(range(self.world_size))}: a late answer was taken for the reply to a later call"
        )
        assert [d["pid"] for d in call("describe")] == [d["pid"] for d in described], (
            "the workers changed after a failed collective_rpc: a failing call must not stop a rank"
        )

    def check_worker_death(self) -> None:
        pids = self.out_of_process_pids()
        handle = self.handle()
        rank, victim = len(pids) - 1, pids[-1]
        os.kill(victim, signal.SIGKILL)
        _wait_gone([victim], EXIT_WAIT_S)
        what = f"after worker rank {rank} (pid {victim}) of {self.label} was killed, generate()"
        started = time.monotonic()
        try:
            within(self.death_timeout, lambda: greedy(handle.llm, self.prompts[:2], MAX_TOKENS))
        except Timeout:
            self.wedge(handle)
            raise AssertionError(
                f"{what} neither failed nor returned within {self.death_timeout:g} s: the executor hangs on a dead "
                "worker. It must notice one (poll the worker processes, bound every wait) and raise "
                "llmp.api.EngineDeadError"
            ) from None
        except EngineDeadError:
            return
        except Exception as error:
            raise AssertionError(
                f"{what} raised {type(error).__name__}: {error}; expected llmp.api.EngineDeadError"
            ) from None
        raise AssertionError(
            f"{what} returned outputs {time.monotonic() - started:.1f} s later instead of raising "
            "llmp.api.EngineDeadError: the executor did not notice the dead worker"
        )

    def check_shutdown(self) -> None:
        handle = self.handle()
        pids = [p for p in self.worker_pids() if p != os.getpid()]
        try:
            within(CALL_TIMEOUT_S, handle.llm.shutdown)
        except Timeout:
            self.wedge(handle)
            raise AssertionError(f"shutdown() of {self.label} did not return within {CALL_TIMEOUT_S:g} s") from None
        handle.closed = True
        try:
            within(CALL_TIMEOUT_S, handle.llm.shutdown)
        except Timeout:
            raise AssertionError("a second shutdown() did not return: shutdown must be idempotent") from None
        except Exception as error:
            raise AssertionError(
                f"a second shutdown() raised {type(error).__name__}: {error}: it must be idempotent"
            ) from None
        survivors = _wait_gone(pids, EXIT_WAIT_S)
        if survivors:
            _kill(survivors)
            raise AssertionError(
                f"{EXIT_WAIT_S:g} s after shutdown() of {self.label}, worker processes {survivors} still run "
                f"(workers {pids}): shutdown must stop every worker"
            )


def _child_pids() -> set[int]:
    """This process's child processes (Linux: /proc), empty where that cannot be read."""
    children: set[int] = set()
    try:
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/children") as f:
                children.update(int(pid) for pid in f.read().split())
    except OSError:
        pass
    return children


def _wait_gone(pids: list[int], seconds: float) -> list[int]:
    """Wait until none of ``pids`` runs, at most ``seconds``; those still running."""
    deadline = time.monotonic() + seconds
    alive = [p for p in pids if pid_alive(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if pid_alive(p)]
    return alive


def _kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
