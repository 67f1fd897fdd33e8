"""Talking to OpenAI-compatible servers: shared by ``llmp chat``, ``llmp complete`` and ``llmp bench serve``.

Every failure (connection refused, an HTTP error status, a stream cut short)
becomes a :class:`ServerError` whose message is one line fit for a terminal,
so the commands never show a traceback. httpx is imported inside functions:
this module is imported whenever the CLI lists its commands.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

DEFAULT_URL = "http://127.0.0.1:8000"  # where ``llmp serve`` listens by default


class ServerError(Exception):
    """A request to the server failed; ``str(error)`` is one line saying why."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(" ".join(message.split()))  # one line, whatever the server sent
        self.status = status


def api_url(url: str) -> str:
    """The OpenAI API base of a client's ``--url``, whichever form was given.

    ``http://host:port``, ``http://host:port/``, ``http://host:port/v1`` and ``.../v1/``
    all give ``http://host:port/v1``; a path in front stays (``http://proxy/llm`` gives
    ``http://proxy/llm/v1``) and ``host:port`` alone gets ``http://``. Every client command
    (``llmp chat``, ``llmp complete``, ``llmp bench serve``) reads its URL through this, before
    sending anything: a URL that names no server (no host, a port out of range or not a number,
    another scheme) raises :class:`ServerError` saying why, in one line.
    """
    given = url
    url = url.strip()
    if "://" not in url and url:
        url = "http://" + url
    problem = _address_problem(url)
    if problem:
        raise ServerError(f"--url {given!r} is not a server address ({problem}); give one such as {DEFAULT_URL}")
    url = url.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


def _address_problem(url: str) -> str | None:
    """What keeps ``url`` from naming an HTTP server, or None. The port and host are read inside the
    ``try``: urllib raises ValueError on reading a bad one, and httpx rejects what urllib lets pass."""
    import httpx

    if not url:
        return "it is empty"
    try:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https"):
            return "the scheme must be http or https"
        if not parts.hostname:
            return "no host"
        if parts.query or parts.fragment:
            return "a ?query or #fragment has no place in it"
        try:
            port = parts.port
        except ValueError:
            port = 0  # out of range, or not a number
        if port == 0:
            return "the port must be a number from 1 to 65535"
        httpx.URL(url)
    except httpx.InvalidURL as exc:
        return str(exc).rstrip(".")
    except ValueError as exc:  # urllib's "Invalid IPv6 URL": a bracket left open
        return str(exc)
    return None


def api_key_or_env(api_key: str | None) -> str | None:
    """The key from the options (``--api-key``, ``LLMP_API_KEY``, the config file), else ``OPENAI_API_KEY``."""
    import os

    return api_key or os.environ.get("OPENAI_API_KEY") or None


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _http_error(url: str, status: int, body: bytes) -> ServerError:
    """One line naming the status, the URL tried and the server's message; a 404 says what to try."""
    detail = _error_detail(body)
    if status == 404:
        models = url.rpartition("/v1/")[0] + "/v1/models" if "/v1/" in url else None
        if "model" in detail.lower() and models:
            detail += f" (GET {models} lists the models it serves; name one with --model)"
        else:
            api = url.rpartition("/v1")[0] + "/v1" if "/v1" in url else _root(url)
            detail += f" (no OpenAI API answers under {api}; check --url: http://HOST:PORT, with or without /v1)"
    return ServerError(f"HTTP {status} from {url}: {detail}", status)


def _root(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def _error_detail(body: bytes) -> str:
    """The message of an OpenAI error body ``{"error": {"message": ...}}``, or of FastAPI's ``{"detail": ...}``."""
    try:
        data = json.loads(body)
    except ValueError:
        return body.decode(errors="replace").strip()[:300] or "(empty body)"
    if isinstance(data, dict):
        error = data.get("error", data.get("detail"))
        if isinstance(error, dict):
            return str(error.get("message") or error)
        if error is not None:
            return str(error)
    return json.dumps(data)[:300]


def _transport_error(url: str, exc: Exception) -> ServerError:
    import httpx

    if isinstance(exc, httpx.ConnectError):
        reason = _root_cause(exc)
        if reason == "Connection refused":
            reason += f": no server is running at {_root(url)} (start one with `llmp serve MODEL`, or check --url)"
        return ServerError(f"cannot connect to {url}: {reason}")
    if isinstance(exc, httpx.TimeoutException):
        return ServerError(f"timed out waiting for {url} ({type(exc).__name__})")
    return ServerError(f"request to {url} failed: {type(exc).__name__}: {exc}")


def _root_cause(exc: BaseException) -> str:
    """ "Connection refused" rather than asyncio's "All connection attempts failed": the OS error beneath."""
    import os

    reason = str(exc) or type(exc).__name__
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, OSError) and cause.errno:
            reason = os.strerror(cause.errno) if cause.errno > 0 else str(cause.strerror or cause)
        cause = cause.__cause__ or cause.__context__
    return reason


