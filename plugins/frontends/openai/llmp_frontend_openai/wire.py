"""What the route modules write back besides their own shapes: server-sent events and the usage object."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from llmp.frontend import as_api_error, json_text

DONE = "data: [DONE]\n\n"


def sse(payload: Mapping[str, Any]) -> str:
    return f"data: {json_text(payload)}\n\n"


def sse_error(exc: BaseException) -> str:
    """An in-band error event: after the headers went out, the status can only travel in the stream."""
    return sse(as_api_error(exc).body())


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
