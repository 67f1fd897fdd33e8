"""The suites of the small kinds: stat loggers, commands and LoRA resolvers.

- **stat_logger** (``llmp.api.StatLogger``): the factory builds from an ``EngineInfo``; the logger
  takes a trace of the engine's records (``SchedulerStats`` of prefill, decode and abort steps,
  ``FinishedRequestStats`` of finished, cut-off, aborted and pooling requests) without raising
  and without holding the engine's loop (each call under :data:`MAX_CALL_S`); and it runs in a
  real engine on a tiny Llama without being dropped (skipped when ``models-llama`` or a CPU kernel
  set is not installed).
- **command** (``CommandSpec``): the name is a command-line word (that no other plugin claims:
  ``verify`` checks that for every kind); the implementation is a typer app or a function;
  ``llmp NAME --help`` exits 0 in a subprocess and imports no heavy library (torch,
  transformers, triton) on the way, so ``llmp --help`` stays fast. (A plugin registered
  in-process is invisible to a subprocess: that check is skipped.)
- **lora_resolver** (``LoRAResolverSpec``): the factory builds with default ``FrontendOptions``
  (and with options naming an empty resolver directory); a name the resolver does not know
  resolves to ``None`` (or raises ``LoRAAdapterNotFoundError``), never anything else, whatever
  the name; and resolving does not stall the server's event loop past :data:`MAX_LOOP_STALL_S`.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import re
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from llmp.api import ComponentSpec
from llmp.conformance.runner import Check, Context, SkipCheck

__all__ = ["command_suite", "lora_resolver_suite", "stat_logger_suite"]

MAX_CALL_S = 0.5  # a stat logger call runs on the engine's loop: longer than this holds every request
MAX_LOOP_STALL_S = 1.0  # a resolver that blocks the server's event loop longer stalls every request
RESOLVE_TIMEOUT_S = 10.0
HEAVY_MODULES = ("torch", "transformers", "triton")


def _fail_on_error(what: str, call: Any, *args: Any) -> Any:
    try:
        return call(*args)
    except (AssertionError, SkipCheck):
        raise
    except Exception as error:
        raise AssertionError(f"{what} raised {type(error).__name__}: {error}") from error


# -- stat loggers ---------------------------------------------------------------------------------------


def _engine_info(model: str = "tiny-llama") -> Any:
    from llmp.api import EngineInfo

    return EngineInfo(
        model=model,
        executor="uniproc",
        kernels="torch",
        scheduler="default",
        kv_manager="default",
        device="cpu",
        options={"max_model_len": 128, "num_kv_blocks": 64, "block_size": 4, "dtype": "float32"},
    )


def engine_trace() -> list[Any]:
    """The records an engine gives its stat loggers for a short workload, in the engine's order:
    three requests (one sharing a cached prefix, one preempted and recomputed, one cut off by
    ``max_tokens``), an abort between steps (a step record with no tokens), a pooling request."""
    from llmp.api import FinishedRequestStats, SchedulerStats

    def step(running: int, waiting: int, usage: float, queries: int, hits: int, preempted: int, prompt: int, gen: int):
        return SchedulerStats(running, waiting, usage, queries, hits, preempted, prompt, gen)

    def finished(rid: str, reason: str | None, prompt: int, gen: int, cached: int, ttft: float | None, e2e: float):
        return FinishedRequestStats(rid, reason, prompt, gen, cached, 0.001, ttft, e2e)

    trace: list[Any] = [
        step(1, 2, 0.05, 12, 0, 0, 12, 1),  # prefill of the first request, two waiting
        step(3, 0, 0.2, 40, 8, 0, 28, 3),  # the others' prefills (8 tokens from the prefix cache)
        step(3, 0, 1.0, 40, 8, 0, 0, 3),  # every block in use
        step(2, 1, 0.7, 40, 8, 1, 0, 2),  # one preempted
        step(3, 0, 0.9, 52, 8, 1, 12, 3),  # recomputed
        finished("req-stop", "stop", 12, 5, 0, 0.02, 0.1),
        step(2, 0, 0.6, 52, 8, 1, 0, 2),
        finished("req-length", "length", 20, 4, 8, 0.03, 0.12),
        step(1, 0, 0.3, 52, 8, 1, 0, 0),  # the abort between steps: no tokens
        finished("req-abort", "abort", 8, 2, 0, 0.04, 0.15),
        step(0, 0, 0.0, 52, 8, 1, 0, 0),
        step(1, 0, 0.1, 60, 8, 1, 8, 0),  # a pooling request: its prompt, no sampled token
        finished("req-embed", "stop", 8, 0, 0, None, 0.05),
        finished("req-never-ran", "abort", 30, 0, 0, None, 0.2),  # aborted while waiting
        step(0, 0, 0.0, 60, 8, 1, 0, 0),
    ]
    return trace


class _StatLoggerSuite:
    def __init__(self, spec: ComponentSpec, context: Context) -> None:
        self.spec, self.context = spec, context

    def checks(self) -> Iterator[Check]:
        yield Check("builds from its record with the engine's info", self.check_builds)
        yield Check("takes the engine's records without raising or blocking", self.check_records)
        yield Check("runs in a real engine without being dropped", self.check_engine)

    def build(self) -> Any:
        factory = _fail_on_error(f"importing {self.spec.impl}", self.spec.load)
        started = time.perf_counter()
        logger = _fail_on_error(f"{self.spec.impl}(engine_info)", factory, _engine_info())
        took = time.perf_counter() - started
        assert took < 5 * MAX_CALL_S, (
            f"building the logger took {took:.2f} s: the engine builds it as it starts; do slow set-up lazily"
        )
        for method in ("record_step", "record_finished"):
            assert callable(getattr(logger, method, None)), (
                f"{self.spec.impl}(engine_info) returned {logger!r}, which has no {method} method "
                "(see llmp.api.StatLogger)"
            )
        return logger

    def check_builds(self) -> None:
        self.build()

    def check_records(self) -> None:
        from llmp.api import SchedulerStats

        logger = self.build()
        for index, record in enumerate(engine_trace()):
            method = "record_step" if isinstance(record, SchedulerStats) else "record_finished"
            started = time.perf_counter()
            _fail_on_error(f"{method}(record {index} of the engine trace: {record})", getattr(logger, method), record)
            took = time.perf_counter() - started
            assert took < MAX_CALL_S, (
                f"{method}(record {index}: {record}) took {took:.2f} s: the engine waits for it on every step; "
                f"keep a call under {MAX_CALL_S} s (hand slow work, such as I/O, to a thread)"
            )

    def check_engine(self) -> None:
        from llmp import LLM, SamplingParams, registry

        if "LlamaForCausalLM" not in registry.components("model"):
            raise SkipCheck(
                "needs the Llama model plugin (llmp-models-llama) for a tiny engine run; it is not installed"
            )
        if not any("cpu" in getattr(spec, "devices", ()) for spec in registry.components("kernels").values()):
            raise SkipCheck("needs a kernel set for the CPU (llmp-kernels-torch) for a tiny engine run")
        model_dir = self.context.once("misc:tiny-llama", self._save_model)
        with _engine_errors(self.spec.name) as errors:
            llm = LLM(str(model_dir), dtype="float32", block_size=4, max_model_len=128, disable_log_stats=False)
            try:
                params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
                outputs = llm.generate(["The quick", "Paged attention", "Café"], params, use_tqdm=False)
            finally:
                llm.shutdown()
        assert not errors, f"the engine dropped the stat logger {self.spec.name!r}: " + "\n".join(errors)
        assert all(o.finished for o in outputs), "the engine did not finish its requests"

    def _save_model(self) -> Any:
        from transformers.utils import logging as hf_logging

        from llmp.testing import save_tiny_llama

        path = self.context.workdir / "stat-logger-tiny-llama"
        bars = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()  # the report is what verify shows
        try:
            save_tiny_llama(path)
        finally:
            if bars:
                hf_logging.enable_progress_bar()
        return path


@contextmanager
def _engine_errors(name: str) -> Iterator[list[str]]:
    """What the engine logs about stat logger ``name`` failing (it then drops the logger and goes
    on), with the traceback's last lines; the engine's INFO lines are kept out of the report."""
    errors: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            message = record.getMessage()
            if record.levelno >= logging.ERROR and f"stat logger {name!r}" in message:
                if record.exc_info and record.exc_info[1] is not None:
                    error = record.exc_info[1]
                    message += f": {type(error).__name__}: {error}"
                errors.append(message)

    logger = logging.getLogger("llmp.engine")
    handler, level = Collect(), logging.getLogger("llmp").level
    logger.addHandler(handler)
    logging.getLogger("llmp").setLevel(logging.WARNING)
    try:
        yield errors
    finally:
        logger.removeHandler(handler)
        logging.getLogger("llmp").setLevel(level)


def stat_logger_suite(spec: ComponentSpec, context: Context) -> Iterator[Check]:
    """The checks of a stat logger (see the module docstring). No options."""
    yield from _StatLoggerSuite(spec, context).checks()


# -- commands -------------------------------------------------------------------------------------------

_COMMAND_WORD = re.compile(r"[a-z][a-z0-9]*(?:[-_][a-z0-9]+)*")


class _CommandSuite:
    def __init__(self, spec: ComponentSpec, heavy_modules: tuple[str, ...]) -> None:
        self.spec, self.heavy_modules = spec, heavy_modules

    def checks(self) -> Iterator[Check]:
        yield Check("its name is a command-line word", self.check_name)
        yield Check("its implementation is a typer app or a function", self.check_implementation)
        yield Check("`llmp NAME --help` exits 0 in a subprocess and imports nothing heavy", self.check_help)

    def check_name(self) -> None:
        name = self.spec.name
        assert _COMMAND_WORD.fullmatch(name), (
            f"command name {name!r} is not a command-line word: lowercase letters and digits, words joined by '-'"
        )

    def check_implementation(self) -> None:
        import typer

        impl = _fail_on_error(f"importing {self.spec.impl}", self.spec.load)
        assert isinstance(impl, typer.Typer) or inspect.isfunction(impl) or inspect.ismethod(impl), (
            f"{self.spec.impl} is {impl!r}: expected a typer.Typer (a command group) or a function (one command)"
        )

    def check_help(self) -> None:
        from llmp import plugins
        from llmp.testing import run_llmp

        record = plugins.get_record(self.spec.plugin)
        if record is not None and record.distribution == plugins.IN_PROCESS:
            raise SkipCheck("the plugin is registered in-process, so a subprocess cannot see it: install it to check")
        name = self.spec.name
        result = run_llmp(name, "--help", check=False, timeout=120, env={"PYTHONPROFILEIMPORTTIME": "1"})
        errors = "\n".join(line for line in result.stderr.splitlines() if not line.startswith("import time:"))
        assert result.returncode == 0, f"`llmp {name} --help` exited {result.returncode}:\n{errors[-2000:]}"
        assert name in result.stdout and "(broken)" not in result.stdout, (
            f"`llmp {name} --help` printed no help of {name!r}:\n{result.stdout[-1000:]}{errors[-1000:]}"
        )
        heavy = sorted(
            {
                line.rsplit("|", 1)[-1].strip()
                for line in result.stderr.splitlines()
                if line.startswith("import time:") and line.rsplit("|", 1)[-1].strip() in self.heavy_modules
            }
        )
        assert not heavy, (
            f"`llmp {name} --help` imported {', '.join(heavy)}: `llmp --help` imports every command's module, so "
            f"keep the top level of {self.spec.impl.partition(':')[0]} light (import heavy libraries inside the "
            "command function)"
        )


def command_suite(spec: ComponentSpec, context: Context) -> Iterator[Check]:
    """The checks of a command (see the module docstring). Option ``heavy_modules``: the top-level
    modules ``llmp NAME --help`` must not import (default :data:`HEAVY_MODULES`)."""
    yield from _CommandSuite(spec, tuple(context.options.get("heavy_modules", HEAVY_MODULES))).checks()


# -- LoRA resolvers -------------------------------------------------------------------------------------

BASE_MODEL = "llmp-conformance/tiny-base"
# names no resolver knows: an unknown one, and the odd ones a client may send
UNKNOWN_NAMES = (
    f"no-such-adapter-{uuid.uuid4().hex[:12]}",
    "",
    "../outside",
    "/etc/passwd",
    "sub/../sub",
    "trailing/",
    "名前-🙂",
    "x" * 300,
)


class _LoRAResolverSuite:
    def __init__(self, spec: ComponentSpec, context: Context) -> None:
        self.spec, self.context = spec, context

    def checks(self) -> Iterator[Check]:
        yield Check("builds with the default FrontendOptions", self.check_builds)
        yield Check("an unknown adapter name resolves to None", self.check_unknown_names)
        yield Check("resolving does not stall the server's event loop", self.check_loop_not_blocked)

    def build(self, options: Any = None) -> Any:
        from llmp.options import FrontendOptions

        factory = _fail_on_error(f"importing {self.spec.impl}", self.spec.load)
        options = options or FrontendOptions()
        resolver = _fail_on_error(f"{self.spec.impl}(options)", factory, options)
        method = getattr(resolver, "resolve_lora", None)
        assert callable(method), f"{self.spec.impl}(options) returned {resolver!r}, which has no resolve_lora method"
        assert inspect.iscoroutinefunction(method), (
            f"{type(resolver).__name__}.resolve_lora is not a coroutine function: declare it `async def` "
            "(the server awaits it on its event loop)"
        )
        return resolver

    def resolvers(self) -> list[tuple[str, Any]]:
        from llmp.options import FrontendOptions

        directory = self.context.workdir / "lora-resolver-dir"
        directory.mkdir(exist_ok=True)
        return [
            ("default options", self.build()),
            (
                "options naming an empty resolver directory",
                self.build(FrontendOptions(lora_resolver_dir=str(directory))),
            ),
        ]

    def check_builds(self) -> None:
        self.build()

    def check_unknown_names(self) -> None:
        from llmp.api import LoRAAdapterNotFoundError

        for built_with, resolver in self.resolvers():
            for name in UNKNOWN_NAMES:
                call = f"resolve_lora({BASE_MODEL!r}, {name[:60]!r}) (built with {built_with})"
                try:
                    result = asyncio.run(asyncio.wait_for(resolver.resolve_lora(BASE_MODEL, name), RESOLVE_TIMEOUT_S))
                except LoRAAdapterNotFoundError:
                    continue
                except TimeoutError as error:
                    raise AssertionError(f"{call} did not return within {RESOLVE_TIMEOUT_S:.0f} s") from error
                except Exception as error:
                    raise AssertionError(
                        f"{call} raised {type(error).__name__}: {error}: a name the resolver does not know resolves "
                        "to None (or raises LoRAAdapterNotFoundError)"
                    ) from error
                assert result is None, (
                    f"{call} returned {result!r}: a name the resolver does not know resolves to None "
                    "(or raises LoRAAdapterNotFoundError)"
                )

    def check_loop_not_blocked(self) -> None:
        resolver = self.build()

        async def measure() -> float:
            stall, last = 0.0, time.perf_counter()
            done = asyncio.Event()

            async def heartbeat() -> None:
                nonlocal stall, last
                while not done.is_set():
                    await asyncio.sleep(0.01)
                    now = time.perf_counter()
                    stall, last = max(stall, now - last), now

            beating = asyncio.create_task(heartbeat())
            await asyncio.sleep(0)  # let the heartbeat start
            last = time.perf_counter()
            try:
                await asyncio.wait_for(resolver.resolve_lora(BASE_MODEL, UNKNOWN_NAMES[0]), RESOLVE_TIMEOUT_S)
            except Exception:
                pass  # what it returns is the other check's business
            finally:
                stall = max(stall, time.perf_counter() - last)
                done.set()
                await beating
            return stall

        stall = asyncio.run(measure())
        assert stall < MAX_LOOP_STALL_S, (
            f"resolve_lora held the event loop for {stall:.2f} s: the server answers every request on that loop; "
            "do file and network I/O in a thread (asyncio.to_thread) or with an async client"
        )


def lora_resolver_suite(spec: ComponentSpec, context: Context) -> Iterator[Check]:
    """The checks of a LoRA resolver (see the module docstring). No options."""
    yield from _LoRAResolverSuite(spec, context).checks()
