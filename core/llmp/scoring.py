"""Text-pair scoring, shared by ``LLM.score`` and the front-ends' ``/score`` and ``/rerank``:
the input checks, the engine prompt of a pair, the cosine of two embeddings and the rerank order.

Pure functions: no engine, no torch. A model scores a pair in one of two ways
(``ResolvedModel.score_mode``):

- a cross-encoder (``*ForSequenceClassification`` with one label, or an LLM reranker) reads
  the pair as one prompt (:func:`cross_encoder_prompts`) and its engine request has task
  ``"score"``;
- an embedding model (bi-encoder) embeds each text on its own, and the score is the cosine of
  the two embeddings (:func:`cosine_scores`).

Bad input raises :class:`ScoreInputError`, a ``ValueError`` naming the offending field.
"""

from __future__ import annotations

import copy
import math
import threading
import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from llmp.inputs import Prompt, last_tokens


class ScoreInputError(ValueError):
    """Bad score or rerank input; ``param`` names the offending field (``None``: the request)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


def validate_score_input(
    data_1: str | Sequence[str],
    data_2: str | Sequence[str],
    *,
    names: tuple[str, str] = ("data_1", "data_2"),
) -> tuple[list[str], list[str]]:
    """The pairs to score as two lists of equal length: 1:1 and N:N as given, 1:N with the one
    text repeated. ``names`` are the fields as the caller spells them (``query``/``documents``,
    ``text_1``/``text_2`` ...), for the error messages and ``param``."""
    first = _texts(data_1, names[0])
    second = _texts(data_2, names[1])
    if len(first) > 1 and len(first) != len(second):  # vLLM's order of checks and messages
        raise ScoreInputError("Input lengths must be either 1:1, 1:N or N:N", names[1])
    if not first:
        raise ScoreInputError("At least one text element must be given", names[0])
    if not second:
        raise ScoreInputError("At least one text_pair element must be given", names[1])
    for name, texts in zip(names, (first, second), strict=True):
        if any(text == "" for text in texts):
            raise ScoreInputError(f"{name} must not hold an empty string", name)
        if any(not is_unicode(text) for text in texts):
            raise ScoreInputError(f"{name} holds text that is not valid Unicode (a lone surrogate)", name)
    if len(first) == 1:
        first = first * len(second)
    return first, second


def is_unicode(text: str) -> bool:
    """Whether ``text`` encodes as UTF-8: JSON may carry a lone surrogate ("\\ud800"), which no
    tokenizer takes."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _texts(data: str | Sequence[str], name: str) -> list[str]:
    if isinstance(data, Mapping) or not isinstance(data, str | Iterable):  # a dict's keys are no texts
        kind = "a mapping (content parts or prompt ids)" if isinstance(data, Mapping) else type(data).__name__
        raise ScoreInputError(f"{name} must be a string or a list of strings, not {kind}: this model scores text", name)
    texts = [data] if isinstance(data, str) else list(data)
    if not all(isinstance(text, str) for text in texts):
        raise ScoreInputError(f"{name} must be a string or a list of strings", name)
    return texts


def truncation_length(truncate_prompt_tokens: int | None, max_model_len: int) -> int | None:
    """How many tokens a prompt keeps: ``None`` keeps them all, -1 is ``max_model_len``; 0, below
    -1 or more than ``max_model_len`` is an error, as ``PoolingParams`` and vLLM have it."""
    if truncate_prompt_tokens is None:
        return None
    if truncate_prompt_tokens == -1:
        return max_model_len
    if truncate_prompt_tokens < 1:
        raise ScoreInputError(
            f"truncate_prompt_tokens must be -1 or an integer >= 1, got {truncate_prompt_tokens}",
            "truncate_prompt_tokens",
        )
    if truncate_prompt_tokens > max_model_len:
        raise ScoreInputError(
            f"truncate_prompt_tokens ({truncate_prompt_tokens}) must be <= max_model_len ({max_model_len})",
            "truncate_prompt_tokens",
        )
    return truncate_prompt_tokens


