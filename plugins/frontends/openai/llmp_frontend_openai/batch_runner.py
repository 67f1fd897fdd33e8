"""One batch line through the same handler as the interactive route: no HTTP loop-back, so the
line's answer is what ``POST <url>`` would have answered, in an output line
``{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error": null}``."""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import typing
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError

from llmp.frontend import APIError, as_api_error, bad_request, handling, validation_message
from llmp_frontend_openai.batch_lines import BATCH_URLS, BatchLine

log = logging.getLogger("llmp.frontend.openai.batch")

INT64_MAX = 2**63 - 1
# under --scheduling-policy priority a batch line ranks behind interactive requests (lower value first)
BATCH_PRIORITY_OFFSET = 1 << 30


@dataclass(frozen=True)
class Handler:
    endpoint: Callable[..., Any]
    body_model: type[BaseModel]
    body_param: str
    request_param: str | None


@dataclass(frozen=True)
class LineResult:
    record: dict[str, Any]  # the output line
    status: int

    @property
    def ok(self) -> bool:
        return self.status == 200

    @property
    def aborted(self) -> bool:
        """The engine stopped the request (a shutdown past its grace): not an answer to keep."""
        body = self.record["response"]["body"] or {}
        return any((choice or {}).get("finish_reason") == "abort" for choice in body.get("choices") or ())


class LineRunner:
    """Answers batch lines with the front-end's own route handlers (those of ``router``)."""

    def __init__(self, router: APIRouter, *, priority_offset: int = 0) -> None:
        self.router = router
        self.priority_offset = priority_offset
        self._handlers: dict[str, Handler] | None = None

    @property
    def handlers(self) -> dict[str, Handler]:
        if self._handlers is None:  # read once every route is on the router
            self._handlers = {}
            for route in self.router.routes:
                if isinstance(route, APIRoute) and route.path in BATCH_URLS and "POST" in route.methods:
                    self._handlers[route.path] = _handler(route.endpoint)
        return self._handlers

    @property
    def urls(self) -> tuple[str, ...]:
        return tuple(url for url in BATCH_URLS if url in self.handlers)

    async def answer(self, line: BatchLine, batch_id: str | None = None) -> LineResult:
        """The line's output record; with ``batch_id`` (a job of the server's), its engine requests are
        logged and traced as the line of that batch (``--enable-log-requests``), under its ``request_id``."""
        request_id = uuid.uuid4().hex
        try:
            with handling("POST", line.url, request_id, batch=batch_id, line=line.custom_id):
                status, body = 200, await self._call(line, request_id)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            error = as_api_error(exc)
            if error.status >= 500 and error.status != 503:  # 503: busy, sleeping or stopping; run again later
                log.error("batch line %s (%s) failed", line.custom_id, line.url, exc_info=exc)
            status, body = error.status, error.body()
        record = {
            "id": f"batch_req_{uuid.uuid4().hex}",
            "custom_id": line.custom_id,
            "response": {"status_code": status, "request_id": request_id, "body": body},
            "error": None,
        }
        return LineResult(record, status)

    async def _call(self, line: BatchLine, request_id: str) -> Any:
        handler = self.handlers.get(line.url)
        if handler is None:
            raise bad_request(f"this model does not serve {line.url}; it serves {', '.join(self.urls)}", "url")
        if line.body.get("stream"):
            raise bad_request("stream is not supported in a batch: each line's answer is written whole", "stream")
        try:
            body = handler.body_model.model_validate(line.body)
        except ValidationError as exc:
            message, param = validation_message(list(exc.errors()))
            raise APIError(400, message, param=param) from None
        if self.priority_offset and hasattr(body, "priority"):
            body.priority = min(body.priority + self.priority_offset, INT64_MAX)
        arguments: dict[str, Any] = {handler.body_param: body}
        if handler.request_param is not None:
            arguments[handler.request_param] = _line_request(line.url, request_id)
        result = await handler.endpoint(**arguments)
        status = getattr(result, "status_code", 200)
        payload = json.loads(result.body) if hasattr(result, "body") else result
        if status != 200:  # a handler's own error response, not raised
            raise APIError(status, str((payload.get("error") or {}).get("message") or payload))
        return payload


def _handler(endpoint: Callable[..., Any]) -> Handler:
    """How to call a route's handler: its body parameter (a pydantic model) and its request one."""
    hints = typing.get_type_hints(endpoint)
    body_param = request_param = None
    model = None
    for name in inspect.signature(endpoint).parameters:
        hint = hints.get(name)
        if isinstance(hint, type) and issubclass(hint, BaseModel):
            body_param, model = name, hint
        elif hint is Request:
            request_param = name
    if body_param is None or model is None:
        raise TypeError(f"the route handler {endpoint.__qualname__} takes no request body model")
    return Handler(endpoint, model, body_param, request_param)


def _line_request(url: str, request_id: str) -> Request:
    """The request a handler sees for a batch line: its path and id, and a client that never leaves
    (cancelling the line's task is how a batch stops it)."""
    scope = {
        "type": "http",
        "method": "POST",
        "path": url,
        "raw_path": url.encode(),
        "query_string": b"",
        "headers": [],
        "state": {"request_id": request_id},
    }
    never = asyncio.Event()

    async def receive() -> dict[str, Any]:
        await never.wait()
        return {"type": "http.disconnect"}

    return Request(scope, receive)
