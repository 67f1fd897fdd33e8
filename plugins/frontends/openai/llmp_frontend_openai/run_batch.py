"""``llmp run-batch -i in.jsonl -o out.jsonl MODEL``: vLLM's offline batch command.

The input is OpenAI's batch format, one ``{"custom_id", "method": "POST", "url", "body"}`` per
line (urls may mix); the output one ``{"id", "custom_id", "response": {"status_code",
"request_id", "body"}, "error"}`` per line, in input order, failed lines included (as vLLM writes
them). Each line runs through the OpenAI front-end's own handler over an engine of its own, as a
server would answer it. ``-`` reads stdin or writes stdout (then nothing else goes to stdout).

Exit status: 0 ran (failed lines included), 1 the file is invalid or the engine died, 2 unreadable
input or a usage error (the engine did not start), 3 the output cannot be written (``WRITE_FAILED``).
"""

from __future__ import annotations

import os
import sys
import tempfile
from dataclasses import dataclass
from typing import Annotated, Any

import typer

from llmp.cli.options import Select, options_command, usage_error
from llmp.options import EngineConfig, FrontendOptions, LogLevel, ServerOptions, option

# the request options of serve that shape an answer; the batch directory and server limits are the server's
RunBatchRequests = Annotated[
    FrontendOptions,
    Select(
        omit=(
            "batch_dir",
            "max_batch_file_bytes",
            "max_batch_lines",
            "grpc_port",
            "enable_store",
            "enable_lora_runtime_updates",
            "lora_resolver_dir",
        )
    ),
]
RunBatchNames = Annotated[ServerOptions, Select(only=("served_model_name", "lora_modules"))]
WRITE_FAILED = 3  # the exit status when the output cannot be written


class OutputUnwritable(Exception):
    """The output file cannot be written: its name and the reason, for one line on stderr."""


class BatchOutput:
    """Where the answers go. A regular file (new or not) is written as a temporary file beside it,
    renamed over it once the run is done, so a run that fails (the engine does not start) leaves an
    earlier file as it was; stdout (``-``), a device or a pipe is written in place, as the lines come."""

    def __init__(self, name: str) -> None:
        self.name, self.temp = name, None
        try:
            if name == "-":
                self.stream: Any = sys.stdout.buffer
            elif os.path.exists(name) and not os.path.isfile(name):
                self.stream = open(name, "wb")  # noqa: SIM115
            else:
                self.target = os.path.realpath(name)
                directory, base = os.path.split(self.target)
                fd, self.temp = tempfile.mkstemp(dir=directory, prefix=f".{base}.", suffix=".part")
                umask = os.umask(0)
                os.umask(umask)
                os.fchmod(fd, 0o666 & ~umask)  # the mode a new file would get, not mkstemp's 0600
                self.stream = os.fdopen(fd, "wb")
        except OSError as exc:
            raise self._failed(exc) from None

    def _failed(self, exc: OSError) -> OutputUnwritable:
        return OutputUnwritable(f"cannot write {'stdout' if self.name == '-' else self.name}: {exc.strerror or exc}")

    def write(self, data: bytes) -> None:
        try:
            self.stream.write(data)
            self.stream.flush()
        except OSError as exc:
            raise self._failed(exc) from None

    def commit(self) -> None:
        """The run is done: the answers replace the file named."""
        try:
            if self.temp is not None:
                self.stream.flush()
                os.fsync(self.stream.fileno())
                self.stream.close()
                os.replace(self.temp, self.target)
                self.temp = None
        except OSError as exc:
            raise self._failed(exc) from None

    def close(self) -> None:
        """Without :meth:`commit`: the temporary file is removed, the file named stays as it was."""
        if self.stream is not sys.stdout.buffer:
            try:
                self.stream.close()
            except OSError:
                pass
        if self.temp is not None:
            os.unlink(self.temp)


@dataclass(frozen=True, kw_only=True)
class BatchFiles:
    input_file: str = option(
        help="JSONL requests, one {custom_id, method, url, body} per line; - reads stdin.",
        short="-i",
        metavar="FILE",
        panel="Batch",
    )
    output_file: str = option(
        help="Where the answers go, one JSON line per request in input order; - writes stdout.",
        short="-o",
        metavar="FILE",
        panel="Batch",
    )
    model_flag: str | None = option(
        None,
        "The model, as the MODEL argument (vLLM's spelling).",
        flag="--model",
        name="batch_model",
        metavar="MODEL",
        panel="Batch",
    )
    log_level: LogLevel = option("warning", "Log level of the messages written to stderr.", panel="Batch")