def cross_encoder_prompts(
    tokenizer: Any,
    queries: Sequence[str],
    documents: Sequence[str],
    *,
    use_sep_token: bool,
    truncate_prompt_tokens: int | None = None,
    max_model_len: int,
    param: str | None = "data_2",
    chat_template: str | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> list[Prompt]:
    """The engine prompts of the pairs ``(queries[i], documents[i])`` for a cross-encoder, all
    tokenized in one call of the tokenizer (batched in its Rust core, not a Python call per pair).

    With ``use_sep_token`` (BERT-style cross-encoders) each is the tokenizer's pair encoding,
    ``[CLS] query [SEP] document [SEP]`` with its segment ids; truncation is the tokenizer's
    (longest first, special tokens kept), as sentence-transformers' ``CrossEncoder``. Without
    (LLM rerankers) the text ``query + document`` is tokenized, or with ``chat_template`` (a
    score template, as vLLM's ``--chat-template`` for Qwen3-Reranker) the template rendered with
    the messages ``query`` and ``document`` and ``chat_template_kwargs`` as its variables (vLLM's
    ``instruction`` is one); truncation keeps the last tokens, as
    ``/v1/embeddings`` does. A prompt longer than ``max_model_len`` is an error naming the pair
    ("the pair at index 3") and its length.
    """
    limit = truncation_length(truncate_prompt_tokens, max_model_len)
    if use_sep_token:
        if chat_template is not None:
            raise ScoreInputError("a score template applies only to LLM rerankers, not to a pair tokenizer", None)
        special = tokenizer.num_special_tokens_to_add(pair=True)
        if limit is not None and limit < special:  # the tokenizer would warn and not truncate at all
            raise ScoreInputError(
                f"truncate_prompt_tokens ({limit}) is below the {special} special tokens of a pair",
                "truncate_prompt_tokens",
            )
        try:
            encoded = _pair_encodings(tokenizer, list(queries), list(documents), limit)
        except Exception as exc:  # the tokenizer's own refusals are the input's fault
            raise ScoreInputError(f"the pairs cannot be tokenized: {exc}", None) from None
        all_types = encoded.get("token_type_ids") or [None] * len(encoded["input_ids"])
        pairs = [
            (list(ids), list(types) if types is not None and any(types) else None)  # all zeros is the default
            for ids, types in zip(encoded["input_ids"], all_types, strict=True)
        ]
    else:
        if chat_template is not None:
            texts = [
                score_template_text(tokenizer, q, d, chat_template, chat_template_kwargs)
                for q, d in zip(queries, documents, strict=True)
            ]
        else:
            texts = [q + d for q, d in zip(queries, documents, strict=True)]
        pairs = [(list(ids)[-limit:] if limit else list(ids), None) for ids in tokenizer(texts)["input_ids"]]
    prompts = []
    for index, (ids, types) in enumerate(pairs):
        check_length(ids, max_model_len, what=f"the pair at index {index}", param=param)
        prompts.append(Prompt(token_ids=ids, token_type_ids=types))
    return prompts


def _pair_encodings(tokenizer: Any, queries: list[str], documents: list[str], limit: int | None) -> Any:
    """The tokenizer's pair encodings, truncated longest-first to ``limit`` tokens when given.

    A fast tokenizer keeps its truncation setting in shared (Rust) state that each call with
    other settings rewrites, and a rewrite while another thread tokenizes fails ("Already
    borrowed"): truncating encodings go through a private copy of the tokenizer, one at a time."""
    if not limit:
        return tokenizer(text=queries, text_pair=documents)
    with _TRUNCATION_LOCK:
        private = _TRUNCATING.get(tokenizer)
        if private is None:
            private = _TRUNCATING[tokenizer] = copy.deepcopy(tokenizer)
        return private(text=queries, text_pair=documents, truncation="longest_first", max_length=limit)


_TRUNCATION_LOCK = threading.Lock()
_TRUNCATING: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def score_template_text(
    tokenizer: Any,
    query: str,
    document: str,
    chat_template: str,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> str:
    """The text an LLM reranker reads for one pair through a score template: ``chat_template``
    rendered with the messages ``{"role": "query"}`` and ``{"role": "document"}`` (vLLM's
    ``get_score_prompt``) and ``chat_template_kwargs`` as variables, without a generation prompt."""
    from llmp.chat_template import render_chat

    conversation = [{"role": "query", "content": query}, {"role": "document", "content": document}]
    try:
        return render_chat(
            tokenizer,
            conversation,
            chat_template=chat_template,
            add_generation_prompt=False,
            chat_template_kwargs=chat_template_kwargs,
        )
    except Exception as exc:  # jinja's errors: the template cannot read this pair
        raise ScoreInputError(f"the score template could not be applied: {type(exc).__name__}: {exc}", None) from None


def text_prompt(
    tokenizer: Any,
    text: str,
    *,
    truncate_prompt_tokens: int | None = None,
    max_model_len: int,
    what: str = "the text",
    param: str | None = None,
) -> Prompt:
    """The engine prompt of one text to embed (a bi-encoder's side of a pair): its tokens with
    the tokenizer's special tokens, truncation cutting the text's start and keeping those (as vLLM)."""
    limit = truncation_length(truncate_prompt_tokens, max_model_len)
    ids = list(tokenizer.encode(text))
    if limit is not None and len(ids) > limit:
        ids = last_tokens(ids, limit, tokenizer.encode(text, add_special_tokens=False))
    check_length(ids, max_model_len, what=what, param=param)
    return Prompt(token_ids=ids)


def check_length(ids: Sequence[int], max_model_len: int, *, what: str, param: str | None) -> None:
    if len(ids) > max_model_len:
        raise ScoreInputError(
            f"{what} is {len(ids)} tokens long; this model takes at most {max_model_len} "
            "(set truncate_prompt_tokens to truncate)",
            param,
        )


def cosine_scores(query_vectors: Sequence[Sequence[float]], document_vectors: Sequence[Sequence[float]]) -> list[float]:
    """The cosine similarity of each pair ``(query_vectors[i], document_vectors[i])``; a zero
    vector scores 0 (the norms' product is bounded below by 1e-8, as ``torch.cosine_similarity``)."""
    if len(query_vectors) != len(document_vectors):
        raise ValueError(f"{len(query_vectors)} query vectors for {len(document_vectors)} document vectors")
    scores = []
    for a, b in zip(query_vectors, document_vectors, strict=True):
        if len(a) != len(b):
            raise ValueError(f"vectors of {len(a)} and {len(b)} dimensions cannot be compared")
        dot = math.fsum(x * y for x, y in zip(a, b, strict=True))
        norms = math.sqrt(math.fsum(x * x for x in a)) * math.sqrt(math.fsum(y * y for y in b))
        scores.append(dot / max(norms, 1e-8))
    return scores


def rerank_order(scores: Sequence[float], top_n: int | None = None) -> list[int]:
    """The indices of ``scores`` from the highest score down (ties keep their input order), cut to
    the first ``top_n``; ``top_n`` of 0, below 0 or ``None`` keeps them all."""
    order = sorted(range(len(scores)), key=lambda i: scores[i], reverse=True)  # stable, also reversed
    return order[:top_n] if top_n and top_n > 0 else order
