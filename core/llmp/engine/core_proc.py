"""The engine core loop, run in its own process (or a thread) behind two ZMQ sockets per client.

The loop drains incoming messages, runs one engine step whenever there is
work, and pushes the step's outputs back. It blocks on the input sockets only
when idle, so a busy engine never waits for the front-end.

Client 0 started the engine. Others (the API-server processes of ``llmp serve
--api-server-count N``) are attached by client 0 (``attach_client``): each has
its own pair of sockets, so the engine knows who sent a message by the socket it
came in on, answers on that client's socket, and sends each request's outputs to
the client that added it. Their request ids are made unique inside the engine
(``ID@INDEX``); a client that stops reading is dropped and its requests aborted.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import signal
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any

import msgspec
import zmq

from llmp.api import (
    EngineSleepingError,
    InvalidLoRAAdapterError,
    LLMPError,
    LoRAAdapterNotFoundError,
    RequestValidationError,
    ResolvedModel,
)
from llmp.engine import protocol as msg
from llmp.lora import LoRARequest
from llmp.options import EngineConfig
from llmp.outputs import RequestOutput
from llmp.sampling_params import SamplingParamsError, StructuredOutputsParams

log = logging.getLogger("llmp.engine")
IDLE_POLL_MS = 500
# `llmp serve` sends this request through the whole path before it reports ready: the server's own,
# so the stat loggers never see it (no warm-up in the first statistics line or in a plugin's counters)
WARM_UP_REQUEST_ID = "llmp-warm-up"
# messages queued for an attached client that is not reading: past this many it is taken for gone
ATTACHED_CLIENT_BACKLOG = 10_000
CONTROL_METHODS = frozenset({"shutdown", "attach_client", "detach_client"})  # client 0's alone
ADMIN_METHODS = frozenset(
    {
        "sleep",
        "wake_up",
        "is_sleeping",
        "pause_generation",
        "resume_generation",
        "is_paused",
        "reset_prefix_cache",
        "start_profile",
        "stop_profile",
        "collective_rpc",
    }
)
SLEEP_MODES = ("abort", "wait")  # vLLM's third, "keep" (requests frozen until woken), is not supported
PAUSE_MODES = ("abort", "wait", "keep")


@dataclass(eq=False)
class EngineClientSockets:
    """One engine client's sockets, as the engine holds them."""

    index: int
    input: zmq.Socket
    output: zmq.Socket
    requests: set[str] = dataclasses.field(default_factory=set)  # engine ids of its requests in flight (index > 0)
    closed: bool = False


