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


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None) -> dict[str, Any]:
    """OpenAI's usage object; with ``cached_tokens`` (``--enable-prompt-tokens-details``) its
    ``prompt_tokens_details``: the prompt tokens read from the prefix cache."""
    counted: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if cached_tokens is not None:
        counted["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return counted


def stream_usage(options: Any, force: bool) -> tuple[bool, bool]:
    """``(include_usage, continuous)`` of a stream's ``stream_options``: usage at the end, and on every
    chunk; as vLLM, ``continuous_usage_stats`` only adds to ``include_usage``, and
    ``--enable-force-include-usage`` (``force``) turns both on."""
    include = force or bool(options and options.include_usage)
    return include, force or bool(include and options.continuous_usage_stats)
