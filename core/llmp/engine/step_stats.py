"""Tokens per engine step, which only the engine sees: a bucketed histogram kept in the engine
process and read through the ``stats`` utility (the server's ``llmp_iteration_tokens``, vLLM's
``vllm:iteration_tokens_total``). A step's tokens are, as vLLM counts them, the prompt tokens it
computed plus the tokens it sampled, so over a request they add up to its prompt (less what the
prefix cache held) plus its output."""

from __future__ import annotations

import bisect
from typing import Any

ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)  # vLLM's


def step_prompt_tokens(scheduled: Any) -> int:
    """Prompt tokens a ``SchedulerOutput`` computes (prefill chunks; a preempted request's recompute too)."""
    return sum(
        max(0, min(item.start + item.num_tokens, item.request.num_prompt_tokens) - item.start)
        for item in scheduled.scheduled
    )


class IterationTokens:
    """Counts per bucket (a step's tokens fall in the first bucket whose bound holds them; the last
    count is above every bound), their sum and number, since the engine started."""

    def __init__(self, buckets: tuple[int, ...] = ITERATION_TOKEN_BUCKETS) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0

    def observe(self, tokens: int) -> None:
        self.counts[bisect.bisect_left(self.buckets, tokens)] += 1
        self.sum += tokens

    def snapshot(self) -> dict[str, Any]:
        """Plain data for the ``stats`` utility: ``buckets`` (upper bounds), ``counts`` (one more
        than the bounds, not cumulative), ``sum``."""
        return {"buckets": list(self.buckets), "counts": list(self.counts), "sum": self.sum}
