"""The prompt record every entry point hands the engine (``LLM``, ``AsyncLLM``, the
engine-process messages, ``LLMEngine``): what the caller gave, in one shape."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NotRequired, TypedDict


@dataclass(slots=True)
class Prompt:
    """One prompt: its text, its token ids, or both.

    With ``token_ids`` the engine runs them as given and reports ``text`` back as
    the output's ``prompt``; with ``text`` alone the engine tokenizes it, adding the
    tokenizer's special tokens (BOS) unless ``add_special_tokens`` is False (a chat
    template's output already holds them).

    ``token_type_ids`` (one per token id, with ``token_ids``) are the segment ids of a
    text pair for cross-encoders that take them (BERT); ``None`` means all zeros.

    ``cache_salt`` (vLLM's): a prompt shares prefix-cache blocks only with prompts of the
    same salt (none shares with none), so tenants given different salts cannot learn from
    timing what the others sent.
    """

    text: str | None = None
    token_ids: list[int] | None = None
    add_special_tokens: bool = True
    token_type_ids: list[int] | None = None
    cache_salt: str | None = None

    def __post_init__(self) -> None:
        if self.text is None and self.token_ids is None:
            raise TypeError("a prompt needs its text or its token ids")
        if self.cache_salt is not None and (not isinstance(self.cache_salt, str) or not self.cache_salt):
            raise TypeError("cache_salt must be a non-empty string")
        if self.token_type_ids is not None and (
            self.token_ids is None or len(self.token_type_ids) != len(self.token_ids)
        ):
            raise TypeError("token_type_ids need token_ids, one type per token")


class TextPrompt(TypedDict):
    """vLLM's prompt of text, as a dict: ``{"prompt": text}``."""

    prompt: str
    cache_salt: NotRequired[str]


class TokensPrompt(TypedDict):
    """vLLM's prompt of token ids, as a dict: ``{"prompt_token_ids": [...]}``."""

    prompt_token_ids: list[int]
    prompt: NotRequired[str]
    token_type_ids: NotRequired[list[int]]
    cache_salt: NotRequired[str]


PROMPT_KEYS = frozenset({"prompt", "prompt_token_ids", "token_type_ids", "cache_salt"})

PromptType = str | Mapping[str, Any] | Prompt
"""What a caller may pass as a prompt: text, ``{"prompt_token_ids": [...]}`` (optionally with
``"prompt"``, its text, and ``"token_type_ids"``), ``{"prompt": text}``, or a :class:`Prompt`;
either dict may hold ``"cache_salt"``."""


def as_prompt(prompt: PromptType) -> Prompt:
    """The :class:`Prompt` of any accepted form; ``TypeError`` for anything else, ``ValueError`` for a
    dict with a key no prompt has (vLLM's ``multi_modal_data``)."""
    if isinstance(prompt, Prompt):
        return prompt
    if isinstance(prompt, str):
        return Prompt(text=prompt)
    unknown = sorted(set(prompt).difference(PROMPT_KEYS)) if isinstance(prompt, Mapping) else []
    if unknown:  # vLLM's multi_modal_data and the like: refused, not dropped
        raise ValueError(
            f"a prompt dict takes {', '.join(sorted(PROMPT_KEYS))}; got {', '.join(map(repr, unknown))}"
            + (" (llmp serves text models)" if any(k.startswith(("multi_modal", "mm_")) for k in unknown) else "")
        )
    if isinstance(prompt, Mapping) and "prompt_token_ids" in prompt:
        types = prompt.get("token_type_ids")
        return Prompt(
            text=prompt.get("prompt"),
            token_ids=list(prompt["prompt_token_ids"]),
            token_type_ids=list(types) if types is not None else None,
            cache_salt=prompt.get("cache_salt"),
        )
    if isinstance(prompt, Mapping) and isinstance(prompt.get("prompt"), str):
        return Prompt(text=prompt["prompt"], cache_salt=prompt.get("cache_salt"))
    raise TypeError(f"a prompt is a string or a dict with 'prompt' or 'prompt_token_ids', got {type(prompt).__name__}")


def last_tokens(token_ids: Sequence[int], keep: int, text_ids: Sequence[int] | None = None) -> list[int]:
    """A prompt's ids cut to ``keep`` as vLLM cuts them: its tokenizer truncates text from the left
    and keeps the special tokens it put around the text (``[CLS] ... [SEP]``, a BOS), so the cut
    falls in the text's own ids (``text_ids``: the text tokenized without special tokens). Ids given
    as ids (``text_ids`` None), and a ``keep`` with no room beside the special tokens, keep the last
    ``keep`` ids as they are."""
    if len(token_ids) <= keep:
        return list(token_ids)
    if text_ids:
        head, tail = special_tokens_around(token_ids, text_ids)
        room = keep - len(head) - len(tail)
        if (head or tail) and room >= 1:
            return [*head, *text_ids[len(text_ids) - room :], *tail]
    return list(token_ids[len(token_ids) - keep :])


def special_tokens_around(token_ids: Sequence[int], text_ids: Sequence[int]) -> tuple[list[int], list[int]]:
    """The special tokens a tokenizer put before and after a text's own ids (both empty when the
    text's ids are not found whole in ``token_ids``)."""
    size = len(text_ids)
    for start in range(len(token_ids) - size + 1):
        if list(token_ids[start : start + size]) == list(text_ids):
            return list(token_ids[:start]), list(token_ids[start + size :])
    return [], []
