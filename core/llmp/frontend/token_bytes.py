"""The raw bytes of a token: the ``bytes`` of OpenAI's and Ollama's logprobs."""

from __future__ import annotations

from typing import Any


class TokenBytes:
    """The raw bytes of a token, which may hold part of a character (OpenAI's and Ollama's ``bytes``),
    as a list of ints; ``TokenBytes(tokenizer)(token_id)``, cached per token.

    Byte-level BPE vocabularies spell bytes with GPT-2's printable alphabet;
    SentencePiece ones have ``<0xNN>`` byte tokens and ``▁`` for spaces.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self.byte_level = backend is not None and "ByteLevel" in f"{backend.decoder!r}{backend.pre_tokenizer!r}"
        self.alphabet = {ch: b for b, ch in _gpt2_alphabet().items()}
        self.cache: dict[int, list[int]] = {}

    def __call__(self, token_id: int) -> list[int]:
        cached = self.cache.get(token_id)
        if cached is None:
            cached = self.cache[token_id] = list(self._bytes(token_id))
        return cached

    def _bytes(self, token_id: int) -> bytes:
        piece = self.tokenizer.convert_ids_to_tokens(token_id)
        if piece is None:
            return b""
        if self.byte_level and all(ch in self.alphabet for ch in piece):
            return bytes(self.alphabet[ch] for ch in piece)
        if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            return bytes([int(piece[3:5], 16)])
        return piece.replace("\u2581", " ").encode()


def _gpt2_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character table."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    for extra, b in enumerate(b for b in range(256) if b not in table):
        table[b] = chr(256 + extra)
    return table
