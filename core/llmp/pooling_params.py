"""Parameters of a pooling request (embedding, classification, score, reward), with vLLM's names."""

from __future__ import annotations

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
