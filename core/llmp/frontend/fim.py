"""Fill in the middle: a code model's prompt for the text between a prefix and a suffix (OpenAI's
completions ``suffix``, Ollama's ``/api/generate`` ``suffix``), in the special tokens its vocabulary
has. The families below cover the open code models people run for editor completion."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class FimStyle:
    """A model family's fill-in-the-middle tokens: ``prefix`` and ``suffix`` open their texts, and
    ``middle`` (where it has one) asks for the text between; ``suffix_first`` puts the suffix first."""

    prefix: str
    suffix: str
    middle: str | None = None
    suffix_first: bool = False


FIM_STYLES = (
    FimStyle("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),  # Qwen2.5-Coder, Qwen3-Coder
    FimStyle("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),  # StarCoder, StarCoder2, Granite Code
    FimStyle("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),  # DeepSeek-Coder  # noqa: RUF001
    FimStyle("[PREFIX]", "[SUFFIX]", None, suffix_first=True),  # Codestral: [SUFFIX] suffix [PREFIX] prefix
)


def fim_style(tokenizer: Any) -> FimStyle | None:
    """The style whose tokens are all single tokens of ``tokenizer``'s vocabulary, or None."""
    for style in FIM_STYLES:
        tokens = [t for t in (style.prefix, style.suffix, style.middle) if t is not None]
        if all(_token_id(tokenizer, token) is not None for token in tokens):
            return style
    return None


def fim_token_ids(tokenizer: Any, style: FimStyle, prefix: list[int], suffix: list[int]) -> list[int]:
    """The prompt's ids from the prefix's and the suffix's own (encoded without special tokens)."""
    p, s = _token_id(tokenizer, style.prefix), _token_id(tokenizer, style.suffix)
    if style.suffix_first:
        ids = [s, *suffix, p, *prefix]
    else:
        ids = [p, *prefix, s, *suffix]
    if style.middle is not None:
        ids.append(_token_id(tokenizer, style.middle))
    return ids


def _token_id(tokenizer: Any, token: str) -> int | None:
    token_id = tokenizer.convert_tokens_to_ids(token)
    if not isinstance(token_id, int) or tokenizer.convert_ids_to_tokens(token_id) != token:
        return None  # the unknown token's id, or none
    return token_id
