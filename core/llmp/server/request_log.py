"""Request logs (``--enable-log-requests``): a line when the engine takes a request, a line with its outcome.

The lines go to the ``llmp.requests`` logger, in vLLM's words where it has some (``Received request
ID: ...``). Prompts are cut to ``--max-log-len`` characters and token ids; headers are never logged,
so neither is the API key. Requests refused before they reach the engine (a 401, a 413, a 429, a
400 from the front-end's checks) get their outcome line from :class:`RefusalLogMiddleware`.
"""

from __future__ import annotations

import json
import logging
import re
from contextvars import ContextVar
from typing import Any
from urllib.parse import unquote_plus

from llmp.server.metrics import RequestRecord

log = logging.getLogger("llmp.requests")
MAX_ERROR_CHARS = 500  # an error message in an outcome line: enough to say what was wrong
MAX_ERROR_BODY = 16384  # bytes of an error response read for its message
UNLOGGED_PATHS = frozenset({"/health", "/ready", "/live", "/ping", "/version", "/metrics", "/load"})  # probes, scrapes
OMITTED = "<omitted>"  # --max-log-len 0: said outright, so it never reads as an empty prompt
# query parameters whose value the access log never shows (?api_key=..., ?token=...)
SECRET_PARAM = re.compile(r"key|token|secret|passw|auth|credential|signature|session", re.IGNORECASE)
REDACTED = "REDACTED"


class _EngineRequests:
    """How many engine requests one HTTP request made: 0 means it was refused before the engine."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0


# set by RefusalLogMiddleware for each HTTP request; tasks the handler starts share the same counter
_engine_requests: ContextVar[_EngineRequests | None] = ContextVar("llmp_engine_requests", default=None)


class RequestLogger:
    """The request observer of ``--enable-log-requests`` (see ``llmp.server.metrics.RequestObserver``)."""

    def __init__(self, max_log_len: int | None) -> None:
        self.max_log_len = max_log_len

    def on_start(self, record: RequestRecord) -> None:
        counter = _engine_requests.get()
        if counter is not None:
            counter.count += 1
        if not log.isEnabledFor(logging.INFO):
            return
        text, token_ids = _prompt_parts(record.prompt)
        log.info(
            "Received request %s: route: %s, prompt: %s, params: %s, prompt_token_ids: %s, lora_request: %s.",
            record.request_id,
            _route(record.http),
            _cut(text, self.max_log_len, repr),
            record.params,
            _cut(token_ids, self.max_log_len, str),
            record.lora,
        )

    def on_end(self, record: RequestRecord) -> None:
        if not log.isEnabledFor(logging.INFO):
            return
        duration = (record.end_time or record.start_time) - record.start_time
        if record.error is not None:
            log.info("Failed request %s: %s after %.3f s.", record.request_id, _error_text(record.error), duration)
            return
        output = record.output
        prompt_tokens = len(getattr(output, "prompt_token_ids", None) or ()) if output is not None else 0
        ttft = (
            f", time_to_first_token: {record.first_token_time - record.start_time:.3f} s"
            if record.first_token_time is not None
            else ""
        )
        log.info(
            "Finished request %s: finish_reason: %s, prompt_tokens: %d, generation_tokens: %d, duration: %.3f s%s.",
            record.request_id,
            record.finish_reason,
            prompt_tokens,
            record.generated_tokens,
            duration,
            ttft,
        )


class RefusalLogMiddleware:
    """Logs an outcome line for each HTTP request answered with an error before any engine request
    started (the gate's 401/413/429/503, a front-end's 400): those never reach the observers."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("path", "") in UNLOGGED_PATHS:
            return await self.app(scope, receive, send)
        counter = _EngineRequests()
        _engine_requests.set(counter)
        response: dict[str, Any] = {}

        async def watch(message: dict) -> None:
            if message["type"] == "http.response.start":
                response["status"] = message["status"]
                response["request_id"] = next(
                    (v.decode("latin-1") for k, v in message.get("headers", ()) if k.lower() == b"x-request-id"), ""
                )
            elif message["type"] == "http.response.body" and response.get("status", 200) >= 400:
                response["body"] = (response.get("body", b"") + message.get("body", b""))[:MAX_ERROR_BODY]
            await send(message)

        try:
            await self.app(scope, receive, watch)
        finally:
            status = response.get("status", 500)
            if status >= 400 and counter.count == 0 and log.isEnabledFor(logging.INFO):
                log.info(
                    "Refused request %s: route: %s %s, status: %d, error: %s.",
                    response.get("request_id") or "-",
                    scope.get("method", ""),
                    scope.get("path", ""),
                    status,
                    _body_message(response.get("body", b"")),
                )


class AccessLogRedaction(logging.Filter):
    """uvicorn's access log lines (``"POST /v1/completions?api_key=... HTTP/1.1" 200``) with the values
    of secret-looking query parameters replaced: a key sent in the URL is never written to the log."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        # uvicorn's access record: (client, method, path with query, HTTP version, status)
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str) and "?" in args[2]:
            record.args = (*args[:2], redact_query(args[2]), *args[3:])
        return True


def redact_query(path: str) -> str:
    """``path`` with the value of each query parameter named like a secret replaced by ``REDACTED``."""
    base, _, query = path.partition("?")
    if not query:
        return path
    parts = []
    for part in query.split("&"):
        name, eq, _value = part.partition("=")
        parts.append(f"{name}{eq}{REDACTED}" if eq and SECRET_PARAM.search(unquote_plus(name)) else part)
    return f"{base}?{'&'.join(parts)}"


def _cut(value: Any, max_len: int | None, show: Any) -> str:
    """A prompt's text or token ids for the log: cut to ``max_len``; ``<omitted>`` when that is 0."""
    if value is None:
        return "None"
    if max_len == 0:
        return OMITTED
    return show(value if max_len is None else value[:max_len])


def _route(http: Any) -> str:
    """``POST /v1/completions (X-Request-Id ID)``: the id ties the line to the response and the refusal lines."""
    if not http:
        return "-"
    where = f"{http.get('method', '')} {http.get('path', '')} (X-Request-Id {http.get('request_id', '-')})"
    if http.get("batch"):  # a batch job's line: the output file's request_id is the id above
        where += f" of batch {http['batch']}, line {http.get('line', '-')}"
    return where


def _prompt_parts(prompt: Any) -> tuple[str | None, list[int] | None]:
    """The text and token ids of whatever a front-end handed the engine (a ``Prompt``, a string, a dict)."""
    if isinstance(prompt, str):
        return prompt, None
    if isinstance(prompt, dict):
        text, ids = prompt.get("prompt"), prompt.get("prompt_token_ids")
    else:
        text, ids = getattr(prompt, "text", None), getattr(prompt, "token_ids", None)
    return (text if isinstance(text, str) else None), (list(ids) if ids is not None else None)


def _error_text(error: BaseException) -> str:
    status = getattr(error, "status", None)
    message = str(error)[:MAX_ERROR_CHARS]
    return f"{status} {type(error).__name__}: {message}" if status else f"{type(error).__name__}: {message}"


def _body_message(body: bytes) -> str:
    """The message of an error body (OpenAI's ``{"error": {"message"}}``, Ollama's ``{"error": "..."}``)."""
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return repr(body.decode("utf-8", "replace")[:MAX_ERROR_CHARS])
    message = error.get("message") if isinstance(error, dict) else error
    return repr(str(message)[:MAX_ERROR_CHARS])
