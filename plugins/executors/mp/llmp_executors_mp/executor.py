"""The ``mp`` executor: ``tensor_parallel_size`` worker processes on this machine.

Each worker gets its commands on its own ZMQ socket and answers on a shared
one. Every wait is bounded and watches the workers, so a crash or a hang
becomes an ``EngineDeadError``, never a stuck engine.
"""

from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

import zmq

from llmp.api import EngineDeadError, ResolvedModel
from llmp.executor import raise_rpc_failures
from llmp.options import EngineConfig

POLL_MS = 100


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MultiprocExecutor:
    def __init__(self, config: EngineConfig, model: ResolvedModel) -> None:
        self.world_size = config.tensor_parallel_size
        self.timeout = config.worker_timeout_s
        self.context = zmq.Context()
        self.context.setsockopt(zmq.LINGER, 0)  # never block on unsent messages to a dead worker
        base = os.path.join(tempfile.gettempdir(), f"llmp-mp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        self.results = self.context.socket(zmq.PULL)
        self.results.bind(f"ipc://{base}-results")
        init_method = f"tcp://127.0.0.1:{free_port()}"
        self.commands: list[zmq.Socket] = []
        self.processes: list[subprocess.Popen] = []
        self._closed = False
        self._call = 0  # every command's number, echoed in its replies: a late reply is told apart
        for rank in range(self.world_size):
            commands = self.context.socket(zmq.PUSH)
            commands.setsockopt(zmq.SNDTIMEO, POLL_MS)  # a dead worker's socket blocks a send: see _send
            commands.bind(f"ipc://{base}-rank{rank}")
            self.commands.append(commands)
            process = subprocess.Popen([sys.executable, "-m", "llmp_executors_mp.worker"], stdin=subprocess.PIPE)
            args = (
                config,
                model,
                rank,
                self.world_size,
                init_method,
                f"ipc://{base}-rank{rank}",
                f"ipc://{base}-results",
                os.getpid(),
            )
            process.stdin.write(pickle.dumps(args))
            process.stdin.close()
            self.processes.append(process)
        try:
            described = self._wait(range(self.world_size), timeout=max(self.timeout, 600))
        except EngineDeadError:
            self.shutdown()
            raise
        first = described[0]
        self.kernels_name = first["kernels_name"]
        self.kernels_isa_path = first["isa_path"]
        self.load_seconds = max(d["load_seconds"] for d in described.values())
        self._bytes_per_block = first["bytes_per_block"]
        self.worker_pids = [described[r]["pid"] for r in range(self.world_size)]

    # -- messaging -----------------------------------------------------------

    def _broadcast(self, method: str, *args: Any) -> None:
        if self._closed:
            raise EngineDeadError("the mp executor has been shut down")
        payload = pickle.dumps((self._call + 1, method, args), protocol=pickle.HIGHEST_PROTOCOL)
        self._call += 1
        for rank, commands in enumerate(self.commands):
            self._send(rank, commands, payload)

    def _send(self, rank: int, commands: zmq.Socket, payload: bytes) -> None:
        """A command to one rank. A worker that died since the last step takes nothing: its socket
        blocks every send (no peer), so each try is bounded and the workers are watched meanwhile."""
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                commands.send(payload, copy=False)
                return
            except zmq.Again:
                self.check_health()
                if time.monotonic() > deadline:
                    raise EngineDeadError(f"worker {rank} took no command within {self.timeout:.0f} s") from None

    def _wait(self, ranks: Any, timeout: float | None = None, fatal_timeout: bool = True) -> dict[int, Any]:
        """Replies of ``ranks`` to the last command; raises EngineDeadError on a worker error, death
        or timeout (``TimeoutError`` for a timeout that is not ``fatal_timeout``)."""
        pending, replies = set(ranks), {}
        deadline = time.monotonic() + (timeout or self.timeout)
        while pending:
            if self.results.poll(POLL_MS):
                rank, call, ok, payload = pickle.loads(self.results.recv())
                if call != self._call and ok:  # the answer to a collective_rpc that timed out
                    continue
                if not ok:
                    # A peer's death often surfaces first as a collective error on another
                    # rank: give the dead one a moment to be seen, and report it as the cause.
                    time.sleep(0.5)
                    self.check_health()
                    raise EngineDeadError(f"worker {rank} failed: {payload}")
                replies[rank] = payload
                pending.discard(rank)
                continue
            self.check_health()
            if time.monotonic() > deadline:
                if not fatal_timeout:
                    raise TimeoutError(f"workers {sorted(pending)} did not answer within {timeout:g} s")
                raise EngineDeadError(
                    f"workers {sorted(pending)} did not answer within {timeout or self.timeout:.0f} s"
                )
        return replies

    # -- the executor contract -------------------------------------------------

    def bytes_per_block(self) -> int:
        return self._bytes_per_block

    def allocate_kv_cache(self, num_blocks: int) -> None:
        self._broadcast("allocate_kv_cache", num_blocks)
        self._wait(range(self.world_size))

    def execute_model(self, inputs: Any) -> Any:
        self._broadcast("execute_model", inputs)
        return self._wait([0])[0]

    def collective_rpc(
        self,
        method: str | Callable[..., Any],
        timeout: float | None = None,
        args: tuple = (),
        kwargs: dict[str, Any] | None = None,
    ) -> list[Any]:
        try:
            pickle.dumps((method, args, kwargs))
        except Exception as exc:  # a lambda, a local function, an open file ...
            raise ValueError(f"collective_rpc: the call cannot be sent to the worker processes: {exc}") from None
        self._broadcast("collective_rpc", method, tuple(args), kwargs)
        if timeout is None:
            replies = self._wait(range(self.world_size), timeout=float("inf"))
        else:
            replies = self._wait(range(self.world_size), timeout=timeout, fatal_timeout=False)
        return raise_rpc_failures(method, [replies[rank] for rank in range(self.world_size)])

    def check_health(self) -> None:
        dead = [(rank, p.pid, code) for rank, p in enumerate(self.processes) if (code := p.poll()) is not None]
        if not dead:
            return
        # a worker killed by a signal is the cause; the others exit after reporting what its loss did to them
        killed = [d for d in dead if d[2] < 0]
        if not killed:
            self._raise_reported_error()
        rank, pid, code = (killed or dead)[0]
        how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
        raise EngineDeadError(f"worker {rank} (pid {pid}) died ({how})")

    def _raise_reported_error(self, wait: float = 1.0) -> None:
        """Raise the error a worker sent before it exited: on a loaded machine its message can land
        after its process is seen gone, and "worker 0 failed: ValueError: ..." says why where
        "worker 0 died (exit code 1)" does not."""
        deadline = time.monotonic() + wait
        while self.results.poll(max(0, int((deadline - time.monotonic()) * 1000))):
            rank, _, ok, payload = pickle.loads(self.results.recv())
            if not ok:
                raise EngineDeadError(f"worker {rank} failed: {payload}")

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        payload = pickle.dumps((self._call + 1, "shutdown", ()))  # the shape of every command
        for commands in self.commands:
            try:
                commands.send(payload, zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
        deadline = time.monotonic() + 5
        for process in self.processes:
            try:
                process.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
        for sock in (*self.commands, self.results):
            sock.close(linger=0)
        self.context.term()
