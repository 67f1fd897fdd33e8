"""Loading a model's tokenizer quickly and lightly.

A directory whose ``tokenizer.json`` is the whole tokenizer (its ``tokenizer_config.json`` names the
generic class and only says what :class:`Tokenizer` reproduces) loads as a :class:`Tokenizer`: Hugging
Face ``tokenizers`` alone, without transformers. The engine only encodes, decodes and looks up tokens, and
transformers' modules and wrapper cost as much memory as the tokenizer itself (the default model: 28 MB of
its 40). Everything else a tokenizer does (chat templates, ``__call__``, padding) is transformers' own,
loaded on first use. Any other directory loads through transformers, as ``AutoTokenizer`` would.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

log = logging.getLogger("llmp.tokenizer")
# one thread imports transformers and loads a tokenizer at a time: transformers' lazy module is not
# thread-safe on first import (a second thread gets "cannot import name ...")
_LOADING = threading.Lock()

GENERIC_TOKENIZER_CLASSES = frozenset({"PreTrainedTokenizerFast", "TokenizersBackend"})
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
EXTRA_SPECIAL_TOKEN_KEYS = ("extra_special_tokens", "additional_special_tokens")
MISTRAL_MODEL_TYPES = ("mistral", "mixtral", "ministral", "pixtral")  # transformers patches their regex
READ_ONLY = (
    "llmp's Tokenizer is read-only (its vocabulary is the engine's); its transformers_tokenizer attribute is "
    "transformers' tokenizer of the same directory, a copy that can be changed"
)
# tokenizer_config.json keys that change nothing Tokenizer does itself (how transformers pads, truncates,
# renders chats or was saved); a key outside these and the special tokens' is transformers' to read
INERT_CONFIG_KEYS = frozenset(
    {
        "tokenizer_class",
        "backend",
        "is_local",
        "local_files_only",
        "model_max_length",
        "model_input_names",
        "padding_side",
        "truncation_side",
        "chat_template",
        "added_tokens_decoder",
        "clean_up_tokenization_spaces",
        "split_special_tokens",
        "name_or_path",
        "auto_map",
        "processor_class",
        "use_default_system_prompt",
        "spaces_between_special_tokens",
    }
)


def load_tokenizer(path: str | os.PathLike, light: bool = True) -> Any:
    """The tokenizer of a model directory: a :class:`Tokenizer` where it gives what transformers' tokenizer
    would (unless ``light`` is False: a process that renders chat templates needs transformers' anyway),
    else transformers' (``PreTrainedTokenizerFast`` for the generic class, without the seconds of
    ``AutoTokenizer``'s configuration machinery; ``AutoTokenizer`` for any other)."""
    with _LOADING:
        return _load(Path(path), light)


def _load(path: Path, light: bool) -> Any:
    try:
        config = json.loads((path / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        config = {}
    declared = config.get("tokenizer_class")
    if declared in GENERIC_TOKENIZER_CLASSES and (path / "tokenizer.json").is_file():
        tokenizer = Tokenizer.load(path, config) if light else None
        if tokenizer is not None:
            return tokenizer
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(path)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def transformers_tokenizer(tokenizer: Any) -> Any:
    """transformers' tokenizer of ``tokenizer`` (itself where it already is one): for a library that checks
    for transformers' classes (xgrammar, a user's code)."""
    return tokenizer.transformers_tokenizer if isinstance(tokenizer, Tokenizer) else tokenizer


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string, or an AddedToken's dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


class Tokenizer:
    """A ``tokenizer.json`` read by Hugging Face ``tokenizers`` alone, answering as transformers'
    ``PreTrainedTokenizerFast`` of the same directory: ``encode``, ``decode``, ``convert_ids_to_tokens``,
    ``convert_tokens_to_ids``, ``convert_tokens_to_string``, ``get_vocab``, the special tokens and their ids,
    ``added_tokens_decoder``, ``len()`` (tested against transformers, token for token). Any other attribute,
    and calling it, is transformers' tokenizer's (:attr:`transformers_tokenizer`, loaded on first use). It is
    read-only: ``add_tokens`` would change transformers' copy, not the vocabulary the engine encodes with."""

    is_fast = True

    def __init__(self, path: Path, backend: Any, special_tokens: dict[str, str], extra_special_tokens: list[str]):
        self.name_or_path = str(path)
        self.backend_tokenizer = backend
        self._special_tokens = special_tokens  # bos_token ... mask_token: the ones the config names
        self._extra_special_tokens = extra_special_tokens
        self._transformers: Any = None
        # the order transformers gives: named tokens, then extra ones, each once
        self.all_special_tokens = list(dict.fromkeys([*special_tokens.values(), *extra_special_tokens]))
        self.all_special_ids = [self.convert_tokens_to_ids(token) for token in self.all_special_tokens]

    @classmethod
    def load(cls, path: Path, config: dict[str, Any]) -> Tokenizer | None:
        """The directory's Tokenizer, or None where transformers would give something else: a config key
        it does not reproduce, a special_tokens_map.json, a special token missing from ``tokenizer.json``
        (transformers adds it), decoded text cleaned up (not for BPE), no
        post-processor (transformers writes one), or a large Mistral vocabulary (transformers patches its
        pre-tokenizer)."""
        special_keys = {*SPECIAL_TOKEN_NAMES, *EXTRA_SPECIAL_TOKEN_KEYS}
        unknown = set(config) - INERT_CONFIG_KEYS - special_keys
        if unknown:
            log.debug("tokenizer %s: transformers' (config keys %s)", path, sorted(unknown))
            return None
        if config.get("split_special_tokens") or (path / "special_tokens_map.json").exists():
            return None
        from tokenizers import Tokenizer as Backend

        backend = Backend.from_file(str(path / "tokenizer.json"))
        if config.get("clean_up_tokenization_spaces") and type(backend.model).__name__ != "BPE":
            return None  # transformers cleans up what others decode (it skips BPE's: it would corrupt them)
        special = {name: text for name in SPECIAL_TOKEN_NAMES if (text := _token_text(config.get(name)))}
        extra: list[str] = []
        for key in EXTRA_SPECIAL_TOKEN_KEYS:
            value = config.get(key) or []
            items = value.values() if isinstance(value, dict) else value
            extra += [text for item in items if (text := _token_text(item))]
        added = {token.content for token in backend.get_added_tokens_decoder().values() if token.special}
        if any(text not in added for text in [*special.values(), *extra]):
            return None
        if backend.post_processor is None or _patched_by_transformers(path, backend):
            return None
        # transformers encodes without truncation or padding unless a call asks for them
        backend.no_truncation()
        backend.no_padding()
        return cls(path, backend, special, extra)

    # -- what the engine uses, as transformers gives it ------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = True, **kwargs: Any) -> list[int]:
        if kwargs or not isinstance(text, str):  # truncation, a text pair, tensors, pre-split words ...
            return self.transformers_tokenizer.encode(text, add_special_tokens=add_special_tokens, **kwargs)
        return self.backend_tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, token_ids: Any, skip_special_tokens: bool = False, **kwargs: Any) -> str | list[str]:
        if kwargs.pop("clean_up_tokenization_spaces", None) or kwargs:
            return self.transformers_tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens, **kwargs)
        if hasattr(token_ids, "tolist"):  # a tensor or an array
            token_ids = token_ids.tolist()
        if isinstance(token_ids, int):
            token_ids = [token_ids]
        if token_ids and isinstance(token_ids[0], list | tuple):
            return [self.decode(list(ids), skip_special_tokens=skip_special_tokens) for ids in token_ids]
        return self.backend_tokenizer.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def batch_decode(self, sequences: Any, skip_special_tokens: bool = False, **kwargs: Any) -> list[str]:
        if hasattr(sequences, "tolist"):
            sequences = sequences.tolist()
        return [self.decode(ids, skip_special_tokens=skip_special_tokens, **kwargs) for ids in sequences]

    def convert_ids_to_tokens(self, ids: int | Iterable[int], skip_special_tokens: bool = False) -> Any:
        if isinstance(ids, int):
            return self.backend_tokenizer.id_to_token(ids)
        skip = set(self.all_special_ids) if skip_special_tokens else ()
        return [self.backend_tokenizer.id_to_token(int(i)) for i in ids if int(i) not in skip]

    def convert_tokens_to_ids(self, tokens: str | Iterable[str]) -> Any:
        if isinstance(tokens, str):
            found = self.backend_tokenizer.token_to_id(tokens)
            return self.unk_token_id if found is None else found
        return [self.convert_tokens_to_ids(token) for token in tokens]

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        decoder = self.backend_tokenizer.decoder
        return decoder.decode(tokens) if decoder is not None else " ".join(tokens)

    def tokenize(self, text: str, add_special_tokens: bool = False, **kwargs: Any) -> list[str]:
        if kwargs:
            return self.transformers_tokenizer.tokenize(text, add_special_tokens=add_special_tokens, **kwargs)
        return self.backend_tokenizer.encode(text, add_special_tokens=add_special_tokens).tokens

    def num_special_tokens_to_add(self, pair: bool = False) -> int:
        return self.backend_tokenizer.num_special_tokens_to_add(pair)

    def get_vocab(self) -> dict[str, int]:
        return self.backend_tokenizer.get_vocab(with_added_tokens=True)

    @property
    def vocab_size(self) -> int:
        """The base vocabulary's size, without the added tokens (as transformers')."""
        return self.backend_tokenizer.get_vocab_size(with_added_tokens=False)

    def __len__(self) -> int:
        return self.backend_tokenizer.get_vocab_size(with_added_tokens=True)

    @property
    def added_tokens_decoder(self) -> dict[int, Any]:
        return self.backend_tokenizer.get_added_tokens_decoder()

    def _special_token(self, name: str) -> str | None:
        return self._special_tokens.get(name)

    def _special_id(self, name: str) -> int | None:
        token = self._special_tokens.get(name)
        return None if token is None else self.convert_tokens_to_ids(token)

    bos_token = property(lambda self: self._special_token("bos_token"))
    eos_token = property(lambda self: self._special_token("eos_token"))
    unk_token = property(lambda self: self._special_token("unk_token"))
    sep_token = property(lambda self: self._special_token("sep_token"))
    pad_token = property(lambda self: self._special_token("pad_token"))
    cls_token = property(lambda self: self._special_token("cls_token"))
    mask_token = property(lambda self: self._special_token("mask_token"))
    bos_token_id = property(lambda self: self._special_id("bos_token"))
    eos_token_id = property(lambda self: self._special_id("eos_token"))
    pad_token_id = property(lambda self: self._special_id("pad_token"))
    sep_token_id = property(lambda self: self._special_id("sep_token"))
    cls_token_id = property(lambda self: self._special_id("cls_token"))
    mask_token_id = property(lambda self: self._special_id("mask_token"))

    @property
    def unk_token_id(self) -> int | None:
        token = self._special_tokens.get("unk_token")
        return None if token is None else self.backend_tokenizer.token_to_id(token)

    def add_tokens(self, *args: Any, **kwargs: Any) -> int:
        raise TypeError(READ_ONLY)

    def add_special_tokens(self, *args: Any, **kwargs: Any) -> int:
        raise TypeError(READ_ONLY)

    # -- the rest: transformers' tokenizer ------------------------------------------------------------

    @property
    def transformers_tokenizer(self) -> Any:
        """transformers' ``PreTrainedTokenizerFast`` of the same directory, loaded on first use."""
        if self._transformers is None:
            with _LOADING:
                if self._transformers is None:
                    from transformers import PreTrainedTokenizerFast

                    log.debug("tokenizer %s: loading transformers' tokenizer", self.name_or_path)
                    self._transformers = PreTrainedTokenizerFast.from_pretrained(self.name_or_path)
        return self._transformers

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_transformers", "_special_tokens", "backend_tokenizer"):
            raise AttributeError(name)  # not while unpickling or copying, before __init__'s attributes exist
        return getattr(self.transformers_tokenizer, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.transformers_tokenizer(*args, **kwargs)

    def __repr__(self) -> str:
        return f"Tokenizer({self.name_or_path!r}, vocabulary {len(self)})"


def _patched_by_transformers(path: Path, backend: Any) -> bool:
    """Whether transformers would rewrite this tokenizer's pre-tokenizer (it patches the regex of the large
    vocabularies of local Mistral models)."""
    if backend.get_vocab_size() <= 100000:
        return False
    try:
        model_type = json.loads((path / "config.json").read_text()).get("model_type", "")
    except (OSError, ValueError):
        return False
    return any(kind in str(model_type) for kind in MISTRAL_MODEL_TYPES)