class EngineCoreLoop:
    def __init__(
        self,
        config: EngineConfig,
        model: ResolvedModel,
        input_address: str,
        output_address: str,
        context: zmq.Context | None = None,
    ) -> None:
        self.config = config
        self.model = model
        self._owns_context = context is None
        self.context = context or zmq.Context()
        self.poller = zmq.Poller()
        self.clients: dict[int, EngineClientSockets] = {}
        self.by_socket: dict[zmq.Socket, EngineClientSockets] = {}
        # engine id of an attached client's request -> (the client, its own id for the request)
        self.owners: dict[str, tuple[EngineClientSockets, str]] = {}
        self.reply_to: EngineClientSockets | None = None  # who sent the message being handled
        self.ready_info: dict[str, Any] = {}
        self._indexes = itertools.count(1)  # of attached clients: never reused
        self._connect(0, input_address, output_address)
        self.engine: Any = None
        self.running = True
        self.paused = False  # pause_generation: no step runs; requests are taken and wait for resume_generation
        self.before_warm_up: tuple[int, int] | None = None  # prefix-cache counters before the warm-up

    def _connect(self, index: int, input_address: str, output_address: str) -> EngineClientSockets:
        input, output = self.context.socket(zmq.PULL), self.context.socket(zmq.PUSH)
        if index:  # never block on an attached client: past the backlog it is dropped (see _send_to)
            output.setsockopt(zmq.SNDHWM, ATTACHED_CLIENT_BACKLOG)
        input.connect(input_address)
        output.connect(output_address)
        client = EngineClientSockets(index, input, output)
        self.clients[index] = client
        self.by_socket[input] = client
        self.poller.register(input, zmq.POLLIN)
        return client

    def send(self, message: Any) -> None:
        """Send to the client whose message is being handled (client 0 outside one)."""
        self._send_to(self.reply_to or self.clients[0], message)

    def _send_to(self, client: EngineClientSockets, message: Any) -> None:
        if client.closed:
            return
        frame = msg.encoder.encode(message)
        if client.index == 0:
            client.output.send(frame, copy=False)
            return
        try:
            client.output.send(frame, zmq.NOBLOCK, copy=False)
        except zmq.Again:
            log.warning("engine client %d stopped reading: dropped, its requests aborted", client.index)
            self._drop_client(client)

    def _broadcast(self, message: Any) -> None:
        for client in list(self.clients.values()):
            self._send_to(client, message)

    def _send_outputs(self, outputs: list[Any]) -> None:
        """Each output to the client whose request it is."""
        if not self.owners:  # every request is client 0's (one client: no routing)
            self._send_to(self.clients[0], _outputs_message(outputs))
            return
        routed: dict[EngineClientSockets, list[Any]] = {}
        for output in outputs:
            owner = self.owners.get(output.request_id)
            if owner is None:
                routed.setdefault(self.clients[0], []).append(output)
                continue
            client, request_id = owner
            if output.finished:
                self._forget(output.request_id)
            routed.setdefault(client, []).append(dataclasses.replace(output, request_id=request_id))
        for client, some in routed.items():
            self._send_to(client, _outputs_message(some))

    def _engine_id(self, request_id: str) -> str:
        """The engine's id of a request of the client being heard: its own for client 0."""
        client = self.reply_to
        return request_id if client is None or client.index == 0 else f"{request_id}@{client.index}"

    def _forget(self, engine_id: str) -> None:
        owner = self.owners.pop(engine_id, None)
        if owner is not None:
            owner[0].requests.discard(engine_id)

    def _drop_client(self, client: EngineClientSockets) -> int:
        """Close an attached client's sockets and abort its requests (their outputs go nowhere)."""
        if client.closed:
            return 0
        client.closed = True
        aborted = list(client.requests)
        if aborted and self.engine is not None:
            self.engine.abort_request(aborted)
        for engine_id in aborted:
            self._forget(engine_id)
        self.poller.unregister(client.input)
        del self.by_socket[client.input], self.clients[client.index]
        client.input.close(linger=0)
        client.output.close(linger=0)
        return len(aborted)

    def run(self) -> None:
        from llmp.engine.llm_engine import LLMEngine

        try:
            self.engine = LLMEngine(self.config, self.model)
        except Exception as exc:
            self.send(msg.EngineFailed(f"the engine failed to start: {type(exc).__name__}: {exc}"))
            raise SystemExit(1) from None  # reported to the client, which prints it once: no traceback here
        self.ready_info = {
            **self.engine.info.options,
            "model": self.engine.info.model,
            "model_dir": str(self.model.model_dir),
            "kernels": self.engine.info.kernels,
        }
        self.send(msg.Ready(self.ready_info))
        try:
            while self.running:
                busy = not self.paused and self.engine.has_unfinished_requests()
                if not busy and self.engine.stat_loggers.muted:
                    self._end_warm_up()
                for socket, _ in self.poller.poll(0 if busy else IDLE_POLL_MS):
                    client = self.by_socket.get(socket)
                    if client is not None:  # not dropped by an earlier client's message
                        self._drain(client)
                if self.running and not self.paused and self.engine.has_unfinished_requests():
                    outputs = self.engine.step()
                    if outputs:
                        self._send_outputs(outputs)
        except Exception as exc:
            self._broadcast(msg.EngineFailed(f"the engine failed: {type(exc).__name__}: {exc}"))
            log.error("engine core failed:\n%s", traceback.format_exc())
            raise
        finally:
            self.engine.shutdown()

    def _drain(self, client: EngineClientSockets) -> None:
        while self.running and not client.closed:
            try:
                frame = client.input.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:
                message = msg.to_engine_decoder.decode(frame.buffer)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:  # a client bug must not stop the engine
                log.error("dropped an undecodable message: %s", exc)
                continue
            self.reply_to = client
            try:
                self._handle(message)
            finally:
                self.reply_to = None

    def _handle(self, message: Any) -> None:
        if isinstance(message, msg.AddRequest):
            self._add_request(message)
        elif isinstance(message, msg.AbortRequests):
            engine_ids = [self._engine_id(request_id) for request_id in message.request_ids]
            finals = self.engine.abort_request(engine_ids)
            if finals:
                self._send_outputs(finals)
            for engine_id in engine_ids:  # a pooling request ends without a final output
                self._forget(engine_id)
        elif isinstance(message, msg.Utility):
            if message.method in CONTROL_METHODS and self.reply_to is not None and self.reply_to.index != 0:
                self.send(msg.UtilityResult(message.call_id, error=f"{message.method!r} is for client 0 alone"))
            elif message.method in ("attach_client", "detach_client"):
                self._control(message)
            else:
                self._utility(message)

    def _end_warm_up(self) -> None:
        """The warm-up request is over: it is not part of the workload, so its prefix-cache lookups
        are taken back out of the counters (``/metrics``), as the stat loggers never saw it."""
        self.engine.stat_loggers.muted = False
        if self.before_warm_up is not None:
            kv = self.engine.kv_manager
            kv.prefix_cache_queries, kv.prefix_cache_hits = self.before_warm_up
            self.before_warm_up = None

    def _add_request(self, message: msg.AddRequest) -> None:
        prompt = message.prompt
        if message.request_id == WARM_UP_REQUEST_ID:
            self.engine.stat_loggers.muted = True
            kv = self.engine.kv_manager
            self.before_warm_up = (kv.prefix_cache_queries, kv.prefix_cache_hits)
        engine_id = self._engine_id(message.request_id)
        client = self.reply_to
        if engine_id != message.request_id and client is not None:
            if engine_id in self.owners:  # the engine's own check would name the engine's id
                self.send(msg.RequestFailed(message.request_id, "ValueError", "the request id is already in use"))
                return
            self.owners[engine_id] = (client, message.request_id)
            client.requests.add(engine_id)
        try:
            if message.pooling is not None:
                self.engine.add_request(
                    engine_id,
                    prompt,
                    None,
                    message.priority,
                    pooling_params=message.pooling,
                    lora_request=message.lora,
                )
            else:
                self.engine.add_request(
                    engine_id,
                    prompt,
                    message.params,
                    message.priority,
                    message.delta,
                    lora_request=message.lora,
                )
        except (ValueError, TypeError, LLMPError) as exc:
            self._forget(engine_id)
            field = exc.field if isinstance(exc, RequestValidationError) else None
            self.send(msg.RequestFailed(message.request_id, _error_type(exc), str(exc), field))
        except Exception as exc:  # an input nobody foresaw fails its request, never the engine
            log.error("request %s was refused:\n%s", message.request_id, traceback.format_exc())
            self.engine.abort_request([engine_id])
            self._forget(engine_id)
            self.send(
                msg.RequestFailed(
                    message.request_id,
                    "ValueError",
                    f"the engine cannot take this request: {type(exc).__name__}: {exc}",
                )
            )

    def _control(self, call: msg.Utility) -> None:
        """Client 0 attaches an API server's client (``[input_address, output_address]``: the engine
        connects, sends it ``Ready``, answers its index) or detaches one (``[index]``: its requests
        are aborted; answers how many)."""
        try:
            if call.method == "attach_client":
                index = next(self._indexes)
                self._send_to(self._connect(index, *call.args), msg.Ready(self.ready_info))
                result: Any = index
            else:
                client = self.clients.get(int(call.args[0]))
                result = self._drop_client(client) if client is not None and client.index != 0 else 0
            self.send(msg.UtilityResult(call.call_id, result))
        except Exception as exc:
            self.send(msg.UtilityResult(call.call_id, error=f"{type(exc).__name__}: {exc}"))

    def _utility(self, call: msg.Utility) -> None:
        try:
            if call.method == "ping":
                result: Any = "pong"
            elif call.method == "stats":
                result = engine_stats(self.engine)
            elif call.method == "check_structured_outputs":
                try:
                    self.engine.check_structured_outputs(StructuredOutputsParams(**call.args[0]))
                    result = None
                except (ValueError, TypeError) as exc:
                    result = str(exc)
            elif call.method == "add_lora":
                result = self._add_lora(*call.args)
            elif call.method == "remove_lora":
                result = self.engine.remove_lora(int(call.args[0]))
            elif call.method == "list_loras":
                result = self.engine.list_loras()
            elif call.method == "pin_lora":
                result = self.engine.pin_lora(int(call.args[0]))
            elif call.method in ADMIN_METHODS:
                result = self._admin(call.method, call.args)
            elif call.method == "shutdown":
                self.running, result = False, None
            else:
                raise ValueError(f"unknown utility method {call.method!r}")
            self.send(msg.UtilityResult(call.call_id, result))
        except Exception as exc:
            self.send(msg.UtilityResult(call.call_id, error=f"{type(exc).__name__}: {exc}"))

    def _add_lora(self, request: dict[str, Any], pin: bool = False, replace: bool = False) -> dict[str, Any]:
        """``{"ok": added}``, or the typed error as plain data for the client to raise again."""
        try:
            added = self.engine.add_lora(LoRARequest(**request), pin=pin, replace=replace)
        except (ValueError, TypeError, LLMPError) as exc:
            field = exc.field if isinstance(exc, RequestValidationError) else None
            return {"error_type": _error_type(exc), "field": field, "message": str(exc)}
        return {"ok": added}

    def _admin(self, method: str, args: list[Any]) -> dict[str, Any]:
        """A management call (sleep, profiles, worker calls): ``{"ok": result}``, or the typed error
        as plain data for the client to raise again."""
        engine = self.engine
        try:
            if method == "sleep":
                result: Any = self._sleep(*args)
            elif method == "wake_up":
                engine.wake_up(*args)
                result = None
                if not engine.is_sleeping():
                    self._broadcast(msg.SleepState(0))
            elif method == "pause_generation":
                result = self._pause(*args)
            elif method == "resume_generation":
                self.paused, result = False, None
            elif method == "is_paused":
                result = self.paused
            elif method == "collective_rpc":
                # plain data both ways (msgpack): a result it cannot carry is sent as its text
                result = msgspec.to_builtins(engine.collective_rpc(*args), enc_hook=str)
            else:  # is_sleeping, reset_prefix_cache, start_profile, stop_profile
                result = getattr(engine, method)(*args)
        except (ValueError, TypeError, LLMPError, TimeoutError, NotImplementedError) as exc:
            return {"error_type": _error_type(exc), "message": str(exc)}
        return {"ok": result}

    def _sleep(self, level: int = 1, mode: str = "abort") -> None:
        """vLLM's modes for the requests in flight: ``abort`` them (a stream ends with finish
        reason ``abort``, a pooling request fails with ``EngineSleepingError``), or ``wait`` for
        them to finish (their outputs keep flowing; new messages wait until the engine sleeps)."""
        engine = self.engine
        if mode not in SLEEP_MODES:
            raise ValueError(f"sleep mode must be one of {', '.join(SLEEP_MODES)}, got {mode!r}")
        if level not in (1, 2) or engine.is_sleeping():
            engine.sleep(level)  # a ValueError, or nothing to do
            return
        self._end_in_flight(mode, "the engine went to sleep")
        engine.sleep(level)
        self._broadcast(msg.SleepState(level))  # every client refuses requests at once while it sleeps

    def _pause(self, mode: str = "abort", clear_cache: bool | None = None) -> None:
        """vLLM's ``pause_generation``: no step runs until ``resume_generation``, and the requests that
        arrive meanwhile are taken and wait. Those in flight are aborted (``abort``: a stream ends with
        finish reason ``abort``), finished first (``wait``), or frozen where they are (``keep``: they
        go on after the resume). ``clear_cache`` (None: unless ``keep``) then forgets the prefix cache;
        with ``keep`` it cannot (the frozen requests hold their blocks), so true is a ``ValueError``."""
        if mode not in PAUSE_MODES:
            raise ValueError(f"pause mode must be one of {', '.join(PAUSE_MODES)}, got {mode!r}")
        if mode == "keep" and clear_cache:
            raise ValueError("clear_cache does not apply with mode keep: the requests in flight keep their blocks")
        if mode != "keep":
            self._end_in_flight(mode, "generation was paused (mode abort)")
            if clear_cache is not False:
                self.engine.reset_prefix_cache()
        self.paused = True

    def _end_in_flight(self, mode: str, why: str) -> None:
        """Abort the requests in flight (``abort``: each stream ends with finish reason ``abort``, a
        pooling request fails with ``EngineSleepingError`` saying ``why``), or ``wait`` for them to
        finish (their outputs keep flowing; new messages wait until they have)."""
        engine = self.engine
        if mode == "wait":
            while engine.has_unfinished_requests():
                outputs = engine.step()
                if outputs:
                    self._send_outputs(outputs)
            return
        engine_ids = engine.unfinished_request_ids()
        pooling = [engine_id for engine_id in engine_ids if engine_id in engine.pooling]
        finals = engine.abort_request(engine_ids)
        if finals:
            self._send_outputs(finals)
        for engine_id in pooling:  # no final output to end its stream: it fails
            client, request_id = self.owners.get(engine_id, (self.clients[0], engine_id))
            self._send_to(client, msg.RequestFailed(request_id, "EngineSleepingError", why))
        for engine_id in engine_ids:
            self._forget(engine_id)

    def close(self) -> None:
        for client in self.clients.values():
            client.input.close(linger=0)
            client.output.close(linger=1000 if client.index == 0 else 0)
        if self._owns_context:
            # a closed socket's last messages (an EngineFailed) go out on the context's I/O thread:
            # wait for them (up to the linger above), as the process ends with os._exit next
            self.context.term()


