"""Incremental detokenization and stop strings.

Text is produced the way a full decode would produce it: each new token is
decoded together with a few tokens before it, and only the text past what
those tokens already gave is emitted. A token that ends inside a multi-byte
character ("\\ufffd") emits nothing until the character completes. So the
pieces concatenate to ``decode(prompt + output)`` minus ``decode(prompt)``,
for byte-level BPE and SentencePiece tokenizers alike.
"""

from __future__ import annotations

from typing import Any

CONTEXT_TOKENS = 5  # prompt tokens decoded with the first output token


class IncrementalDetokenizer:
    """``spaces_between_special_tokens=False`` (with special tokens kept) writes an added token that
    follows another as its bare content, as vLLM's fast detokenizer does, so no decoder-made space
    comes between them."""

    def __init__(
        self,
        tokenizer: Any,
        prompt_token_ids: list[int],
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
    ) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.special_ids = set(tokenizer.all_special_ids) if skip_special_tokens else set()
        self.added_tokens: dict[int, str] = {}
        if not (skip_special_tokens or spaces_between_special_tokens):
            self.added_tokens = {i: t.content for i, t in tokenizer.added_tokens_decoder.items()}
        self.last_added = False
        context = [t for t in prompt_token_ids[-(CONTEXT_TOKENS + 2) :] if t not in self.special_ids]
        # ids past the tokenizer's vocabulary (padded embedding rows) have no token: skip them
        self.tokens: list[str] = [t for t in tokenizer.convert_ids_to_tokens(context) if t is not None]
        self.read_offset = len(self.tokens)
        self.prefix_offset = self._clean_start(max(len(self.tokens) - CONTEXT_TOKENS, 0))
        self.text = ""

    def add_token(self, token_id: int) -> str:
        """Decode one more token; return the text it completes (possibly empty)."""
        if token_id in self.special_ids:
            return ""
        token = self.tokenizer.convert_ids_to_tokens([token_id])
        if not token or token[0] is None:  # an id past the tokenizer's vocabulary (padded embedding rows)
            return ""
        self.tokens.extend(token)
        prefix_text = self._to_string(self.tokens[self.prefix_offset : self.read_offset])
        new_text = self._to_string(self.tokens[self.prefix_offset :])
        if len(new_text) <= len(prefix_text) or new_text.endswith("\ufffd"):
            return ""
        delta = new_text[len(prefix_text) :]
        self.prefix_offset, self.read_offset = self.read_offset, len(self.tokens)
        if self.added_tokens:
            added = token_id in self.added_tokens
            if added and self.last_added:
                delta = self.added_tokens[token_id]
            self.last_added = added
        self.text += delta
        return delta

    def flush(self) -> str:
        """At the end of the sequence: the text still held back (an incomplete
        character decodes to U+FFFD, as a full decode gives it)."""
        prefix_text = self._to_string(self.tokens[self.prefix_offset : self.read_offset])
        new_text = self._to_string(self.tokens[self.prefix_offset :])
        delta = new_text[len(prefix_text) :] if len(new_text) > len(prefix_text) else ""
        self.prefix_offset = self.read_offset = len(self.tokens)
        self.text += delta
        return delta

    def _clean_start(self, start: int) -> int:
        """The first context token, from ``start`` on, where the prompt's tail decodes without U+FFFD.

        A window that begins inside a multi-byte character decodes those bytes as U+FFFD, and a
        byte-fallback decoder then spoils the whole run of byte tokens after them, so the character
        the output completes would never show."""
        for index in range(start, self.read_offset):
            if "\ufffd" not in self._to_string(self.tokens[index : self.read_offset]):
                return index
        return start

    def _to_string(self, tokens: list[str]) -> str:
        return self.tokenizer.convert_tokens_to_string(tokens)


def find_stop_string(text: str, new_chars: int, stops: list[str], include: bool) -> tuple[str, int] | None:
    """The stop string that ``text``'s last ``new_chars`` characters complete earliest,
    and the length to cut ``text`` to (past the stop string when ``include``)."""
    best: tuple[str, int] | None = None
    for stop in stops:
        index = text.find(stop, max(len(text) - new_chars - len(stop) + 1, 0))
        if index != -1 and (best is None or index < best[1]):
            best = (stop, index)
    if best is None:
        return None
    return best[0], best[1] + len(best[0]) if include else best[1]
