"""Results handed back to callers, shaped like vLLM's ``RequestOutput``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Logprob:
    """Log-probability of one token, its rank in the distribution (1 = most likely) and its text."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


SampleLogprobs = list[dict[int, Logprob]]  # one dict per generated token: token id -> Logprob
PromptLogprobs = list[dict[int, Logprob] | None]  # None for the first prompt token


@dataclass(slots=True)
class CompletionOutput:
    """One of the ``n`` completions of a request."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    logprobs: SampleLogprobs | None = None
    finish_reason: str | None = None  # "stop" | "length" | "abort", None while running
    stop_reason: int | str | None = None  # the stop string or stop token that ended it

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True)
class RequestOutput:
    """The state of one request: its prompt and every completion so far."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    prompt_logprobs: PromptLogprobs | None = None
    num_cached_tokens: int = 0
    # the engine's timings of the request, time.time() seconds, on every output once known:
    # arrival_time (the engine took it), scheduled_time (first scheduled), first_token_time,
    # last_token_time, and finished_time on the last; queue time is scheduled - arrival,
    # prefill first_token - scheduled, decode last_token - first_token
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(slots=True)
class EmbeddingOutput:
    """Task ``embed``: one vector per prompt (normalised and cut to ``dimensions`` as asked)."""

    embedding: list[float]

    @property
    def data(self) -> list[float]:
        return self.embedding


@dataclass(slots=True)
class ClassificationOutput:
    """Task ``classify``: the class probabilities (after the model's activation; raw logits
    with ``use_activation=False``), in label order (``config.id2label``)."""

    probs: list[float]

    @property
    def num_classes(self) -> int:
        return len(self.probs)

    @property
    def data(self) -> list[float]:
        return self.probs


@dataclass(slots=True)
class ScoringOutput:
    """Task ``score``: the relevance of one text pair (a cross-encoder's activated logit, or the
    cosine of two embeddings)."""

    score: float

    @property
    def data(self) -> float:
        return self.score


@dataclass(slots=True)
class PoolingOutput:
    """The raw pooled output: a vector (``embed``, ``classify``), or one row per token or step
    (``token_embed``, ``token_classify``: reward models). ``values`` holds it as plain lists;
    ``data`` is it as a float32 ``torch.Tensor``, as vLLM's ``PoolingOutput.data``."""

    values: list[float] | list[list[float]]

    @property
    def data(self) -> Any:
        import torch  # only where a tensor is asked for: the server's process never needs one

        return torch.tensor(self.values, dtype=torch.float32)


@dataclass(slots=True)
class PoolingRequestOutput:
    """The result of a pooling request (embedding, classification, score, reward). ``outputs`` is
    :class:`EmbeddingOutput`, :class:`ClassificationOutput`, :class:`ScoringOutput` or
    :class:`PoolingOutput` by the request's task; each has ``data`` (a tensor for
    :class:`PoolingOutput`, plain values for the others)."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: EmbeddingOutput | ClassificationOutput | ScoringOutput | PoolingOutput
    finished: bool = True
    num_cached_tokens: int = 0


# vLLM's names for the request outputs of each task: one shape here, told apart by ``outputs``
EmbeddingRequestOutput = PoolingRequestOutput
ClassificationRequestOutput = PoolingRequestOutput
ScoringRequestOutput = PoolingRequestOutput
