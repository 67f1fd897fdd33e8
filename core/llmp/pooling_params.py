"""Parameters of a pooling request (embedding, classification, score, reward), with vLLM's names."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Literal

PoolingTask = Literal["embed", "classify", "score", "token_embed", "token_classify"]
POOLING_TASKS: tuple[str, ...] = ("embed", "classify", "score", "token_embed", "token_classify")


@dataclass(slots=True)
class PoolingParams:
    """What a pooling request asks for. Every field has a default that means "the model's"."""

    task: PoolingTask | None = None  # None = the model's primary pooling task
    normalize: bool | None = None  # embed: None = the model's default (a sentence-transformers Normalize module)
    dimensions: int | None = None  # embed: keep the first N dimensions (Matryoshka), before normalising
    use_activation: bool | None = None  # classify/score/token_classify: False = raw logits; None = True
    truncate_prompt_tokens: int | None = None  # keep the last N prompt tokens; -1 = max_model_len
    step_tag_id: int | None = None  # token_*: keep only the rows of this token (process reward models)
    returned_token_ids: list[int] | None = None  # token_classify: keep only these columns

    def __post_init__(self) -> None:
        if self.task is not None and self.task not in POOLING_TASKS:
            raise ValueError(f"task must be one of {', '.join(POOLING_TASKS)}, got {self.task!r}")
        if self.dimensions is not None and (
            isinstance(self.dimensions, bool) or not isinstance(self.dimensions, int) or self.dimensions < 1
        ):
            raise ValueError(f"dimensions must be an integer >= 1, got {self.dimensions!r}")
        limit = self.truncate_prompt_tokens
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < -1 or limit == 0):
            raise ValueError(f"truncate_prompt_tokens must be -1 or an integer >= 1, got {limit!r}")

    def clone(self) -> PoolingParams:
        """A deep copy, to change without touching this one (vLLM's ``clone``)."""
        return copy.deepcopy(self)


def matryoshka_dimensions(config: object) -> list[int] | None:
    """The sizes a model's embeddings may be cut to, from its config as vLLM reads it:
    ``matryoshka_dimensions``; ``[]`` (any size) when it says only ``is_matryoshka``; ``None`` when
    it was not trained for it (a cut embedding of such a model loses quality unannounced)."""
    sizes = getattr(config, "matryoshka_dimensions", None)
    if sizes:
        return [int(size) for size in sizes]
    return [] if getattr(config, "is_matryoshka", False) else None


def check_dimensions(dimensions: int, matryoshka: list[int] | None, embedding_size: int | None) -> None:
    """vLLM's rule for ``dimensions``: a ValueError unless the model supports Matryoshka
    embeddings (``matryoshka_dimensions``' answer) and the size is one it supports."""
    if matryoshka is None:
        raise ValueError(
            f"dimensions must be unset: the model does not support Matryoshka embeddings (received {dimensions})"
        )
    if embedding_size and not 1 <= dimensions <= embedding_size:
        raise ValueError(f"dimensions must be in the model's range [1, {embedding_size}], got {dimensions}")
    if matryoshka and dimensions not in matryoshka:
        raise ValueError(f"dimensions must be one of the model's Matryoshka sizes {matryoshka}, got {dimensions}")
