"""What an HTTP front-end's handlers share with the server: the request's id, and the client's departure."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from starlette.requests import Request

T = TypeVar("T")


def request_id_of(request: Request) -> str:
    """The request's ``X-Request-Id`` (the client's, or the one the server made up), as the response carries it."""
    return request.scope.get("state", {}).get("request_id") or uuid.uuid4().hex


async def until_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await ``work``, cancelling it if the client goes away (which aborts its engine requests)."""
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
        raise asyncio.CancelledError("the client disconnected")
    return task.result()
