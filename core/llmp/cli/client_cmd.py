"""``llmp chat`` and ``llmp complete``: terminal clients for any OpenAI-compatible server.

Replies stream to stdout as the server sends them. Errors go to stderr as one
``llmp: error: ...`` line with exit status 1. httpx and asyncio are imported
inside functions: this module is imported whenever the CLI lists commands.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import typer

from llmp.cli.options import options_command
from llmp.cli.sse import ServerError, api_key_or_env, chunk_text, first_model, stream_chunks
from llmp.options import option

EXIT_WORDS = {"exit", "quit"}


@dataclass(frozen=True, kw_only=True)
class ClientOptions:
    """The server to talk to and the sampling options of both clients."""

    url: str = option("http://127.0.0.1:8000/v1", "Base URL of the OpenAI-compatible API.")
    model_name: str | None = option(None, "Model to ask (default: the first id of GET URL/models).")
    api_key: str | None = option(None, "Sent as 'Authorization: Bearer KEY' (default: $OPENAI_API_KEY).")
    max_tokens: int | None = option(None, "Most tokens per reply (default: the server's).", ge=1)
    temperature: float | None = option(None, "Sampling temperature (default: the server's).", ge=0)


@dataclass(frozen=True, kw_only=True)
class ChatOptions:
    system_prompt: str | None = option(None, "A system message opening the chat.")
    quick: str | None = option(None, "Send one message, print the reply and exit.", short="-q", metavar="MSG")


@dataclass(frozen=True, kw_only=True)
class CompleteOptions:
    quick: str | None = option(
        None, "Complete one prompt, print the completion and exit.", short="-q", metavar="PROMPT"
    )


@options_command
def chat(client: ClientOptions, session: ChatOptions) -> None:
    """Chat with a model on an OpenAI-compatible server; one line of stdin per turn, until EOF or 'exit'."""
    _run(client, session.quick, session.system_prompt, chat=True)


@options_command
def complete(client: ClientOptions, session: CompleteOptions) -> None:
    """Complete prompts with a model on an OpenAI-compatible server; one line of stdin per prompt."""
    _run(client, session.quick, None, chat=False)


def _run(options: ClientOptions, quick: str | None, system_prompt: str | None, chat: bool) -> None:
    import asyncio

    try:
        asyncio.run(_session(options, quick, system_prompt, chat))
    except ServerError as exc:
        print(f"llmp: error: {exc}", file=sys.stderr)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        print(file=sys.stderr)
        raise typer.Exit(130) from None


async def _session(options: ClientOptions, quick: str | None, system_prompt: str | None, chat: bool) -> None:
    import httpx

    url = options.url.rstrip("/")
    api_key = api_key_or_env(options.api_key)
    # Replies may take minutes to finish, but each chunk should come within the read timeout.
    async with httpx.AsyncClient(timeout=httpx.Timeout(300.0, connect=10.0)) as client:
        model = options.model_name or await first_model(client, f"{url}/models", api_key)
        conversation = _Conversation(client, url, model, api_key, options, system_prompt, chat)
        if quick is not None:
            await conversation.send(quick)
        else:
            await _repl(conversation)


async def _repl(conversation: _Conversation) -> None:
    """One turn per line of stdin until EOF or 'exit'."""
    if sys.stdin.isatty():
        import readline  # noqa: F401  (importing it gives input() line editing and history)
    while (line := _read_line()) is not None:
        if line.strip() in EXIT_WORDS:
            break
        if not line.strip():
            continue
        try:
            await conversation.send(line)
        except ServerError as exc:
            if exc.status != 400:  # a bad request (say, too long) spoils one turn, not the session
                raise
            print(f"llmp: error: {exc}", file=sys.stderr)


def _read_line() -> str | None:
    """One line of stdin, or None at EOF; a '> ' prompt only when a person is typing."""
    try:
        return input("> " if sys.stdin.isatty() else "")
    except EOFError:
        return None


class _Conversation:
    """Sends turns and streams replies; for chat it keeps the history so later turns see earlier ones."""

    def __init__(
        self,
        client: Any,
        url: str,
        model: str,
        api_key: str | None,
        options: ClientOptions,
        system_prompt: str | None,
        chat: bool,
    ) -> None:
        self.client, self.model, self.api_key, self.options, self.chat = client, model, api_key, options, chat
        self.endpoint = f"{url}/chat/completions" if chat else f"{url}/completions"
        self.history: list[dict[str, str]] = [{"role": "system", "content": system_prompt}] if system_prompt else []

    async def send(self, text: str) -> str:
        if self.chat:
            body: dict[str, Any] = {"messages": [*self.history, {"role": "user", "content": text}]}
        else:
            body = {"prompt": text}
        reply = await self._stream(body)
        if self.chat:  # only a turn that succeeded joins the history
            self.history += [{"role": "user", "content": text}, {"role": "assistant", "content": reply}]
        return reply

    async def _stream(self, body: dict[str, Any]) -> str:
        payload = {"model": self.model, "stream": True, **body}
        if self.options.max_tokens is not None:
            payload["max_tokens"] = self.options.max_tokens
        if self.options.temperature is not None:
            payload["temperature"] = self.options.temperature
        parts: list[str] = []
        try:
            async for chunk in stream_chunks(self.client, self.endpoint, payload, self.api_key):
                if text := chunk_text(chunk):
                    parts.append(text)
                    sys.stdout.write(text)
                    sys.stdout.flush()
        except ServerError:
            if parts:  # end the broken reply's line so the error is not glued to it
                print(flush=True)
            raise
        print(flush=True)
        return "".join(parts)
