"""What an HTTP front-end's handlers share with the server: the request's id, and the client's departure."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, TypeVar

from llmp.frontend.errors import APIError

if TYPE_CHECKING:
    from starlette.requests import Request

T = TypeVar("T")
# what the HTTP request being handled carried (the server's middleware sets it): the engine requests a
# handler makes are logged and traced with it
current_http: ContextVar[Mapping[str, Any] | None] = ContextVar("llmp_current_http", default=None)


@contextmanager
def handling(method: str, path: str, request_id: str, **details: Any) -> Iterator[None]:
    """Within the block, engine requests are logged and traced as made for this request, as the
    server's middleware does for requests from clients: for a front-end that calls its own
    handlers (a batch job's lines). ``details`` name where it came from (``batch``, ``line``), and
    the request log shows them beside the route."""
    token = current_http.set({"method": method, "path": path, "request_id": request_id, **details})
    try:
        yield
    finally:
        current_http.reset(token)


def request_id_of(request: Request) -> str:
    """The request's ``X-Request-Id`` (the client's, or the one the server made up), as the response carries it."""
    return request.scope.get("state", {}).get("request_id") or uuid.uuid4().hex


# nginx's status for a request its client closed; never delivered, as no one is there to read it
CLIENT_CLOSED_REQUEST = 499


async def until_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await ``work``, cancelling it if the client goes away (which aborts its engine requests).
    The client's departure then ends the handler with a quiet 499 (an ``APIError``): an expected
    event, not a failure with a traceback in the server's log."""
    task = asyncio.ensure_future(work)

    async def watch() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return

    watcher = asyncio.ensure_future(watch())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if not task.done():
        task.cancel()
        raise APIError(CLIENT_CLOSED_REQUEST, "the client closed the request", type="client_closed_request")
    return task.result()
