"""``AsyncLLM``: the asynchronous engine client front-ends are built on.

The engine core runs in a child process (or, with ``engine_mode="thread"``,
a thread of this one) behind two ZMQ sockets. A reader thread turns the
engine's messages into items on per-request asyncio queues, so any number of
coroutines can stream at once and the event loop never waits on model work.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import dataclasses
import itertools
import logging
import os
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import zmq

from llmp.api import (
    EngineDeadError,
    EngineSleepingError,
    InvalidLoRAAdapterError,
    LLMPError,
    LoRAAdapterNotFoundError,
    RequestValidationError,
    ResolvedModel,
)
from llmp.engine import protocol as msg
from llmp.engine.engine_process import EngineProcess
from llmp.engine.scheduler import check_priority
from llmp.inputs import Prompt, PromptType, as_prompt
from llmp.lora import LORA_DISABLED, LoRARequest
from llmp.options import EngineConfig
from llmp.outputs import PoolingRequestOutput, RequestOutput
from llmp.pooling_params import PoolingParams
from llmp.progress import configure_logging
from llmp.sampling_params import RequestOutputKind, SamplingParams, SamplingParamsError

log = logging.getLogger("llmp.engine")

_ERROR_TYPES: dict[str, type[Exception]] = {
    "ValueError": ValueError,
    "TypeError": TypeError,
    "LLMPError": LLMPError,
    "LoRAAdapterNotFoundError": LoRAAdapterNotFoundError,
    "EngineSleepingError": EngineSleepingError,
    "TimeoutError": TimeoutError,
    "NotImplementedError": NotImplementedError,
}
_FIELD_ERROR_TYPES: dict[str, type[RequestValidationError]] = {
    "SamplingParamsError": SamplingParamsError,
    "RequestValidationError": RequestValidationError,
    "InvalidLoRAAdapterError": InvalidLoRAAdapterError,
}
HEALTH_TIMEOUT_S = 10.0
COMPILE_TIMEOUT_S = 120.0  # a structured-output grammar: large schemas take seconds
LORA_LOAD_TIMEOUT_S = 300.0  # an adapter read from disk (or a slow network mount) and checked
ADMIN_TIMEOUT_S = 900.0  # sleep (waiting for requests to finish) and wake-up (weights loaded again)
WATCH_INTERVAL_MS = 200
DEAD_ENGINE_LAST_WORDS_MS = 500
READER_STOP_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class EngineAttachment:
    """An engine another process started and will attach this client to (an API server of
    ``llmp serve --api-server-count N``): the client binds these addresses, starts no engine, and
    never stops it; the engine process ``engine_pid`` is watched for liveness."""

    input_address: str
    output_address: str
    engine_pid: int


@dataclass(eq=False)
class _Stream:
    """Where the reader thread hands one request's outputs to the coroutine consuming them."""

    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    pooling: bool = False

    def put(self, item: RequestOutput | PoolingRequestOutput | BaseException | None) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the consumer's loop is closed: nobody is listening any more
            pass


