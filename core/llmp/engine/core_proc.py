"""The engine core loop, run in its own process (or a thread) behind two ZMQ sockets.

The loop drains incoming messages, runs one engine step whenever there is
work, and pushes the step's outputs back. It blocks on the input socket only
when idle, so a busy engine never waits for the front-end.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import traceback
from typing import Any

import msgspec
import zmq

from llmp.api import (
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
        self.context = context or zmq.Context()
        self.input = self.context.socket(zmq.PULL)
        self.input.connect(input_address)
        self.output = self.context.socket(zmq.PUSH)
        self.output.connect(output_address)
        self.engine: Any = None
        self.running = True

    def send(self, message: Any) -> None:
        self.output.send(msg.encoder.encode(message), copy=False)

    def run(self) -> None:
        from llmp.engine.llm_engine import LLMEngine

        try:
            self.engine = LLMEngine(self.config, self.model)
        except Exception as exc:
            self.send(msg.EngineFailed(f"the engine failed to start: {type(exc).__name__}: {exc}"))
            raise SystemExit(1) from None  # reported to the client, which prints it once: no traceback here
        self.send(
            msg.Ready(
                {
                    **self.engine.info.options,
                    "model": self.engine.info.model,
                    "model_dir": str(self.model.model_dir),
                    "kernels": self.engine.info.kernels,
                }
            )
        )
        try:
            while self.running:
                busy = self.engine.has_unfinished_requests()
                if not busy:
                    self.engine.stat_loggers.muted = False  # the warm-up, if any, is over
                if self.input.poll(0 if busy else IDLE_POLL_MS):
                    self._drain()
                if self.running and self.engine.has_unfinished_requests():
                    outputs = self.engine.step()
                    if outputs:
                        self.send(_outputs_message(outputs))
        except Exception as exc:
            self.send(msg.EngineFailed(f"the engine failed: {type(exc).__name__}: {exc}"))
            log.error("engine core failed:\n%s", traceback.format_exc())
            raise
        finally:
            self.engine.shutdown()

    def _drain(self) -> None:
        while self.running:
            try:
                frame = self.input.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:
                message = msg.to_engine_decoder.decode(frame.buffer)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:  # a client bug must not stop the engine
                log.error("dropped an undecodable message: %s", exc)
                continue
            self._handle(message)

    def _handle(self, message: Any) -> None:
        if isinstance(message, msg.AddRequest):
            prompt = message.prompt
            if message.request_id == WARM_UP_REQUEST_ID:
                self.engine.stat_loggers.muted = True
            try:
                if message.pooling is not None:
                    self.engine.add_request(
                        message.request_id,
                        prompt,
                        None,
                        message.priority,
                        pooling_params=message.pooling,
                        lora_request=message.lora,
                    )
                else:
                    self.engine.add_request(
                        message.request_id,
                        prompt,
                        message.params,
                        message.priority,
                        message.delta,
                        lora_request=message.lora,
                    )
            except (ValueError, TypeError, LLMPError) as exc:
                field = exc.field if isinstance(exc, RequestValidationError) else None
                self.send(msg.RequestFailed(message.request_id, _error_type(exc), str(exc), field))
            except Exception as exc:  # an input nobody foresaw fails its request, never the engine
                log.error("request %s was refused:\n%s", message.request_id, traceback.format_exc())
                self.engine.abort_request([message.request_id])
                self.send(
                    msg.RequestFailed(
                        message.request_id,
                        "ValueError",
                        f"the engine cannot take this request: {type(exc).__name__}: {exc}",
                    )
                )
        elif isinstance(message, msg.AbortRequests):
            finals = self.engine.abort_request(message.request_ids)
            if finals:
                self.send(msg.Outputs(finals))
        elif isinstance(message, msg.Utility):
            self._utility(message)

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

    def close(self) -> None:
        self.input.close(linger=0)
        self.output.close(linger=1000)


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
        **({"lora": engine.lora.stats()} if engine.lora is not None else {}),
    }


def _error_type(exc: BaseException) -> str:
    kinds = (
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


def engine_process_main(
    config: EngineConfig, model: ResolvedModel, input_address: str, output_address: str, parent_pid: int
) -> None:
    """Entry point of the engine process; it logs to the stderr it inherits, at ``LLMP_LOG_LEVEL``
    (its parent sets it to its own level)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the front-end, which shuts us down
    signal.signal(signal.SIGTERM, _exit_cleanly)  # unwinds through engine.shutdown(), which stops the workers
    threading.Thread(target=exit_with_parent, args=(parent_pid,), daemon=True).start()
    from llmp.progress import configure_logging

    configure_logging()
    from llmp.engine.process_settings import apply_engine_process_settings

    apply_engine_process_settings()  # before a plugin or the engine loads torch
    from llmp import plugins

    plugins.load_plugins()
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
    # `python -m llmp.engine.core_proc`: the arguments arrive pickled on stdin from the
    # parent (a trusted pipe). Spawning this way never re-imports the caller's __main__.
    import pickle
    import sys

    config, model, input_address, output_address, parent_pid = pickle.load(sys.stdin.buffer)
    engine_process_main(config, model, input_address, output_address, parent_pid)


def exit_with_parent(parent_pid: int) -> None:
    """Exit this process once its parent is gone (it may have been SIGKILLed): no orphans."""
    while True:
        time.sleep(1.0)
        if os.getppid() != parent_pid:
            os._exit(1)


if __name__ == "__main__":
    _main()