@options_command
def run_batch(engine: EngineConfig, request: RunBatchRequests, names: RunBatchNames, files: BatchFiles) -> None:
    """Run a file of OpenAI batch requests through a model, offline: answers in input order."""
    if files.model_flag is not None and engine.model is not None and files.model_flag != engine.model:
        raise usage_error(f"the model is given twice: MODEL {engine.model!r} and --model {files.model_flag!r}")
    if files.model_flag is not None:
        from dataclasses import replace

        engine = replace(engine, model=files.model_flag)
    raise typer.Exit(run(engine, request, names, files))


def run(engine_config: EngineConfig, request: FrontendOptions, names: ServerOptions, files: BatchFiles) -> int:
    import asyncio
    import logging

    logging.basicConfig(level=files.log_level.upper(), stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    from llmp.api import LLMPError
    from llmp.frontend import read_chat_template
    from llmp.lora import parse_lora_module
    from llmp_frontend_openai.batch_lines import BATCH_URLS, parse_batch_file

    try:
        content = sys.stdin.buffer.read() if files.input_file == "-" else open(files.input_file, "rb").read()  # noqa: SIM115
    except OSError as exc:
        print(f"llmp run-batch: cannot read {files.input_file}: {exc.strerror}", file=sys.stderr)
        return 2
    lines, errors = parse_batch_file(content, endpoint=None, served=BATCH_URLS)
    if errors:  # the file itself is broken: nothing runs (as a batch whose validation fails)
        for error in errors:
            where = f"line {error['line']}: " if error["line"] is not None else ""
            print(f"llmp run-batch: {files.input_file}: {where}{error['message']} ({error['code']})", file=sys.stderr)
        return 1
    try:
        chat_template = read_chat_template(request.chat_template)
        lora_modules = [parse_lora_module(value) for value in names.lora_modules]
    except (LLMPError, ValueError, OSError) as exc:
        print(f"llmp run-batch: {exc}", file=sys.stderr)
        return 2
    try:
        output = BatchOutput(files.output_file)
    except OutputUnwritable as exc:
        print(f"llmp run-batch: {exc}", file=sys.stderr)
        return WRITE_FAILED
    try:
        engine = _start_engine(engine_config)
    except (LLMPError, ValueError, TypeError, OSError) as exc:
        output.close()
        print(f"llmp run-batch: cannot start the engine: {exc}", file=sys.stderr)
        return 2
    try:
        status = asyncio.run(_run(engine_config, request, names, engine, chat_template, lora_modules, lines, output))
        if status == 0:
            output.commit()
        return status
    except OutputUnwritable as exc:
        print(f"llmp run-batch: {exc}", file=sys.stderr)
        return WRITE_FAILED
    except KeyboardInterrupt:
        return 130
    finally:
        engine.shutdown()
        output.close()


def _start_engine(config: EngineConfig) -> Any:
    """``AsyncLLM`` with fd 1 pointing at stderr meanwhile, so the engine process (which inherits
    it) can never write into an output going to stdout."""
    import os

    from llmp import AsyncLLM

    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        return AsyncLLM(config.model, engine_mode="process", **config.keywords())
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


async def _run(
    engine_config: EngineConfig,
    request: FrontendOptions,
    names: ServerOptions,
    engine: Any,
    chat_template: str | None,
    lora_modules: list[Any],
    lines: list[Any],
    output: Any,
) -> int:
    import asyncio
    import json

    from llmp.api import LLMPError
    from llmp.frontend import frontend_options, load_lora_modules, progress_bar, served_model_names
    from llmp_frontend_openai.batch_runner import LineRunner
    from llmp_frontend_openai.frontend import OpenAIFrontend

    served = served_model_names(names.served_model_name, engine_config.model)
    try:
        await load_lora_modules(engine, lora_modules, served)
    except LLMPError as exc:
        print(f"llmp run-batch: {exc}", file=sys.stderr)
        return 2
    fe = OpenAIFrontend(engine, frontend_options(request, engine.info, served, chat_template=chat_template))
    runner = LineRunner(fe.http_router())
    window = asyncio.Semaphore(2 * engine_config.max_num_seqs)  # the engine's batch full, and as many queued

    async def answer(line: Any) -> Any:
        async with window:
            return await runner.answer(line)

    tasks = [asyncio.ensure_future(answer(line)) for line in lines]
    failed = 0
    try:
        with progress_bar("Running batch", total=len(tasks), unit="requests", follow_log_level=False) as bar:
            for task in tasks:  # written in input order, each as soon as it and those before it are done
                result = await task
                failed += not result.ok
                output.write(json.dumps(result.record, ensure_ascii=False).encode() + b"\n")
                bar.advance()
    finally:
        for task in tasks:
            task.cancel()
    if engine.errored is not None:
        print(f"llmp run-batch: the engine failed: {engine.errored}", file=sys.stderr)
        return 1
    print(f"llmp run-batch: {len(tasks)} requests, {len(tasks) - failed} answered, {failed} failed", file=sys.stderr)
    return 0
