"""Engine-side state of one sequence being generated."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

from llmp.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"

    @property
    def finished(self) -> bool:
        return self in _FINISHED

    @property
    def finish_reason(self) -> str | None:
        return self.value if self.finished else None


_FINISHED = {RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH, RequestStatus.FINISHED_ABORTED}


@dataclass(eq=False)
class Request:
    """One sequence: its tokens, how many of them are in the KV cache, and its blocks.

    ``num_computed_tokens`` advances when a step is scheduled; the token sampled
    after the last prompt (or output) token is appended when the step returns.
    """

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    eos_token_ids: frozenset[int] = frozenset()  # the model's end tokens (ignored with ignore_eos)
    priority: int = 0
    arrival_time: float = field(default_factory=time.monotonic)
    max_tokens: int = 16  # resolved against the context length by the engine
    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int = -1  # prompt tokens found in the prefix cache at first schedule
    block_ids: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)  # of full blocks, filled by the KV manager
    num_registered_blocks: int = 0  # leading blocks the KV manager has entered in its prefix cache
    num_preemptions: int = 0
    stop_reason: int | str | None = None
    first_scheduled_time: float | None = None
    pooling_params: Any = None  # set for a pooling request (llmp.PoolingParams): pooled, never sampled
    pooling_task: str | None = None  # a pooling request's task ("embed", "classify", "score", "token_*")
    pooler: str | None = None  # a pooling request's pooler (a name in llmp.modeling.pooling.POOLERS)
    # a pooling request whose pooler needs every prompt row in one step (all but "last" on a causal LM):
    # no prefix-cache reuse or registration, never chunked
    whole_prompt: bool = False
    token_type_ids: list[int] | None = None  # segment ids of a text pair (cross-encoders), one per prompt token
    generator: Any = None  # unused since API 0.5's sampling moved to the worker (a seeded draw keeps no state)
    grammar: Any = None  # structured_output.GrammarState of a constrained request
    bad_words_token_ids: list[list[int]] = field(default_factory=list)  # see sampler.bad_words_token_ids
    lora_request: Any = None  # the llmp.LoRARequest it runs with, or None (the base model)
    lora_id: int = 0  # the engine's key of that adapter's load (0 = the base model): keys hashes, slots, the step cap
    # the engine's timings of this sequence, time.time() seconds under RequestOutput.metrics' keys: arrival_time
    # now; scheduled_time, first_token_time and last_token_time set by the engine step (so any scheduler
    # plugin's requests get them), finished_time by the output processor
    times: dict[str, float] = field(default_factory=lambda: {"arrival_time": time.time()})
    cache_salt: str | None = None  # its prompt's (Prompt.cache_salt): keys its prefix-cache blocks as lora_id does
    thinking: Any = None  # thinking_budget.ThinkingBudget of a request with a thinking_token_budget

    def __post_init__(self) -> None:
        self.all_token_ids: list[int] = list(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    def append_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)

    def record_scheduled(self, now: float) -> None:
        """The first step that computes some of it (a preempted request keeps its first)."""
        self.times.setdefault("scheduled_time", now)

    def record_token(self, now: float) -> None:
        """A step sampled a token of it."""
        self.times.setdefault("first_token_time", now)
        self.times["last_token_time"] = now

    @property
    def is_finished(self) -> bool:
        return self.status.finished