def _outputs_message(outputs: list[Any]) -> msg.Outputs:
    generated = [o for o in outputs if isinstance(o, RequestOutput)]
    return msg.Outputs(generated, [msg.PooledOutput.of(o) for o in outputs if not isinstance(o, RequestOutput)])


def engine_stats(engine: Any) -> dict[str, Any]:
    return {
        "num_running": engine.scheduler.num_running,
        "num_waiting": engine.scheduler.num_waiting,
        "kv_cache_usage": engine.kv_manager.usage,
        "num_free_blocks": engine.kv_manager.num_free_blocks,
        "prefix_cache_queries": engine.kv_manager.prefix_cache_queries,
        "prefix_cache_hits": engine.kv_manager.prefix_cache_hits,
        "num_preemptions": engine.scheduler.num_preemptions,
        "num_steps": engine.num_steps,
        "iteration_tokens": engine.iteration_tokens.snapshot(),
        **({"lora": engine.lora.stats()} if engine.lora is not None else {}),
    }


def _error_type(exc: BaseException) -> str:
    kinds = (
        EngineSleepingError,
        TimeoutError,
        NotImplementedError,
        LoRAAdapterNotFoundError,
        InvalidLoRAAdapterError,
        SamplingParamsError,
        RequestValidationError,
        ValueError,
        TypeError,
    )
    for kind in kinds:
        if isinstance(exc, kind):
            return kind.__name__
    return "LLMPError"