class AsyncLLM:
    """Streams outputs of many concurrent requests from one engine.

    ``AsyncLLM(model, **engine_options)`` starts the engine and returns once it
    is ready (model loaded); the options are those of ``LLM``. The model is
    resolved here, in the caller's process, unless ``model`` is already a
    :class:`~llmp.api.ResolvedModel` (``resolve_model`` of an ``EngineConfig`` with
    the same options, as ``llmp serve`` makes it: a ``ValueError`` names an option the
    record does not match); ``self.model`` holds the record, and the engine process takes it as is.
    ``engine_process`` is an :class:`~llmp.engine.engine_process.EngineProcess` the caller started
    earlier, still without its arguments: the engine runs in it (``llmp serve`` starts one before it
    resolves the model, so that the engine's imports overlap the resolution). Should ``AsyncLLM`` raise
    before it has sent the arguments, the process is still the caller's to ``discard()``.
    """

    def __init__(
        self,
        model: str | os.PathLike | ResolvedModel | None = None,
        *,
        engine_mode: str = "process",
        ready_timeout: float = 900.0,
        wait: bool = True,
        attach: EngineAttachment | None = None,
        engine_process: EngineProcess | None = None,
        **engine_options: Any,
    ) -> None:
        if engine_mode not in ("process", "thread"):
            raise ValueError(f"engine_mode must be 'process' or 'thread', got {engine_mode!r}")
        if attach is not None and engine_mode != "process":
            raise ValueError("an attached client talks to an engine process: engine_mode must be 'process'")
        if engine_process is not None and (engine_mode != "process" or attach is not None or engine_process.sent):
            raise ValueError(
                "engine_process takes an EngineProcess not yet given its arguments, with engine_mode='process' "
                "and no attach"
            )
        configure_logging()  # the engine reports its start-up and statistics (llmp.progress)
        from llmp.model_files.resolve import check_resolved, resolve_model

        if isinstance(model, ResolvedModel):
            self.config = EngineConfig(model=model.name, **engine_options)
            check_resolved(model, self.config)
            self.model = model
        else:
            self.config = EngineConfig(model=None if model is None else str(model), **engine_options)
            self.model = resolve_model(self.config)
        self.engine_mode = engine_mode
        self.attachment = attach
        self.errored: EngineDeadError | None = None
        self._streams: dict[str, _Stream] = {}
        self._calls: dict[int, concurrent.futures.Future] = {}
        self._call_ids = itertools.count()
        self._send_lock = threading.Lock()
        self._closed = False
        self.sleep_level = 0  # the engine's, as it last told every client (SleepState): 0 awake
        self._tokenizer: Any = None
        # the adapters served by name: one table for every front-end of this process (see add_lora)
        self.lora_requests: dict[str, LoRARequest] = {}
        self.pinned_loras: set[int] = set()  # lora_int_id of the adapters pinned in the engine's CPU cache
        self._lora_ids = itertools.count(1)
        self._sent_lora_ids: set[int] = set()  # every lora_int_id sent to the engine: next_lora_id skips them
        self._context = zmq.Context()
        self._context.setsockopt(zmq.LINGER, 0)  # never block on unsent messages to a dead engine
        in_address, out_address = (attach.input_address, attach.output_address) if attach else self._addresses()
        self._input = self._context.socket(zmq.PUSH)
        self._input.setsockopt(zmq.SNDHWM, 0)  # no queue limit: a send fails only when no engine is connected
        self._input.bind(in_address)
        self._output = self._context.socket(zmq.PULL)
        self._output.bind(out_address)
        # A ZMQ socket is one thread's: closing the output socket while the reader thread polls it
        # crashes the process (libzmq). Shutdown wakes the reader through this pair instead, and the
        # reader closes the output socket itself.
        self._wake = self._context.socket(zmq.PAIR)
        self._wake.bind(f"inproc://llmp-wake-{id(self)}-{uuid.uuid4().hex[:8]}")
        self._woken = self._context.socket(zmq.PAIR)
        self._woken.connect(self._wake.getsockopt_string(zmq.LAST_ENDPOINT))
        self._reader: threading.Thread | None = None
        self._process: EngineProcess | None = None
        self._thread: threading.Thread | None = None
        if attach is None:
            self._start_engine(in_address, out_address, engine_process)
        self._finalizer = weakref.finalize(self, _stop_process, self._process)
        atexit.register(self._finalizer)
        self.info: dict[str, Any] = {}
        if wait:
            self.wait_ready(ready_timeout)

    def wait_ready(self, timeout: float = 900.0) -> None:
        """Block until the engine has loaded its model (``AsyncLLM(..., wait=False)`` returns before that,
        with the engine process already started, so the caller can do other work meanwhile)."""
        if self.info:
            return
        self.info = self._wait_ready(timeout)
        if self.attachment is not None:
            self._wait_connected()
        self._reader = threading.Thread(target=self._read_outputs, name="llmp-output-reader", daemon=True)
        self._reader.start()

    # -- start-up -----------------------------------------------------------

    def _addresses(self) -> tuple[str, str]:
        name = f"llmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        if self.engine_mode == "thread":
            return f"inproc://{name}-in", f"inproc://{name}-out"
        base = os.path.join(tempfile.gettempdir(), name)
        return f"ipc://{base}-in", f"ipc://{base}-out"

    def _start_engine(self, in_address: str, out_address: str, process: EngineProcess | None) -> None:
        from llmp.engine.core_proc import EngineCoreLoop

        if self.engine_mode == "process":
            self._process = process or EngineProcess()
            self._process.send((self.config, self.model, in_address, out_address))
        else:
            from llmp.engine.process_settings import apply_engine_process_settings

            apply_engine_process_settings()

            def run() -> None:
                loop = EngineCoreLoop(self.config, self.model, in_address, out_address, self._context)
                try:
                    loop.run()
                except Exception:  # reported to the client as EngineFailed
                    pass
                finally:
                    loop.close()

            self._thread = threading.Thread(target=run, name="llmp-engine", daemon=True)
            self._thread.start()

    def _wait_ready(self, timeout: float) -> dict[str, Any]:
        deadline = timeout * 1000
        waited = 0
        while waited < deadline:
            if self._output.poll(WATCH_INTERVAL_MS):
                message = msg.from_engine_decoder.decode(self._output.recv())
                if isinstance(message, msg.Ready):
                    return message.info
                if isinstance(message, msg.EngineFailed):
                    self._shutdown_now()
                    raise EngineDeadError(message.message)
            waited += WATCH_INTERVAL_MS
            if not self._engine_alive():
                reason = self._last_words(f"the engine process exited during start-up ({self._exit_description()})")
                self._shutdown_now()
                raise EngineDeadError(reason)
        self._shutdown_now()
        raise EngineDeadError(f"the engine was not ready within {timeout:.0f} s")

    def _wait_connected(self, timeout: float = 10.0) -> None:
        """An attached client can send once the engine's input socket has connected to it, which
        it did when it sent ``Ready`` (connections complete in the background): send a ping."""
        frame = msg.encoder.encode(msg.Utility(-1, "ping"))  # its answer (call -1) is dropped
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._input.send(frame, zmq.NOBLOCK)
                return
            except zmq.Again:
                if time.monotonic() > deadline or not self._engine_alive():
                    self._shutdown_now()
                    raise EngineDeadError(f"the engine did not connect to this client within {timeout:.0f} s") from None
                time.sleep(0.01)

    # -- the reader thread ----------------------------------------------------

    def _read_outputs(self) -> None:
        poller = zmq.Poller()
        poller.register(self._output, zmq.POLLIN)
        poller.register(self._woken, zmq.POLLIN)
        try:
            while not self._closed:
                ready = dict(poller.poll(WATCH_INTERVAL_MS))
                if self._woken in ready:  # shutdown
                    return
                if self._output in ready:
                    self._dispatch(msg.from_engine_decoder.decode(self._output.recv()))
                elif not self._engine_alive() and not self._closed:
                    # what it sent just before exiting (outputs, its EngineFailed) can arrive after that poll
                    while self._output.poll(DEAD_ENGINE_LAST_WORDS_MS):
                        self._dispatch(msg.from_engine_decoder.decode(self._output.recv()))
                    if self.errored is None:
                        self._fail_all(f"the engine process died ({self._exit_description()})")
                    return
        finally:
            self._output.close(linger=0)
            self._woken.close(linger=0)

    def _dispatch(self, message: Any) -> None:
        if isinstance(message, msg.Outputs):
            for output in (*message.outputs, *message.pooled):
                stream = self._streams.get(output.request_id)
                if stream is not None:
                    stream.put(output.rebuild() if isinstance(output, msg.PooledOutput) else output)
        elif isinstance(message, msg.RequestFailed):
            stream = self._streams.get(message.request_id)
            if stream is not None:
                stream.put(_engine_error(message.error_type, message.message, message.field))
        elif isinstance(message, msg.UtilityResult):
            future = self._calls.pop(message.call_id, None)
            if future is not None and not future.done():
                if message.error:
                    future.set_exception(LLMPError(message.error))
                else:
                    future.set_result(message.result)
        elif isinstance(message, msg.SleepState):
            self.sleep_level = message.level
        elif isinstance(message, msg.EngineFailed):
            self._fail_all(message.message)

    def _fail_all(self, reason: str) -> None:
        self.errored = EngineDeadError(reason)
        for stream in list(self._streams.values()):
            stream.put(self.errored)
        for future in list(self._calls.values()):
            if not future.done():
                future.set_exception(self.errored)
        self._calls.clear()

    def _last_words(self, exit_reason: str) -> str:
        """A dead engine's own reason (its EngineFailed, sent just before it exited, can arrive after
        the poll that found nothing), else ``exit_reason``."""
        while self._output.poll(DEAD_ENGINE_LAST_WORDS_MS):
            message = msg.from_engine_decoder.decode(self._output.recv())
            if isinstance(message, msg.EngineFailed):
                return message.message
        return exit_reason

    def _engine_alive(self) -> bool:
        if self.attachment is not None:
            return _pid_running(self.attachment.engine_pid)
        if self._process is not None:
            return self._process.is_alive()
        return self._thread is not None and self._thread.is_alive()

    def _exit_description(self) -> str:
        if self.attachment is not None:
            return f"the engine process {self.attachment.engine_pid} exited"
        if self._process is not None and self._process.exitcode is not None:
            code = self._process.exitcode
            return f"killed by signal {-code}" if code < 0 else f"exit code {code}"
        return "engine thread stopped"

    # -- requests -------------------------------------------------------------

    def _send(self, message: Any) -> None:
        if self._closed:
            raise EngineDeadError("the engine has been shut down")
        try:
            frame = msg.encoder.encode(message)
        except (OverflowError, msgspec.EncodeError) as exc:  # e.g. an integer past 64 bits
            raise ValueError(f"the request cannot be sent to the engine: {exc}") from None
        with self._send_lock:  # shutdown closes the input socket holding it
            if self._closed:
                raise EngineDeadError("the engine has been shut down")
            try:
                self._input.send(frame, zmq.NOBLOCK, copy=False)
            except zmq.Again:  # a PUSH socket without peers would block for ever
                raise EngineDeadError("the engine is not connected (it has exited)") from None

    def _check_request(
        self, prompt: PromptType, request_id: str | None, priority: int, lora_request: LoRARequest | None
    ) -> tuple[str, Prompt]:
        """What :meth:`generate` and :meth:`encode` check when called: the prompt's type, the
        priority, the adapter and a free request id. Nothing is registered or sent until the first iteration."""
        if self.sleep_level:  # the engine would refuse it: a server answers 503 before it starts a stream
            raise EngineSleepingError(
                f"the engine is sleeping (level {self.sleep_level}): wake it up first "
                "(POST /wake_up on the server, wake_up() in Python)"
            )
        check_priority(priority, self.config.scheduling_policy)
        if lora_request is not None:
            self._check_lora(lora_request)
        request_id = request_id or uuid.uuid4().hex
        self._check_free(request_id)
        return request_id, as_prompt(prompt)

    def _check_free(self, request_id: str) -> None:
        if request_id in self._streams:
            raise ValueError(f"request id {request_id!r} is already in use")

    def _open_stream(self, request_id: str, pooling: bool) -> _Stream:
        if self.errored is not None:
            raise self.errored
        self._check_free(request_id)  # another stream may have started with it since the call
        stream = _Stream(asyncio.get_running_loop(), asyncio.Queue(), pooling=pooling)
        self._streams[request_id] = stream
        return stream

    def generate(
        self,
        prompt: PromptType,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        *,
        lora_request: LoRARequest | None = None,
        priority: int = 0,
        delta: bool = False,
    ) -> AsyncIterator[RequestOutput]:
        """Outputs of one request as they come: each the whole text so far, or with
        ``delta=True`` (or ``params.output_kind`` ``RequestOutputKind.DELTA``, as vLLM) only what is
        new; with ``RequestOutputKind.FINAL_ONLY`` only the finished output. Ends after the finished output. Leaving the
        loop early (break, cancellation) aborts the request in the engine.

        ``lora_request`` runs it with that LoRA adapter (the engine started with ``enable_lora=True``);
        the engine reads the adapter on first use, so a bad one fails this request only
        (``LoRAAdapterNotFoundError``, ``InvalidLoRAAdapterError``).

        The request is checked when this is called (the prompt, the priority, a request id
        in use), not at the first iteration, so a server answers a refused request with a 400
        before it starts a stream. It reaches the engine at the first iteration: a generator
        never iterated sends and holds nothing."""
        request_id, record = self._check_request(prompt, request_id, priority, lora_request)
        return self._generate(record, params, request_id, priority, delta, lora_request)

    async def _generate(
        self,
        record: Prompt,
        params: SamplingParams | None,
        request_id: str,
        priority: int,
        delta: bool,
        lora: LoRARequest | None,
    ) -> AsyncIterator[RequestOutput]:
        stream = self._open_stream(request_id, pooling=False)
        finished = False
        params = params or SamplingParams()
        kind = params.output_kind
        try:
            # FINAL_ONLY's one output is the whole answer, whatever delta says
            delta = (delta or kind == RequestOutputKind.DELTA) and kind != RequestOutputKind.FINAL_ONLY
            lora = await _with_local_path(lora)
            self._send(msg.AddRequest(request_id, record, params, priority, delta, lora=lora))
            while True:
                item = await stream.queue.get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                finished = item.finished
                if finished or kind != RequestOutputKind.FINAL_ONLY:
                    yield item
                if finished:
                    return
        finally:
            self._streams.pop(request_id, None)
            if not finished and self.errored is None and not self._closed:
                self._send(msg.AbortRequests([request_id]))

    def encode(
        self,
        prompt: PromptType,
        pooling_params: PoolingParams | None = None,
        request_id: str | None = None,
        *,
        lora_request: LoRARequest | None = None,
        priority: int = 0,
    ) -> AsyncIterator[PoolingRequestOutput]:
        """The pooled output of ``prompt`` for ``pooling_params.task`` (None: the model's primary
        pooling task): one finished output whose ``outputs`` is an ``EmbeddingOutput``,
        ``ClassificationOutput``, ``ScoringOutput`` or ``PoolingOutput`` by the task, or none if the
        request is aborted. A ``Prompt`` with ``token_ids`` may carry ``token_type_ids`` (a text pair
        for a cross-encoder). Checked when called, as :meth:`generate`; the task and the input when
        the engine takes the request (a ``ValueError`` at the first iteration). ``lora_request``:
        as in :meth:`generate`."""
        request_id, record = self._check_request(prompt, request_id, priority, lora_request)
        return self._encode(record, pooling_params, request_id, priority, lora_request)

    async def _encode(
        self,
        record: Prompt,
        pooling_params: PoolingParams | None,
        request_id: str,
        priority: int,
        lora: LoRARequest | None,
    ) -> AsyncIterator[PoolingRequestOutput]:
        stream = self._open_stream(request_id, pooling=True)
        done = False
        try:
            lora = await _with_local_path(lora)
            self._send(
                msg.AddRequest(
                    request_id,
                    record,
                    SamplingParams(),
                    priority,
                    pooling=pooling_params or PoolingParams(),
                    lora=lora,
                )
            )
            item = await stream.queue.get()
            done = True
            if isinstance(item, BaseException):
                raise item
            if item is not None:  # None: aborted
                yield item
        finally:
            self._streams.pop(request_id, None)
            if not done and self.errored is None and not self._closed:
                self._send(msg.AbortRequests([request_id]))

    async def abort(self, request_id: str | Iterable[str]) -> None:
        """Stop a request, or each of several (vLLM's ``str | Iterable[str]``); its stream ends with
        ``finish_reason="abort"`` (a pooling request's, with nothing)."""
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        for one in ids:
            stream = self._streams.get(one)
            if stream is not None and stream.pooling:
                stream.put(None)
        if ids and self.errored is None and not self._closed:
            self._send(msg.AbortRequests(ids))

    async def abort_all(self) -> int:
        """Stop every request in flight (a shutdown past its grace period); the number stopped."""
        ids = list(self._streams)
        for request_id in ids:
            await self.abort(request_id)
        return len(ids)

    async def _call(self, method: str, *args: Any, timeout: float = HEALTH_TIMEOUT_S) -> Any:
        if self.errored is not None:
            raise self.errored
        call_id = next(self._call_ids)
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._calls[call_id] = future
        self._send(msg.Utility(call_id, method, list(args)))
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), timeout)
        except TimeoutError:
            raise EngineDeadError(f"the engine did not answer {method!r} within {timeout:.0f} s") from None
        finally:
            self._calls.pop(call_id, None)

    async def check_structured_outputs(self, constraint: Any) -> None:
        """``ValueError`` naming the problem if the engine cannot compile ``constraint``
        (a ``StructuredOutputsParams``); compiled, it is cached for the request that follows."""
        problem = await self._call(
            "check_structured_outputs", dataclasses.asdict(constraint), timeout=COMPILE_TIMEOUT_S
        )
        if problem is not None:
            raise ValueError(problem)

    # -- LoRA adapters ----------------------------------------------------------

    def _check_lora(self, lora_request: Any) -> None:
        if not isinstance(lora_request, LoRARequest):
            raise TypeError(f"lora_request must be a llmp.LoRARequest, got {type(lora_request).__name__}")
        if not self.config.enable_lora:
            raise ValueError(LORA_DISABLED)
        self._sent_lora_ids.add(lora_request.lora_int_id)

    def next_lora_id(self) -> int:
        """A ``lora_int_id`` no adapter sent to the engine has: for a front-end naming a new adapter."""
        return next(i for i in self._lora_ids if i not in self._sent_lora_ids)

    async def add_lora(self, lora_request: LoRARequest, *, pin: bool = False, replace: bool = False) -> bool:
        """Read and check the adapter in the engine now (not at its first request), and serve it by
        name: it joins :attr:`lora_requests`. ``pin`` keeps it in the engine's CPU cache for good.
        ``LoRAAdapterNotFoundError`` when its files are not there, ``InvalidLoRAAdapterError`` when
        llmp will not serve it (rank, targets, another base model, a corrupt file)."""
        self._check_lora(lora_request)
        local = await _with_local_path(lora_request)
        result = await self._call("add_lora", dataclasses.asdict(local), pin, replace, timeout=LORA_LOAD_TIMEOUT_S)
        if result.get("error_type"):
            raise _engine_error(result["error_type"], result.get("message", ""), result.get("field"))
        self.lora_requests[lora_request.lora_name] = lora_request
        if pin:
            self.pinned_loras.add(lora_request.lora_int_id)
        return bool(result.get("ok", True))

    async def remove_lora(self, lora_int_id: int) -> bool:
        """Stop serving the adapter: new requests cannot name it, those in flight finish with it.
        False when the engine does not know the id."""
        for name in [n for n, lora in self.lora_requests.items() if lora.lora_int_id == lora_int_id]:
            del self.lora_requests[name]
        self.pinned_loras.discard(lora_int_id)
        return bool(await self._call("remove_lora", lora_int_id))

    async def list_loras(self) -> list[int]:
        """The ``lora_int_id`` of every adapter the engine holds."""
        return list(await self._call("list_loras"))

    async def pin_lora(self, lora_int_id: int) -> bool:
        """Keep the adapter in the engine's CPU cache for good; False when the engine does not know the id."""
        pinned = bool(await self._call("pin_lora", lora_int_id))
        if pinned:
            self.pinned_loras.add(lora_int_id)
        return pinned

    async def attach_client(self, attachment: EngineAttachment) -> int:
        """Connect this client's engine to another client (an API server of ``--api-server-count``),
        which gets ``Ready`` and its own outputs from now on; the engine's index of it."""
        return int(await self._call("attach_client", attachment.input_address, attachment.output_address))

    async def detach_client(self, index: int) -> int:
        """Disconnect an attached client (its process has exited): its requests are aborted; how many."""
        return int(await self._call("detach_client", index))

    async def check_health(self) -> None:
        """Raise ``EngineDeadError`` unless the engine answers a ping within a bounded time."""
        await self._call("ping")

    async def stats(self, timeout: float = HEALTH_TIMEOUT_S) -> dict[str, Any]:
        """Scheduler and KV-cache figures: running, waiting, usage, prefix-cache hits, preemptions."""
        return await self._call("stats", timeout=timeout)

    # -- management: sleep, prefix cache, profiles, worker calls (vLLM's) ---------

    async def _admin(self, method: str, *args: Any, timeout: float | None = HEALTH_TIMEOUT_S) -> Any:
        result = await self._call(method, *args, timeout=timeout)
        if result.get("error_type"):
            raise _engine_error(result["error_type"], result.get("message", ""), None)
        return result.get("ok")

    async def sleep(self, level: int = 1, mode: str = "abort") -> None:
        """Free the compute device (see ``LLMEngine.sleep``: level 1 moves the weights to host memory
        and frees the KV cache, level 2 discards the weights too). Requests in flight are aborted
        (``mode="abort"``, vLLM's default: a stream ends with finish reason ``abort``) or finished
        first (``"wait"``). Until :meth:`wake_up`, a new request raises ``EngineSleepingError``."""
        await self._admin("sleep", level, mode, timeout=ADMIN_TIMEOUT_S)

    async def wake_up(self, tags: list[str] | None = None) -> None:
        """Bring back ``tags`` among ``"weights"`` and ``"kv_cache"`` (None: both)."""
        await self._admin("wake_up", None if tags is None else list(tags), timeout=ADMIN_TIMEOUT_S)

    async def is_sleeping(self) -> bool:
        return bool(await self._admin("is_sleeping"))

    async def pause_generation(self, mode: str = "abort", clear_cache: bool | None = None) -> None:
        """vLLM's: stop generating until :meth:`resume_generation`. Requests in flight are aborted
        (``mode="abort"``: a stream ends with finish reason ``abort``), finished first (``"wait"``:
        this returns once they have), or frozen where they are (``"keep"``: they go on after the
        resume). New requests are taken meanwhile and wait. ``clear_cache`` (None: unless
        ``"keep"``) forgets the prefix cache once nothing runs; true with ``"keep"`` is a
        ``ValueError`` (the frozen requests hold their blocks). Pausing a paused engine changes
        nothing but what ``mode`` asks of the requests it holds."""
        await self._admin("pause_generation", mode, clear_cache, timeout=ADMIN_TIMEOUT_S)

    async def resume_generation(self) -> None:
        """Generate again: the requests held by :meth:`pause_generation` go on (nothing if not paused)."""
        await self._admin("resume_generation")

    async def is_paused(self) -> bool:
        return bool(await self._admin("is_paused"))

    async def reset_prefix_cache(self) -> bool:
        """Forget the engine's cached prompt blocks; False (nothing forgotten) while requests hold blocks."""
        return bool(await self._admin("reset_prefix_cache"))

    async def start_profile(self) -> None:
        """Start the torch profiler on every worker (``ValueError`` without ``profiler_dir``)."""
        await self._admin("start_profile", timeout=ADMIN_TIMEOUT_S)

    async def stop_profile(self) -> list[str]:
        """Stop the profiler; the Chrome-trace JSON files written, one per worker (in the engine's file system)."""
        return list(await self._admin("stop_profile", timeout=ADMIN_TIMEOUT_S))

    async def collective_rpc(
        self,
        method: str,
        timeout: float | None = None,
        args: tuple | list = (),
        kwargs: dict[str, Any] | None = None,
    ) -> list[Any]:
        """Call the public method ``method`` of every worker (:class:`llmp.executor.Worker`); the
        results, one per rank. Arguments and results cross to the engine process as plain data
        (JSON-like; a result that is not comes back as its text): a function as ``method`` works in
        the offline ``LLM`` only."""
        if not isinstance(method, str):
            raise TypeError(
                "AsyncLLM.collective_rpc takes a worker method's name: a function cannot be sent to the "
                "engine process (LLM.collective_rpc runs functions)"
            )
        wait = None if timeout is None else timeout + HEALTH_TIMEOUT_S
        return list(await self._admin("collective_rpc", method, timeout, args, kwargs, timeout=wait))

    @property
    def engine_pid(self) -> int | None:
        """The engine process's pid (None with ``engine_mode="thread"``)."""
        if self.attachment is not None:
            return self.attachment.engine_pid
        return None if self._process is None else self._process.pid

    @property
    def is_running(self) -> bool:
        return self.errored is None and not self._closed and self._engine_alive()

    def get_tokenizer(self) -> Any:
        """The model's tokenizer, loaded in this process on first use."""
        if self._tokenizer is None:
            from llmp.model_files.tokenizer import load_tokenizer

            self._tokenizer = load_tokenizer(self.model.tokenizer)
        return self._tokenizer

    def set_tokenizer(self, tokenizer: Any) -> None:
        """Use an already loaded tokenizer (one the caller loaded while the engine started)."""
        self._tokenizer = tokenizer

    # -- shutdown -------------------------------------------------------------

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the engine (and with it every worker); idempotent. An attached client only closes
        its sockets: the engine is its starter's (which aborts the client's requests left)."""
        if self._closed:
            return
        if self.attachment is not None:
            self._shutdown_now()
            return
        try:
            if self._engine_alive():
                self._send(msg.Utility(-1, "shutdown"))
        except (zmq.ZMQError, EngineDeadError):  # it is already stopping on its own
            pass
        if self._process is not None:
            self._process.join(timeout)
        elif self._thread is not None:
            self._thread.join(timeout)
        self._shutdown_now()

    def _shutdown_now(self) -> None:
        with self._send_lock:
            if self._input.closed:
                return
            self._closed = True
            self._input.close(linger=0)
        if self.errored is None:
            self._fail_all("the engine has been shut down")
        _stop_process(self._process)
        reader = self._reader
        if reader is None:  # never started (start-up failed): this thread owns its sockets
            self._output.close(linger=0)
            self._woken.close(linger=0)
        elif reader is not threading.current_thread():
            try:
                self._wake.send(b"", zmq.NOBLOCK)
            except zmq.Again:  # the reader has returned already (the engine died)
                pass
            reader.join(READER_STOP_TIMEOUT_S)  # it closes its sockets and returns at once
        self._wake.close(linger=0)
        if reader is not None and reader.is_alive():  # its sockets are open: term() would wait for ever
            if reader is not threading.current_thread():
                log.warning("the engine client's output reader did not stop; its ZMQ context is left open")
        elif self.engine_mode == "process":
            self._context.term()

    async def __aenter__(self) -> AsyncLLM:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.shutdown)


def _engine_error(error_type: str, message: str, field: str | None) -> Exception:
    """The engine's refusal as the type it raised (a RequestValidationError keeps its field)."""
    if field is not None and error_type in _FIELD_ERROR_TYPES:
        return _FIELD_ERROR_TYPES[error_type](field, message)
    return _ERROR_TYPES.get(error_type, LLMPError)(message)


def _pid_running(pid: int) -> bool:
    """Whether process ``pid`` runs (not a zombie: another process's child that has exited)."""
    if os.path.isdir("/proc/self"):
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rpartition(")")[2].split()[0] != "Z"
        except OSError:
            return False
    try:  # no /proc: whether the kernel knows the pid
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _stop_process(process: EngineProcess | None) -> None:
    if process is None or not process.is_alive():
        return
    process.terminate()
    process.join(5)
    if process.is_alive():
        process.kill()
        process.join(5)


async def _with_local_path(lora: LoRARequest | None) -> LoRARequest | None:
    """``lora`` with its files' directory (a Hub id's snapshot, downloaded here, off the event loop and out
    of the engine's step loop); as it is when ``lora_path`` is on disk."""
    if lora is None or Path(lora.lora_path).expanduser().exists():
        return lora
    from llmp.model_files.lora import local_adapter_path

    path = await asyncio.to_thread(local_adapter_path, lora.lora_path)
    return lora if path == lora.lora_path else dataclasses.replace(lora, lora_path=path)
