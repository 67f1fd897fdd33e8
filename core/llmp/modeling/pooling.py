"""Pooling: from a step's hidden states to one result per pooling request.

A pooler is a function registered by name in :data:`POOLERS` (``cls``, ``mean``, ``last``,
``all``, ``step`` built in; a plugin adds its own with :func:`register_pooler`). The model
runner calls each pooler once per step with every request that uses it: poolers are
vectorised over the flattened step, never a Python loop per token.

The activations of the classification tasks follow vLLM's rules (``classify_activation``,
``score_activation``); the engine applies them to the head's output.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

__all__ = [
    "POOLERS",
    "TOKEN_POOLING_TASKS",
    "PoolFn",
    "PoolSlice",
    "classify_activation",
    "default_pooler",
    "finish_embedding",
    "num_labels",
    "register_pooler",
    "score_activation",
]

TOKEN_POOLING_TASKS = ("token_embed", "token_classify")  # one row per token (or per step tag), not per sequence


@dataclass(frozen=True, slots=True)
class PoolSlice:
    """One request's rows in a step's flattened hidden states."""

    start: int  # first row
    count: int  # its rows: the whole prompt, or for ``last`` on a causal LM the prompt's final chunk
    step_tag_id: int | None = None  # ``step``: keep the rows whose input token is this (None: every row)


PoolFn = Callable[[torch.Tensor, torch.Tensor, Sequence[PoolSlice]], list[torch.Tensor]]
"""``fn(hidden [T, H], input_ids [T], slices) -> one tensor per slice``: ``[H]`` for a sequence
pooler, ``[rows, H]`` for a token pooler; in ``hidden``'s dtype and on its device."""

POOLERS: dict[str, PoolFn] = {}


def register_pooler(name: str) -> Callable[[PoolFn], PoolFn]:
    """Register a pooler under ``name`` (a decorator), so ``PoolingConfig.pooling_type`` or a
    model's ``default_pooling`` can name it. Only ``last`` keeps prefix caching and chunked
    prefill for its requests on causal LMs: every other pooler gets the whole prompt in one step."""

    def register(fn: PoolFn) -> PoolFn:
        POOLERS[name] = fn
        return fn

    return register


def _rows(hidden: torch.Tensor, slices: Sequence[PoolSlice], offset: Callable[[PoolSlice], int]) -> torch.Tensor:
    index = torch.tensor([offset(s) for s in slices], dtype=torch.long, device=hidden.device)
    return hidden.index_select(0, index)


@register_pooler("cls")
def pool_cls(hidden: torch.Tensor, input_ids: torch.Tensor, slices: Sequence[PoolSlice]) -> list[torch.Tensor]:
    """The first token's state ([CLS], ``<s>``)."""
    return list(_rows(hidden, slices, lambda s: s.start).unbind(0))


@register_pooler("last")
def pool_last(hidden: torch.Tensor, input_ids: torch.Tensor, slices: Sequence[PoolSlice]) -> list[torch.Tensor]:
    """The last token's state: in a causal LM, the only one that has seen the whole text."""
    return list(_rows(hidden, slices, lambda s: s.start + s.count - 1).unbind(0))


@register_pooler("mean")
def pool_mean(hidden: torch.Tensor, input_ids: torch.Tensor, slices: Sequence[PoolSlice]) -> list[torch.Tensor]:
    """The mean of every token's state, summed in float32."""
    device = hidden.device
    starts = torch.tensor([s.start for s in slices], dtype=torch.long, device=device)
    counts = torch.tensor([s.count for s in slices], dtype=torch.long, device=device)
    segment = torch.repeat_interleave(torch.arange(len(slices), device=device), counts)
    # row r of segment i is starts[i] + (r - first row of segment i in the concatenation)
    offsets = torch.cumsum(counts, 0) - counts
    rows = starts[segment] + torch.arange(segment.numel(), device=device) - offsets[segment]
    sums = torch.zeros(len(slices), hidden.shape[-1], dtype=torch.float32, device=device)
    sums.index_add_(0, segment, hidden.index_select(0, rows).float())
    return list((sums / counts.unsqueeze(1)).to(hidden.dtype).unbind(0))


@register_pooler("all")
def pool_all(hidden: torch.Tensor, input_ids: torch.Tensor, slices: Sequence[PoolSlice]) -> list[torch.Tensor]:
    """Every token's state, one row per token."""
    return [hidden[s.start : s.start + s.count] for s in slices]


