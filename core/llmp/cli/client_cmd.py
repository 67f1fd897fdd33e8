"""``llmp chat`` and ``llmp complete``: terminal clients of an OpenAI-compatible server, or of a
model run in this process (``llmp chat MODEL``, like ``ollama run``).

Which one: a positional MODEL starts a local engine and talks to no server; without it
the client talks to the server at ``--url`` (default ``http://127.0.0.1:8000``); giving
both is a usage error. Replies stream to stdout as they come. At a terminal the chat is a
REPL: Ctrl-C stops a reply (closing its stream, so the server aborts the request) and
returns to the prompt, Ctrl-D or ``/exit`` quits, and slash commands manage the
conversation. Errors go to stderr as one ``llmp: error: ...`` line: status 2 for what was given
(options, a model that cannot be run), 1 for what failed on the way.
httpx, asyncio and the engine are imported inside functions: this module is imported
whenever the CLI lists commands.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer

from llmp.cli.options import options_command, usage_error
from llmp.cli.sse import DEFAULT_URL, ServerError, api_key_or_env, api_url, chunk_text, served_models, stream_chunks
from llmp.options import option

EXIT_WORDS = {"exit", "quit"}  # a bare word ends the session too, as it always has
EXIT_COMMANDS = {"/exit", "/quit", "/bye"}  # /bye: Ollama's
QUIT_HINT = "Use Ctrl-D or /exit to quit."
FENCE = '"""'  # opens and closes a message of several lines, as in `ollama run`
COMPLETION_MAX_TOKENS = 16  # a local completion without --max-tokens, as the server's /v1/completions


@dataclass(frozen=True, kw_only=True)
class ClientOptions:
    """Where the model runs (a server, or this process) and the sampling options of both clients."""

    local_model: str | None = option(
        None,
        "Model directory, .gguf file or Hugging Face id to run in this process, like `ollama run`; "
        "without it the client talks to the server at --url. Not both.",
        argument=True,
        metavar="MODEL",
    )
    url: str | None = option(
        None, f"The server: http://HOST:PORT, with or without /v1 (default {DEFAULT_URL}).", metavar="URL"
    )
    model: str | None = option(
        None, "Model to ask the server for (default: the first of GET URL/v1/models).", metavar="NAME"
    )
    api_key: str | None = option(
        None, "Sent as 'Authorization: Bearer KEY'; LLMP_API_KEY comes before OPENAI_API_KEY.", metavar="KEY"
    )
    max_tokens: int | None = option(None, "Most tokens per reply (default: the server's).", ge=1)
    temperature: float | None = option(None, "Sampling temperature (default: the server's).", ge=0)


@dataclass(frozen=True, kw_only=True)
class ChatOptions:
    system_prompt: str | None = option(None, "A system message opening the chat (/system changes it).")
    quick: str | None = option(None, "Send one message, print the reply and exit.", short="-q", metavar="MSG")


@dataclass(frozen=True, kw_only=True)
class CompleteOptions:
    quick: str | None = option(
        None, "Complete one prompt, print the completion and exit.", short="-q", metavar="PROMPT"
    )


@options_command
def chat(client: ClientOptions, session: ChatOptions) -> None:
    """A chat REPL, or one message with -q; its help text is its CommandSpec's (llmp/builtins/commands.py)."""
    _run(client, session.quick, session.system_prompt, chat=True)


@options_command
def complete(client: ClientOptions, session: CompleteOptions) -> None:
    """A completion REPL, or one prompt with -q; its help text is its CommandSpec's."""
    _run(client, session.quick, None, chat=False)


def _run(options: ClientOptions, quick: str | None, system_prompt: str | None, chat: bool) -> None:
    import asyncio

    _check_target(options, quick)
    # One event loop for the whole session, so the HTTP client (or the engine's streams) outlive a turn;
    # while a turn runs, Ctrl-C cancels it (the Runner's SIGINT handling) and the REPL goes on.
    with asyncio.Runner() as runner:
        try:
            backend = _start_local(options) if options.local_model is not None else runner.run(_connect(options))
            try:
                conversation = _Conversation(backend, options, system_prompt, chat)
                if quick is not None:
                    runner.run(conversation.send(quick))
                    failed = False
                else:
                    failed = _repl(runner, conversation)
            finally:
                runner.run(backend.close())
            if failed:  # piped lines went on after a refused one; the status still says so
                raise typer.Exit(1)
        except ServerError as exc:
            print(f"llmp: error: {exc}", file=sys.stderr)
            raise typer.Exit(1) from None
        except KeyboardInterrupt:
            print(file=sys.stderr)
            raise typer.Exit(130) from None


