"""``llmp chat`` and ``llmp complete``: terminal clients for any OpenAI-compatible server.

Replies stream to stdout as the server sends them. Errors go to stderr as one
``llmp: error: ...`` line with exit status 1. httpx and asyncio are imported
inside functions: this module is imported whenever the CLI lists commands.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer
from pydantic import Field

from llmp.cli import ConfigOption
from llmp.cli.sse import ServerError, api_key_or_env, chunk_text, first_model, stream_chunks
from llmp.config import CommandSettings, load_settings

DEFAULT_URL = "http://127.0.0.1:8000/v1"
EXIT_WORDS = {"exit", "quit"}


class ClientSettings(CommandSettings):
    url: str = DEFAULT_URL
    model_name: str | None = None
    api_key: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0)
    quick: str | None = None


class ChatSettings(ClientSettings):
    system_prompt: str | None = None


class CompleteSettings(ClientSettings):
    pass


# Options shared by both commands (typer reads them from each function's defaults).
UrlOption: Any = typer.Option(DEFAULT_URL, "--url", help="Base URL of the OpenAI-compatible API.")
ModelNameOption: Any = typer.Option(
    None, "--model-name", help="Model to ask (default: the first id of GET URL/models)."
)
ApiKeyOption: Any = typer.Option(
    None, "--api-key", help="Sent as 'Authorization: Bearer KEY' (default: $OPENAI_API_KEY)."
)
MaxTokensOption: Any = typer.Option(None, "--max-tokens", help="Most tokens per reply (default: the server's).")
TemperatureOption: Any = typer.Option(None, "--temperature", help="Sampling temperature (default: the server's).")


def chat(
    ctx: typer.Context,
    url: str = UrlOption,
    model_name: str | None = ModelNameOption,
    api_key: str | None = ApiKeyOption,
    system_prompt: str | None = typer.Option(None, "--system-prompt", help="A system message opening the chat."),
    max_tokens: int | None = MaxTokensOption,
    temperature: float | None = TemperatureOption,
    quick: str | None = typer.Option(
        None, "-q", "--quick", metavar="MSG", help="Send one message, print the reply and exit."
    ),
    config: Path | None = ConfigOption,
) -> None:
    """Chat with a model on an OpenAI-compatible server; one line of stdin per turn, until EOF or 'exit'."""
    _run(load_settings(ChatSettings, ctx), chat=True)


def complete(
    ctx: typer.Context,
    url: str = UrlOption,
    model_name: str | None = ModelNameOption,
    api_key: str | None = ApiKeyOption,
    max_tokens: int | None = MaxTokensOption,
    temperature: float | None = TemperatureOption,
    quick: str | None = typer.Option(
        None, "-q", "--quick", metavar="PROMPT", help="Complete one prompt, print the completion and exit."
    ),
    config: Path | None = ConfigOption,
) -> None:
    """Complete prompts with a model on an OpenAI-compatible server; one line of stdin per prompt."""
    _run(load_settings(CompleteSettings, ctx), chat=False)


def _run(settings: ClientSettings, chat: bool) -> None:
    import asyncio

    try:
        asyncio.run(_session(settings, chat))
    except ServerError as exc:
        print(f"llmp: error: {exc}", file=sys.stderr)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        print(file=sys.stderr)
        raise typer.Exit(130) from None


async def _session(settings: ClientSettings, chat: bool) -> None:
    import httpx

    url = settings.url.rstrip("/")
    api_key = api_key_or_env(settings.api_key)
    # Replies may take minutes to finish, but each chunk should come within the read timeout.
    async with httpx.AsyncClient(timeout=httpx.Timeout(300.0, connect=10.0)) as client:
        model = settings.model_name or await first_model(client, f"{url}/models", api_key)
        conversation = _Conversation(client, url, model, api_key, settings, chat)
        if settings.quick is not None:
            await conversation.send(settings.quick)
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
        self, client: Any, url: str, model: str, api_key: str | None, settings: ClientSettings, chat: bool
    ) -> None:
        self.client, self.model, self.api_key, self.settings, self.chat = client, model, api_key, settings, chat
        self.endpoint = f"{url}/chat/completions" if chat else f"{url}/completions"
        system = getattr(settings, "system_prompt", None)
        self.history: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []

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
        if self.settings.max_tokens is not None:
            payload["max_tokens"] = self.settings.max_tokens
        if self.settings.temperature is not None:
            payload["temperature"] = self.settings.temperature
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
