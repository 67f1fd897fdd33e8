"""``llmp serve --api-server-count N``: N API-server processes on one port, sharing one engine.

The launcher (the ``llmp serve`` process) binds the port, starts the engine, warms it up once and
runs N children (``python -m llmp.server.api_server``). Each child serves the whole HTTP app, every
front-end included, on the inherited listening socket (the kernel hands each new connection to one
of them), through an engine client of its own that the launcher attaches to the engine
(``AsyncLLM.attach_client``): the engine sends each request's outputs to the process that sent it.
Children say when they are ready; the launcher lets them all serve at once and prints ``ready``.

Metrics: children write their counters and histograms to files in ``PROMETHEUS_MULTIPROC_DIR`` (in
a temporary directory made and removed here, named after the launcher's pid: a launcher that was
SIGKILLed could not remove its own, so the next one removes those whose launcher is gone) and any
child's ``/metrics`` sums them all.

Failures: a child that dies while serving is restarted (its requests in flight are lost: the
engine aborts them) and accepts connections again once ready, while the others serve; one that
keeps dying (``MAX_RESTARTS`` in ``RESTART_WINDOW_S``), one that fails to start and a dead engine
take the whole server down with one line saying why and status 1, so a supervisor restarts it.
SIGINT or SIGTERM is passed on to the children, which drain as a single server does (a second
signal aborts what is in flight), then the engine stops.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import os
import pickle
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmp.api import LLMPError
from llmp.async_llm import EngineAttachment
from llmp.server.settings import ServeSettings

log = logging.getLogger("llmp.server")
WATCH_S = 0.2
MAX_RESTARTS = 3  # restarts of API servers within RESTART_WINDOW_S; one more takes the server down
RESTART_WINDOW_S = 60.0
KILL_AFTER_S = 10.0  # past the children's own drain time (--shutdown-timeout and its grace)
WORKDIR_PREFIX = "llmp-api-servers-"  # then the launcher's pid and a dash: llmp-api-servers-PID-XXXX


def check_api_servers(settings: ServeSettings) -> None:
    """What several API servers cannot do, refused before anything starts."""
    if "grpc" in settings.server.frontend:
        raise LLMPError(
            "--frontend grpc listens on a port of its own, which several API servers cannot share: "
            "use --api-server-count 1 with it"
        )
    if settings.frontend.enable_lora_runtime_updates:
        raise LLMPError(
            "--enable-lora-runtime-updates loads an adapter into one API server's table of adapters, "
            "not the others': use --api-server-count 1 with it (--lora-modules work with any count)"
        )
    cpus = os.cpu_count() or 1
    if settings.server.api_server_count > cpus:
        log.warning(
            "--api-server-count %d is more than the %d CPUs: the API servers (and the engine) will "
            "compete for them; more processes than cores rarely serve more",
            settings.server.api_server_count,
            cpus,
        )


def remove_stale_workdirs(tmp: str | None = None) -> list[Path]:
    """Remove this user's launcher directories (ipc sockets, metrics files) whose launcher is no
    longer running (it was SIGKILLed); those removed."""
    removed = []
    for path in Path(tmp or tempfile.gettempdir()).glob(f"{WORKDIR_PREFIX}*"):
        found = re.fullmatch(rf"{WORKDIR_PREFIX}(\d+)-.+", path.name)
        try:
            ours = path.is_dir() and not path.is_symlink() and path.stat().st_uid == os.getuid()
        except OSError:
            continue
        if found and ours and not _running(int(found.group(1))):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: running
        return True
    return True


# -- an API server (the child) ----------------------------------------------------------------


@dataclass
class Replica:
    """An API server's place among several, handed to ``launch._serve``: its engine client's
    addresses, whether it replaces one that died (``late``), and its line to the launcher."""

    index: int
    attachment: EngineAttachment
    late: bool
    control_fd: int

    def start_serving(self, server: Any, sock: socket.socket) -> asyncio.Task:
        """uvicorn serving ``sock`` now; a late one only waits for a stop until it is ready (until
        then the other API servers take every connection)."""
        if self.late:
            return asyncio.create_task(_until_exit(server))
        return asyncio.create_task(server.serve(sockets=[sock]))

    def serving_now(self, server: Any, sock: socket.socket, serving: asyncio.Task) -> asyncio.Task:
        if not self.late:
            return serving
        serving.cancel()
        return asyncio.create_task(server.serve(sockets=[sock]))

    async def ready(self) -> None:
        """Tell the launcher this API server is ready, and wait until it says to serve."""
        reader, writer = await asyncio.open_unix_connection(sock=socket.socket(fileno=self.control_fd))
        writer.write(b"ready\n")
        await writer.drain()
        if await reader.readline() != b"go\n":
            raise LLMPError("the launcher of the API servers has gone")
        self._link = writer  # kept open: the launcher reads its end's closing as this process's end


async def _until_exit(server: Any) -> None:
    while not server.should_exit:
        await asyncio.sleep(WATCH_S)


# -- the launcher -----------------------------------------------------------------------------


class _Stop(Exception):
    """Start-up or serving ends: status 0 (a signal) or 1 (``reason``)."""

    def __init__(self, status: int, reason: str | None = None) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


@dataclass(eq=False)
class _Child:
    index: int
    process: subprocess.Popen
    attachment: EngineAttachment
    control: socket.socket  # the launcher's end of the child's line
    engine_index: int | None = None  # the engine's index of its client, once attached
    ready: bool = False
    reader: asyncio.StreamReader | None = None
    writer: asyncio.StreamWriter | None = None

    def exit_description(self) -> str:
        code = self.process.returncode
        return f"killed by signal {-code}" if code < 0 else f"exit status {code}"


@dataclass(frozen=True)
class LaunchSteps:
    """What the launcher does as a single ``llmp serve`` does it (``llmp.server.launch``, which
    imports this module, hands them over): the warm-up request, the ``ready`` line (given the
    seconds since start), the ``llmp: error:`` line, and how long a child may drain."""

    warm_up: Callable[[Any], Awaitable[None]]
    print_ready: Callable[[float], None]
    error: Callable[[BaseException], None]
    drain_s: float


def serve_api_servers(
    settings: ServeSettings,
    model: Any,
    sock: socket.socket,
    steps: LaunchSteps,
    started: float,
    engine_process: Any = None,
) -> int:
    """Serve with ``--api-server-count`` processes until interrupted; the exit status. The engine runs in
    ``engine_process`` when given (an ``EngineProcess`` started earlier, without its arguments yet)."""
    return _Launcher(settings, model, sock, steps, started, engine_process).run()


class _Launcher:
    def __init__(
        self,
        settings: ServeSettings,
        model: Any,
        sock: socket.socket,
        steps: LaunchSteps,
        started: float,
        engine_process: Any,
    ) -> None:
        self.settings, self.model, self.sock, self.steps = settings, model, sock, steps
        self.started, self.engine_process = started, engine_process
        self.count = settings.server.api_server_count
        self.engine: Any = None
        self.loading: concurrent.futures.Future | None = None
        self.children: dict[int, _Child] = {}
        for stale in remove_stale_workdirs():
            log.info("removed %s, left by an API-server launcher that is gone", stale)
        self.workdir = Path(tempfile.mkdtemp(prefix=f"{WORKDIR_PREFIX}{os.getpid()}-"))
        self.metrics_dir = self.workdir / "metrics"
        self.metrics_dir.mkdir()
        self.generations = itertools.count()
        self.restarts: deque[float] = deque()
        self.signals = 0
        self.stopping: asyncio.Event | None = None

    def run(self) -> int:
        from llmp.async_llm import AsyncLLM

        try:
            try:
                self.engine = AsyncLLM(
                    self.model,
                    engine_mode="process",
                    wait=False,
                    engine_process=self.engine_process,
                    **self.settings.engine.keywords(),
                )
            except (ValueError, TypeError, LLMPError) as exc:
                self.steps.error(exc)
                return 2
            # every process is spawned before any thread runs (a vfork beside a running thread can fail)
            for index in range(self.count):
                self.children[index] = self._spawn(index, late=False)
            self.loading = concurrent.futures.ThreadPoolExecutor(1).submit(self.engine.wait_ready)
            return asyncio.run(self._main())
        finally:
            for child in self.children.values():  # only after an error in the launcher itself
                if child.process.poll() is None:
                    child.process.kill()
            if self.engine is not None:
                if self.loading is not None:
                    concurrent.futures.wait([self.loading])
                self.engine.shutdown()
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _spawn(self, index: int, *, late: bool) -> _Child:
        base = self.workdir / f"api-{index}-{next(self.generations)}"
        attachment = EngineAttachment(f"ipc://{base}-in", f"ipc://{base}-out", self.engine.engine_pid)
        ours, theirs = socket.socketpair()
        replica = Replica(index, attachment, late, theirs.fileno())
        env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(self.metrics_dir)}
        process = subprocess.Popen(
            [sys.executable, "-m", "llmp.server.api_server"],
            stdin=subprocess.PIPE,
            env=env,
            pass_fds=(self.sock.fileno(), theirs.fileno()),
            process_group=0,  # Ctrl-C reaches the launcher alone: it passes SIGTERM on, once per signal
        )
        args = (self.settings, self.model, replica, self.sock.fileno(), os.getpid(), self.started)
        process.stdin.write(pickle.dumps(args))
        process.stdin.close()
        theirs.close()
        return _Child(index, process, attachment, ours)

    async def _main(self) -> int:
        loop = asyncio.get_running_loop()
        self.stopping = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._on_signal)
        try:
            await self._start()
            status = await self._supervise()
        except _Stop as stop:
            status = stop.status
            if stop.reason:
                self.steps.error(LLMPError(stop.reason))
        except LLMPError as exc:  # the warm-up failed, the engine stopped answering
            status = 1
            self.steps.error(exc)
        finally:
            await self._stop_children()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
        return status

    def _on_signal(self) -> None:
        self.signals += 1
        if self.signals == 1:
            log.info("shutting down %d API servers", len(self.children))
        self.stopping.set()
        self._signal_children()

    def _signal_children(self) -> None:
        for child in self.children.values():
            if child.process.poll() is None:
                child.process.send_signal(signal.SIGTERM)

    async def _start(self) -> None:
        for child in self.children.values():
            await self._open(child)
        try:
            await self._guarded(asyncio.wrap_future(self.loading))
        except _Stop:
            raise
        except Exception as exc:
            raise _Stop(1, f"cannot start the engine: {exc}") from None
        log.info("warming up: one request through the whole path")
        await self._guarded(self.steps.warm_up(self.engine))
        for child in self.children.values():
            child.engine_index = await self.engine.attach_client(child.attachment)
        await self._guarded(asyncio.gather(*(self._wait_ready(child) for child in self.children.values())))
        for child in self.children.values():
            self._go(child)
        self.steps.print_ready(time.monotonic() - self.started)

    async def _guarded(self, awaitable: Any) -> Any:
        """``awaitable``'s result, unless a signal, a dead engine or an API server that exits during
        start-up comes first (``_Stop``)."""
        task = asyncio.ensure_future(awaitable)
        try:
            while not task.done():
                await asyncio.wait({task}, timeout=WATCH_S)
                if self.stopping.is_set():
                    raise _Stop(0)
                if not self.engine.is_running:
                    raise _Stop(1, f"the engine died ({self.engine.errored or 'the engine stopped'})")
                for child in self.children.values():
                    if not child.ready and child.process.poll() is not None:
                        raise _Stop(1, f"API server {child.index} exited during start-up ({child.exit_description()})")
        finally:
            if not task.done():
                task.cancel()
        return task.result()

    async def _open(self, child: _Child) -> None:
        child.reader, child.writer = await asyncio.open_unix_connection(sock=child.control)

    async def _wait_ready(self, child: _Child) -> None:
        if await child.reader.readline() == b"ready\n":
            return
        await asyncio.Event().wait()  # the child exited: _guarded reports it

    def _go(self, child: _Child) -> None:
        child.ready = True
        child.writer.write(b"go\n")

    async def _supervise(self) -> int:
        while not self.stopping.is_set():
            try:
                await asyncio.wait_for(self.stopping.wait(), WATCH_S)
            except TimeoutError:
                pass
            if self.stopping.is_set():
                break
            if not self.engine.is_running:
                raise _Stop(
                    1, f"the engine died ({self.engine.errored or 'the engine stopped'}); shutting the server down"
                )
            for child in list(self.children.values()):
                if child.process.poll() is not None:
                    await self._replace(child)
        return 0

    async def _replace(self, dead: _Child) -> None:
        """Restart an API server that died, unless it never became ready or they keep dying."""
        what = f"API server {dead.index} (pid {dead.process.pid}) exited ({dead.exit_description()})"
        if self.stopping.is_set():  # shutting down: nothing is restarted
            return
        if not dead.ready:
            raise _Stop(1, f"{what} before it was ready; shutting the server down")
        now = time.monotonic()
        self.restarts.append(now)
        while self.restarts and self.restarts[0] < now - RESTART_WINDOW_S:
            self.restarts.popleft()
        if len(self.restarts) > MAX_RESTARTS:
            many = f"more than {MAX_RESTARTS} API servers died within {RESTART_WINDOW_S:.0f} s"
            raise _Stop(1, f"{what}: {many}; shutting the server down")
        # status 0 or SIGTERM: someone stopped it on purpose (it drained); anything else is a crash
        planned = dead.process.returncode in (0, -signal.SIGTERM)
        log.log(logging.WARNING if planned else logging.ERROR, "%s: restarting it", what)
        if dead.engine_index is not None:
            aborted = await self.engine.detach_client(dead.engine_index)
            if aborted:
                log.warning("%d requests of API server %d were aborted", aborted, dead.index)
        self._forget(dead)
        child = self.children[dead.index] = self._spawn(dead.index, late=True)
        await self._open(child)
        child.engine_index = await self.engine.attach_client(child.attachment)
        asyncio.ensure_future(self._when_ready(child))

    async def _when_ready(self, child: _Child) -> None:
        await self._wait_ready(child)
        if self.children.get(child.index) is child and not self.stopping.is_set():
            self._go(child)
            log.info("API server %d (pid %d) restarted and serving", child.index, child.process.pid)

    def _forget(self, child: _Child) -> None:
        """What a dead child leaves: its end of the line, its sockets' files, its live gauges."""
        from prometheus_client.multiprocess import mark_process_dead

        if child.writer is not None:
            child.writer.close()
        for address in (child.attachment.input_address, child.attachment.output_address):
            Path(address.removeprefix("ipc://")).unlink(missing_ok=True)
        mark_process_dead(child.process.pid, str(self.metrics_dir))

    async def _stop_children(self) -> None:
        """SIGTERM to the children still running (the signal's own already went), then wait: they
        drain for --shutdown-timeout and its grace; past that (and KILL_AFTER_S more) they are killed."""
        if not self.signals:
            self._signal_children()
        deadline = time.monotonic() + self.steps.drain_s + KILL_AFTER_S
        while any(child.process.poll() is None for child in self.children.values()):
            if time.monotonic() > deadline:
                for child in self.children.values():
                    if child.process.poll() is None:
                        log.error("API server %d did not stop in time: killed", child.index)
                        child.process.kill()
                        child.process.wait()
                break
            await asyncio.sleep(0.05)
        for child in self.children.values():
            if child.writer is not None:
                child.writer.close()