@register_pooler("step")
def pool_step(hidden: torch.Tensor, input_ids: torch.Tensor, slices: Sequence[PoolSlice]) -> list[torch.Tensor]:
    """The states of the step-tag tokens (process reward models); every row without a tag."""
    pooled = []
    for s in slices:
        rows = hidden[s.start : s.start + s.count]
        if s.step_tag_id is not None:
            rows = rows[input_ids[s.start : s.start + s.count] == s.step_tag_id]
        pooled.append(rows)
    return pooled


def default_pooler(model_cls: Any, task: str) -> str:
    """The pooler a model class names for a sequence ``task`` (``default_pooling``: a name, or a
    ``{task: name}`` mapping); ``last`` when it names none (a causal LM's)."""
    value = getattr(model_cls, "default_pooling", None) or "last"
    if isinstance(value, Mapping):
        return value.get(task) or value.get("classify" if task == "score" else task) or "last"
    return value


# -- heads and activations ----------------------------------------------------


def num_labels(config: Any) -> int:
    """How many logits the model's classification head gives: one for a converted LLM reranker
    (``classifier_from_token`` with the 2-way softmax conversion), one per token without it;
    else ``len(id2label)``, ``num_labels``, or transformers' default of 2."""
    tokens = getattr(config, "classifier_from_token", None)
    if tokens:
        two_way = getattr(config, "method", None) == "from_2_way_softmax" or getattr(
            config, "is_original_qwen3_reranker", False
        )
        return 1 if two_way else len(tokens)
    id2label = getattr(config, "id2label", None)
    if id2label:
        return len(id2label)
    return getattr(config, "num_labels", None) or 2


def _identity(logits: torch.Tensor) -> torch.Tensor:
    return logits


def _classify(logits: torch.Tensor) -> torch.Tensor:
    # vLLM's PoolerClassify: a single logit is a probability through the sigmoid, several a softmax
    if logits.shape[-1] < 2:
        return torch.sigmoid(logits)
    return torch.softmax(logits, dim=-1)


def classify_activation(config: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    """vLLM's activation of the ``classify`` (and ``token_classify``) logits: identity for
    ``problem_type`` "regression", sigmoid for "multi_label_classification", else sigmoid for
    one label and softmax for several."""
    problem_type = getattr(config, "problem_type", None)
    if problem_type == "regression":
        return _identity
    if problem_type == "multi_label_classification":
        return torch.sigmoid
    return _classify


def score_activation(config: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    """vLLM's activation of a cross-encoder's score: the sentence-transformers ``activation_fn``
    of the config (``config.sentence_transformers["activation_fn"]``, else
    ``sbert_ce_default_activation_function``), else :func:`classify_activation`'s rule.
    Sigmoid and Softmax mean the classify rule and Identity none, as in vLLM."""
    settings = getattr(config, "sentence_transformers", None)
    name = settings.get("activation_fn") if isinstance(settings, Mapping) else None
    name = name or getattr(config, "sbert_ce_default_activation_function", None)
    if name is None:
        return classify_activation(config)
    if not isinstance(name, str) or not name.startswith("torch.nn.modules."):
        raise ValueError(f"the model's score activation {name!r} is not a torch.nn.modules class")
    module_name, _, class_name = name.rpartition(".")
    try:
        activation = getattr(importlib.import_module(module_name), class_name)()
    except (ImportError, AttributeError, TypeError) as exc:
        raise ValueError(f"the model's score activation {name!r} cannot be built: {exc}") from None
    if isinstance(activation, torch.nn.Identity):
        return _identity
    if isinstance(activation, torch.nn.Sigmoid | torch.nn.Softmax):
        return _classify
    return activation


def finish_embedding(vector: torch.Tensor, normalize: bool, dimensions: int | None) -> list:
    """An embedding (or each row of a token embedding) cut to ``dimensions``, then L2-normalised."""
    if dimensions is not None:
        if dimensions > vector.shape[-1]:
            raise ValueError(f"dimensions {dimensions} exceeds the model's embedding size {vector.shape[-1]}")
        vector = vector[..., :dimensions]
    if normalize:
        vector = F.normalize(vector, dim=-1)
    return vector.tolist()