def prepare_engine_process(parent_pid: int) -> None:
    """What the engine process does before it has its arguments: its signals, the watch on its parent,
    its logging (at ``LLMP_LOG_LEVEL``, which the parent sets to its own level, to the stderr it
    inherits), its OpenMP settings (before torch loads), the plugins, and the engine's imports."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the front-end, which shuts us down
    signal.signal(signal.SIGTERM, _exit_cleanly)  # unwinds through engine.shutdown(), which stops the workers
    threading.Thread(target=exit_with_parent, args=(parent_pid,), daemon=True).start()
    from llmp.progress import configure_logging

    configure_logging()
    from llmp.engine.process_settings import apply_engine_process_settings

    apply_engine_process_settings()  # before a plugin or the engine loads torch
    from llmp import plugins

    plugins.load_plugins()
    import llmp.engine.llm_engine  # noqa: F401  (torch and the engine: what takes the time)

    if log.isEnabledFor(logging.DEBUG):
        log.debug("engine process: plugins and engine imported %.2f s after it started", _seconds_since_start())


def _seconds_since_start() -> float:
    """Seconds since this process started (its start time in /proc; 0 where there is none)."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rpartition(")")[2].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0
    return uptime - ticks / os.sysconf("SC_CLK_TCK")


def engine_process_main(config: EngineConfig, model: ResolvedModel, input_address: str, output_address: str) -> None:
    """The engine process's work once :func:`prepare_engine_process` has run: the engine core loop."""
    loop = EngineCoreLoop(config, model, input_address, output_address)
    try:
        loop.run()
    finally:
        # exiting already (the parent stops us once it has read why): a SIGTERM now would raise
        # SystemExit inside whatever runs, a socket's __del__, and print a stray traceback
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        loop.close()