def _check_target(options: ClientOptions, quick: str | None) -> None:
    """Usage errors (status 2) before anything starts: an empty -q, MODEL with a server's options,
    a URL that is none."""
    problem = None
    if quick is not None and not quick.strip():
        problem = "-q needs text to send; it is empty"
    elif options.local_model is not None:
        given = [
            f"{flag} (or {variable})"
            for flag, variable, value in (("--url", "LLMP_URL", options.url), ("--model", "LLMP_MODEL", options.model))
            if value is not None
        ]
        if given:
            problem = (
                f"MODEL runs a model in this process, but {' and '.join(given)} is set for a server: "
                "give one or the other"
            )
    elif options.url is not None:
        try:
            api_url(options.url)
        except ServerError as exc:
            problem = str(exc)
    if problem:
        raise usage_error(problem)


# -- where the model runs ------------------------------------------------------------


class _Server:
    """An OpenAI-compatible server: each turn is a streamed POST to its chat or completions route."""

    def __init__(self, client: Any, base: str, model: str, api_key: str | None) -> None:
        self.client, self.base, self.model, self.api_key = client, base, model, api_key
        self.where = f"at {base}"

    async def stream(self, body: dict[str, Any], chat: bool) -> AsyncIterator[str]:
        endpoint = f"{self.base}/chat/completions" if chat else f"{self.base}/completions"
        async for chunk in stream_chunks(self.client, endpoint, {"model": self.model, **body}, self.api_key):
            if text := chunk_text(chunk):
                yield text

    async def close(self) -> None:
        await self.client.aclose()


async def _connect(options: ClientOptions) -> _Server:
    import httpx

    base = api_url(options.url or DEFAULT_URL)
    api_key = api_key_or_env(options.api_key)
    # Replies may take minutes to finish, but each chunk should come within the read timeout.
    client = httpx.AsyncClient(timeout=httpx.Timeout(300.0, connect=10.0))
    try:
        model = options.model or (await served_models(client, f"{base}/models", api_key))[0]
    except BaseException:
        await client.aclose()
        raise
    return _Server(client, base, model, api_key)


class _LocalEngine:
    """A model run in this process: ``AsyncLLM``, with the requests made as ``llmp serve``'s front-end
    makes them (the chat template, the generation-config defaults, the context-length checks)."""

    def __init__(self, model: Any, engine_process: Any) -> None:
        from llmp import AsyncLLM
        from llmp.frontend import FrontendKit, frontend_options, served_model_names
        from llmp.options import FrontendOptions

        # no periodic statistics lines: they would land in the chat
        self.engine = AsyncLLM(model, engine_process=engine_process, disable_log_stats=True)
        names = served_model_names((), model.name)
        self.kit = FrontendKit(self.engine, frontend_options(FrontendOptions(), self.engine.info, names))
        self.model, self.where = names[0], "in this process"

    async def stream(self, body: dict[str, Any], chat: bool) -> AsyncIterator[str]:
        from llmp.frontend import SamplingRequest, as_api_error, engine_request_id

        try:
            if chat:
                prompt = await self.kit.conversation_prompt(body["messages"], None)
            else:
                [prompt] = await self.kit.prompt_inputs(body["prompt"], "prompt", True)
            # unset, a completion stops at 16 tokens as the server's /v1/completions (OpenAI's and vLLM's
            # default); a chat reply runs to its end
            max_tokens = body.get("max_tokens", None if chat else COMPLETION_MAX_TOKENS)
            sampling = SamplingRequest(max_tokens=max_tokens, temperature=body.get("temperature"))
            params = self.kit.sampling_params(sampling, len(prompt.token_ids))
            async for output in self.engine.generate(prompt, params, engine_request_id("chat"), delta=True):
                if output.outputs and output.outputs[0].text:
                    yield output.outputs[0].text
        except Exception as exc:  # the server's answer to the same failure (a 400 spoils one turn)
            error = as_api_error(exc)
            message = error.message if error.status != 500 else f"{type(exc).__name__}: {exc}"  # no server to hide it
            raise ServerError(message, error.status) from None

    async def close(self) -> None:
        import asyncio

        await asyncio.to_thread(self.engine.shutdown)