async def get_json(client: Any, url: str, api_key: str | None) -> Any:
    """GET ``url`` and decode its JSON body, raising :class:`ServerError` on any failure."""
    import httpx

    try:
        response = await client.get(url, headers=auth_headers(api_key))
    except httpx.HTTPError as exc:
        raise _transport_error(url, exc) from None
    if response.status_code != 200:
        raise _http_error(url, response.status_code, response.content)
    try:
        return response.json()
    except ValueError:
        raise ServerError(f"{url} did not answer with JSON") from None


# a server still loading its model answers 503: a client waits this long for it, as `ollama run` does
READY_WAIT_S = 300.0
# the words of llmp serve's 503 while it starts (not while it shuts down, nor a proxy's without a backend)
STARTING = ("still loading", "is starting", "warming up")


async def served_models(client: Any, models_url: str, api_key: str | None, wait_s: float = READY_WAIT_S) -> list[str]:
    """The model ids the server lists at ``GET /v1/models``, in its order (the first is the default
    when none is named), once it is ready: a 503 saying the server is starting (loading, warming
    up) is asked again every half second for ``wait_s``, with one notice on stderr; any other
    failure at once; :class:`ServerError` when it lists none."""
    deadline, said = time.monotonic() + wait_s, False
    while True:
        try:
            data = await get_json(client, models_url, api_key)
            break
        except ServerError as exc:
            starting = exc.status == 503 and any(words in str(exc) for words in STARTING)
            if not starting or time.monotonic() >= deadline:
                raise
            if not said:
                print(f"llmp: the server is not ready ({exc}); waiting for it", file=sys.stderr)
                said = True
            await asyncio.sleep(0.5)
    models = data.get("data") if isinstance(data, dict) else None
    ids = [str(m["id"]) for m in models or () if isinstance(m, dict) and "id" in m]
    if not ids:
        raise ServerError(f"{models_url} lists no models")
    return ids


async def stream_chunks(
    client: Any, url: str, payload: dict[str, Any], api_key: str | None
) -> AsyncIterator[dict[str, Any]]:
    """POST ``payload`` with ``stream: true`` and yield each ``data: {...}`` event until ``data: [DONE]``.

    An error status, an error event, or a stream that ends without ``[DONE]``
    raises :class:`ServerError`.
    """
    import httpx

    try:
        async with client.stream("POST", url, json=payload, headers=auth_headers(api_key)) as response:
            if response.status_code != 200:
                raise _http_error(url, response.status_code, await response.aread())
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue  # blank separators, ": keep-alive" comments, "event:" fields
                data = line[5:].strip()
                if data == "[DONE]":
                    return
                chunk = _decode_event(url, data)
                if "error" in chunk:  # servers report failures met mid-stream as an error event
                    raise ServerError(f"error from {url}: {_error_detail(data.encode())}")
                yield chunk
    except httpx.HTTPError as exc:
        raise _transport_error(url, exc) from None
    raise ServerError(f"the stream from {url} ended before data: [DONE]")


def _decode_event(url: str, data: str) -> dict[str, Any]:
    try:
        chunk = json.loads(data)
    except ValueError:
        raise ServerError(f"{url} sent an event that is not JSON: {data[:100]}") from None
    if not isinstance(chunk, dict):
        raise ServerError(f"{url} sent an event that is not a JSON object: {data[:100]}")
    return chunk


def chunk_text(chunk: dict[str, Any]) -> str:
    """The text a streamed chunk adds: ``choices[0].delta.content`` (chat) or ``choices[0].text`` (completions)."""
    choices = chunk.get("choices") or []
    if not choices:
        return ""  # e.g. the final usage chunk of stream_options.include_usage
    choice = choices[0]
    delta = choice.get("delta")
    text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
    return text or ""
