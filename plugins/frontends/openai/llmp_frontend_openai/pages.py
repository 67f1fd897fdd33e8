"""OpenAI's cursor pages (``after``, ``limit``, ``has_more``): files, batches, a response's input items."""

from __future__ import annotations

from typing import Any

from llmp.frontend import bad_request


def cursor_page(items: list[dict[str, Any]], after: str | None, limit: int, param: str) -> dict[str, Any]:
    """A cursor page, as OpenAI's lists: the items after the one with id ``after``."""
    if after is not None:
        ids = [item["id"] for item in items]
        if after not in ids:
            raise bad_request(f"after {after!r} is not an id in this list", param)
        items = items[ids.index(after) + 1 :]
    page = items[:limit]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": len(items) > limit,
    }