def _start_local(options: ClientOptions) -> _LocalEngine:
    """The engine on MODEL, as quiet as ``ollama run``: the ``llmp`` log at WARNING unless
    ``LLMP_LOG_LEVEL`` asks otherwise, and at a terminal one transient "loading MODEL" status.
    A model that cannot be found or served is a usage error (status 2), as in ``llmp serve``;
    an engine that fails to start is status 1."""
    import logging
    import os

    from llmp.api import LLMPError
    from llmp.engine.engine_process import EngineProcess
    from llmp.model_files.resolve import resolve_model
    from llmp.options import EngineConfig

    name = options.local_model or ""
    if "LLMP_LOG_LEVEL" not in os.environ:
        logging.getLogger("llmp").setLevel(logging.WARNING)  # the engine process takes this level too
    model = engine_process = None
    try:
        engine_process = EngineProcess()  # importing torch and the engine while the model resolves
        with _loading_status(name):  # the errors are printed after it, on a clean line
            model = resolve_model(EngineConfig(model=name))
            if model.task == "generate":
                return _LocalEngine(model, engine_process)
    except (LLMPError, ValueError, TypeError, OSError) as exc:
        if model is None:  # found or read wrongly: what was given
            raise usage_error(f"cannot run {name}: {exc}") from None
        raise ServerError(f"cannot run {name}: {exc}") from None
    finally:
        if engine_process is not None:
            engine_process.discard()  # unless the engine runs in it
    raise usage_error(
        f"cannot run {name}: its task is {model.task!r}; chat and complete need a model that generates text"
    )


@contextmanager
def _loading_status(model: str) -> Iterator[None]:
    """A spinner saying "loading MODEL" on stderr while the block runs, gone when it ends; only at a
    terminal, and only when the log is quiet (its own lines would tear the spinner)."""
    import logging

    from rich.console import Console

    console = Console(stderr=True)
    if not console.is_terminal or logging.getLogger("llmp").isEnabledFor(logging.INFO):
        yield
        return
    with console.status(f"loading {model} …"):
        yield


# -- the conversation ----------------------------------------------------------------


class _Conversation:
    """Sends turns and streams replies; for chat it keeps the history so later turns see earlier ones."""

    def __init__(self, backend: Any, options: ClientOptions, system_prompt: str | None, chat: bool) -> None:
        self.backend, self.options, self.chat = backend, options, chat
        self.system_prompt = system_prompt
        self.turns: list[dict[str, str]] = []

    @property
    def messages(self) -> list[dict[str, str]]:
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return system + self.turns

    def banner(self) -> str:
        command = "llmp chat" if self.chat else "llmp complete"
        more = "/help, /clear, /system, /save" if self.chat else "/help"
        return (
            f"{command}: {self.backend.model} {self.backend.where}. "
            f"Ctrl-C stops a reply; Ctrl-D or /exit quits; {more}."
        )

    async def send(self, text: str) -> str:
        """Stream the reply to ``text`` to stdout. A reply stopped by Ctrl-C (cancellation) joins
        the history as far as it got; a failed one does not."""
        import asyncio

        body: dict[str, Any] = (
            {"messages": [*self.messages, {"role": "user", "content": text}]} if self.chat else {"prompt": text}
        )
        body["stream"] = True
        if self.options.max_tokens is not None:
            body["max_tokens"] = self.options.max_tokens
        if self.options.temperature is not None:
            body["temperature"] = self.options.temperature
        parts: list[str] = []
        try:
            async for piece in self.backend.stream(body, self.chat):
                parts.append(piece)
                sys.stdout.write(piece)
                sys.stdout.flush()
        except asyncio.CancelledError:
            print(flush=True)  # end the stopped reply's line
            self._remember(text, "".join(parts))
            raise
        except ServerError:
            if parts:  # end the broken reply's line so the error is not glued to it
                print(flush=True)
            raise
        print(flush=True)
        self._remember(text, "".join(parts))
        return "".join(parts)

    def _remember(self, text: str, reply: str) -> None:
        if self.chat:
            self.turns += [{"role": "user", "content": text}, {"role": "assistant", "content": reply}]

    # -- slash commands ------------------------------------------------------------

    def command(self, line: str) -> bool:
        """Run a slash command; False when it ends the session."""
        name, _, argument = line.partition(" ")
        argument = argument.strip()
        if name in EXIT_COMMANDS:
            return False
        if name in ("/help", "/?"):
            print(self._help(), file=sys.stderr)
        elif self.chat and name == "/clear":
            self.turns = []
            print("The conversation is cleared (the system prompt stays).", file=sys.stderr)
        elif self.chat and name == "/system":
            self.system_prompt = argument or None
            print(f"System prompt {'set' if argument else 'removed'}.", file=sys.stderr)
        elif self.chat and name == "/save":
            self._save(argument)
        else:
            print(f"Unknown command {name}; /help lists the commands.", file=sys.stderr)
        return True

    def _help(self) -> str:
        lines = [
            "/exit, /quit       quit (or Ctrl-D)",
            "/help              this list",
        ]
        if self.chat:
            lines += [
                "/clear             start the conversation afresh (the system prompt stays)",
                "/system TEXT       set the system prompt (/system alone removes it)",
                "/save FILE         write the conversation to FILE as JSON",
            ]
        lines += [
            "//TEXT             send TEXT starting with one /",
            '"""                begin a message of several lines; end it with """',
            "Ctrl-C stops a reply and returns to the prompt.",
        ]
        return "\n".join(lines)

    def _save(self, path: str) -> None:
        if not path:
            print("Usage: /save FILE", file=sys.stderr)
            return
        record = {"model": self.backend.model, "messages": self.messages}
        try:
            Path(path).expanduser().write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")
        except OSError as exc:
            print(f"Cannot write {path}: {exc.strerror or exc}", file=sys.stderr)
            return
        print(f"Saved {len(self.messages)} messages to {path}.", file=sys.stderr)


