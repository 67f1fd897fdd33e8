"""Logprobs in the shapes of the chat and the completions APIs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

FLOOR = -9999.0  # JSON has no -inf


def _value(logprob: float) -> float:
    return max(logprob, FLOOR)


def _token(token_id: int, text: str | None, as_ids: bool) -> str:
    return f"token_id:{token_id}" if as_ids else (text or "")


def chat_logprobs(
    token_ids: Sequence[int], entries: Sequence[dict], top: int, as_ids: bool, token_bytes: Callable[[int], list[int]]
) -> dict[str, Any]:
    content = []
    for token_id, entry in zip(token_ids, entries, strict=False):
        chosen = entry[token_id]
        ranked = sorted(
            (e for e in entry.items() if e[1].rank is not None and e[1].rank <= top), key=lambda e: e[1].rank
        )
        content.append(
            {
                "token": _token(token_id, chosen.decoded_token, as_ids),
                "logprob": _value(chosen.logprob),
                "bytes": token_bytes(token_id),
                "top_logprobs": [
                    {
                        "token": _token(i, lp.decoded_token, as_ids),
                        "logprob": _value(lp.logprob),
                        "bytes": token_bytes(i),
                    }
                    for i, lp in ranked
                ],
            }
        )
    return {"content": content}


def completion_logprobs(
    token_ids: Sequence[int],
    entries: Sequence[dict | None],
    top: int,
    as_ids: bool,
    decode: Callable[[int], str],
    text_offset: int = 0,
) -> dict[str, Any]:
    """``{tokens, token_logprobs, top_logprobs, text_offset}``; an entry of None (the first prompt token
    when echoing) gives null logprobs, and its text from ``decode``."""
    tokens, values, tops, offsets = [], [], [], []
    offset = text_offset
    for token_id, entry in zip(token_ids, entries, strict=False):
        chosen = entry.get(token_id) if entry else None
        text = _token(token_id, chosen.decoded_token if chosen else decode(token_id), as_ids)
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
        if entry is None:
            values.append(None)
            tops.append(None)
            continue
        values.append(_value(chosen.logprob))
        # the sampled token and the top ``top``: up to top + 1 entries, as vLLM and OpenAI give
        tops.append(
            {
                _token(i, lp.decoded_token, as_ids): _value(lp.logprob)
                for i, lp in entry.items()
                if i == token_id or (lp.rank is not None and lp.rank <= top)
            }
        )
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}


def prompt_logprobs(entries: Sequence[dict | None] | None) -> list[Any] | None:
    if entries is None:
        return None
    return [
        None
        if entry is None
        else {
            str(i): {"logprob": _value(lp.logprob), "rank": lp.rank, "decoded_token": lp.decoded_token}
            for i, lp in entry.items()
        }
        for entry in entries
    ]