def _exit_cleanly(*_: object) -> None:
    raise SystemExit(0)


def _main() -> None:
    # `python -m llmp.engine.core_proc` (EngineProcess): the imports first, then the arguments,
    # pickled on stdin by the parent (a trusted pipe), which may have started this process before
    # it knew them. Spawning this way never re-imports the caller's __main__.
    import sys

    code = 0
    try:
        arguments: list[Any] = []  # read while we import, so that the parent never blocks writing them
        reader = threading.Thread(target=_read_arguments, args=(sys.stdin.buffer, arguments), daemon=True)
        reader.start()
        # the parent's pid: on the command line (EngineProcess), else (a caller of its own) our parent now
        prepare_engine_process(int(sys.argv[1]) if len(sys.argv) > 1 else os.getppid())
        reader.join()
        if arguments:  # none: the parent stopped before it sent them
            if isinstance(arguments[0], Exception):
                raise arguments[0]
            config, model, input_address, output_address = arguments[0]
            engine_process_main(config, model, input_address, output_address)
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 0 if stop.code is None else 1
    except BaseException:
        traceback.print_exc()
        code = 1
    from llmp.engine.process_settings import exit_without_teardown

    exit_without_teardown(code)  # the engine has shut down: workers stopped, sockets closed


def _read_arguments(stream: Any, into: list[Any]) -> None:
    """The pickled arguments (to their end: the pipe may stay open after them), or nothing at EOF."""
    import pickle

    try:
        into.append(pickle.load(stream))
    except EOFError:
        pass
    except Exception as exc:  # raised where the arguments are used
        into.append(exc)


PARENT_WATCH_S = 0.2


def exit_with_parent(parent_pid: int) -> None:
    """Exit this process once its parent is gone (it may have been SIGKILLed): no orphans, within
    ``PARENT_WATCH_S`` (a parent that died before the watch began is seen at once)."""
    while os.getppid() == parent_pid:
        time.sleep(PARENT_WATCH_S)
    os._exit(1)


if __name__ == "__main__":
    _main()