# -- the loop ------------------------------------------------------------------------


def _repl(runner: Any, conversation: _Conversation) -> bool:
    """One turn per line of stdin until EOF, /exit or 'exit'; at a terminal, with line editing.
    Whether a piped line was refused (the session went on: the exit status says so)."""
    interactive = sys.stdin.isatty()
    failed = False
    if interactive:
        import readline  # noqa: F401  (importing it gives input() line editing and history)

        print(conversation.banner(), file=sys.stderr)
    while True:
        try:
            line = input("> " if interactive else "")
        except EOFError:
            if interactive:
                print()  # Ctrl-D: leave the shell's prompt on a line of its own
            return failed
        except KeyboardInterrupt:  # at the prompt: a fresh line, as Python's REPL and Ollama do
            print(f"\n{QUIT_HINT}", file=sys.stderr)
            continue
        text = line.strip()
        if text.startswith(FENCE):  # Ollama's: a message of several lines, sent whole
            try:
                message = _fenced_message(text, interactive)
            except KeyboardInterrupt:
                print(f"\n{QUIT_HINT}", file=sys.stderr)
                continue
            if not message.strip():
                continue
        elif not text:
            continue
        elif text in EXIT_WORDS:
            return failed
        elif text.startswith("/") and not text.startswith("//"):
            if not conversation.command(text):
                return failed
            continue
        else:
            message = text[1:] if text.startswith("//") else line
        try:
            with _typing_held(interactive):
                runner.run(conversation.send(message))
        except KeyboardInterrupt:  # the reply is stopped and its request aborted; back to the prompt
            continue
        except ServerError as exc:
            if exc.status != 400:  # a bad request (say, too long) spoils one turn, not the session
                raise
            print(f"llmp: error: {exc}", file=sys.stderr)
            failed = not interactive


def _fenced_message(first: str, interactive: bool) -> str:
    """The lines from one opening \"\"\" to the line that ends with the closing one (Ollama's
    multi-line input), joined by newlines, without the fences; at the end of input, the lines so
    far (a block left open is sent, not dropped)."""
    lines = [first[len(FENCE) :]]
    while not (lines[-1].rstrip().endswith(FENCE) and (len(lines) > 1 or lines[0].strip() != "")):
        try:
            lines.append(input("... " if interactive else ""))
        except EOFError:
            return "\n".join(lines).strip("\n")
    lines[-1] = lines[-1].rstrip()[: -len(FENCE)]
    return "\n".join(lines).strip("\n")


@contextmanager
def _typing_held(terminal: bool) -> Iterator[None]:
    """While a reply streams, keys typed are not echoed into it, and are dropped afterwards rather
    than sent as the next message (a notice says so: several lines go in a \"\"\" block). Ctrl-C
    still works (the terminal's signals stay on)."""
    if not terminal:
        yield
        return
    import termios

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    quiet = list(saved)
    quiet[3] &= ~(termios.ECHO | termios.ICANON)  # the local-mode flags: no echo; every key counted
    termios.tcsetattr(fd, termios.TCSANOW, quiet)
    try:
        yield
    finally:
        if _pending_input(fd):
            notice = f"(what was typed during the reply was dropped; send several lines in a {FENCE} block)"
            print(notice, file=sys.stderr)
        termios.tcflush(fd, termios.TCIFLUSH)
        termios.tcsetattr(fd, termios.TCSANOW, saved)


def _pending_input(fd: int) -> bool:
    import fcntl
    import struct
    import termios

    try:
        return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0] > 0
    except OSError:
        return False
