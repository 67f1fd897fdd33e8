"""The default scheduler: one token budget per step.

There are no prefill and decode phases. Every request has a target (its prompt
plus the tokens generated so far) and ``num_computed_tokens`` already in the KV
cache; each step hands out up to ``max_num_batched_tokens`` tokens, running
requests first, so decodes, prefill chunks and prefix-cache hits follow one
rule. When the KV cache runs out, the lowest-ranked running request is
preempted: its blocks are freed and it is recomputed later.

Policies (``EngineConfig.scheduling_policy``), as in vLLM v1's scheduler:

- ``fcfs``: the waiting queue is in arrival order, and the victim of a preemption is
  the running request admitted last. A request may not ask for a priority other than 0
  (a :class:`~llmp.api.RequestValidationError` on ``priority``, vLLM's message).
- ``priority``: the waiting queue is ordered by (priority, arrival time), lower value
  first, so a request with a lower value is admitted before those queued ahead of it;
  the victim of a preemption is the running request that comes last in that order
  (the highest value, then the latest arrival). Priority acts only there: a waiting
  request never preempts a running one, and no request is admitted in a step that
  preempted.

A preempted request goes back to the waiting queue in its place by that order.

LoRA (``max_loras`` > 0): the running requests never use more than ``max_loras`` distinct
adapters (the model runner's slots). A waiting request whose adapter would be one too many
is skipped, not waited on: requests behind it (the base model's, or a running adapter's)
are still admitted. As in vLLM, steady load on ``max_loras`` adapters can starve another one.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from llmp.api import RequestValidationError
from llmp.engine.kv_cache import BlockKVCacheManager
from llmp.engine.request import Request, RequestStatus
from llmp.options import EngineConfig, SchedulingPolicy


def _count_adapters(requests: Iterable[Request]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for request in requests:
        if request.lora_id:
            counts[request.lora_id] = counts.get(request.lora_id, 0) + 1
    return counts


def check_priority(priority: int, policy: SchedulingPolicy) -> None:
    """vLLM's rule: a request's ``priority`` must stay 0 unless the priority policy is on."""
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise RequestValidationError("priority", f"priority must be an integer, got {priority!r}")
    if priority != 0 and policy != "priority":
        raise RequestValidationError("priority", f"Got priority {priority} but Priority scheduling is not enabled.")


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """The scheduler's share of :class:`EngineConfig` (its defaults and checks live there), with the
    context length the engine settled on."""

    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    enable_chunked_prefill: bool
    policy: SchedulingPolicy
    max_loras: int = 0  # distinct LoRA adapters among the running requests; 0 = LoRA off

    @classmethod
    def from_engine_config(cls, config: EngineConfig, max_model_len: int) -> SchedulerConfig:
        return cls(
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_model_len=max_model_len,
            enable_chunked_prefill=config.enable_chunked_prefill,
            policy=config.scheduling_policy,
            max_loras=config.max_loras if config.enable_lora else 0,
        )


@dataclass(slots=True)
class ScheduledRequest:
    request: Request
    start: int  # tokens already in the KV cache before this step
    num_tokens: int  # tokens computed in this step

    @property
    def completes_sequence(self) -> bool:
        """True when this step reaches the end of the known tokens, so its sample counts."""
        return self.start + self.num_tokens == self.request.num_tokens


@dataclass(slots=True)
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    """The default scheduler: one token budget per step, the policy of the module docstring."""

    def __init__(self, config: SchedulerConfig, kv_manager: BlockKVCacheManager) -> None:
        self.config = config
        self.kv = kv_manager
        self.waiting: list[Request] = []  # kept in admission order (see _rank)
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.num_preemptions = 0
        self.num_prefill_chunks = 0  # steps that computed part of a prompt but not its end

    # -- requests --------------------------------------------------------

    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in use")
        self.requests[request.request_id] = request
        self._enqueue(request)

    def abort_requests(self, request_ids: Iterable[str]) -> list[Request]:
        aborted = []
        for request_id in request_ids:
            request = self.requests.get(request_id)
            if request is not None:
                self.finish(request, RequestStatus.FINISHED_ABORTED)
                aborted.append(request)
        return aborted

    def finish(self, request: Request, status: RequestStatus, stop_reason: int | str | None = None) -> None:
        """End a request (e.g. on a stop string found by the output processor) and free its blocks."""
        if request.is_finished:
            return
        if request.status == RequestStatus.RUNNING:
            self.running.remove(request)
        else:
            self.waiting.remove(request)
        request.status = status
        request.stop_reason = stop_reason
        self.kv.free(request)
        del self.requests[request.request_id]

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def lora_counts(self) -> tuple[dict[int, int], dict[int, int]]:
        """Running and waiting requests per adapter (``Request.lora_id``; the base model left out)."""
        return _count_adapters(self.running), _count_adapters(self.waiting)

    # -- one step --------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        for request in list(self.running):
            if budget == 0:
                break
            if request.status != RequestStatus.RUNNING:  # preempted earlier in this loop
                continue
            num_new = min(request.num_tokens - request.num_computed_tokens, budget)
            while self.kv.allocate_slots(request, num_new) is None:
                victim = self._pick_victim()
                budget += self._unschedule(out, victim)
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is request:
                    break
            else:
                budget -= num_new
                out.scheduled.append(self._advance(request, num_new))
        if not out.preempted:
            budget = self._admit_waiting(out, budget)
        return out

    def _admit_waiting(self, out: SchedulerOutput, budget: int) -> int:
        adapters = {r.lora_id for r in self.running if r.lora_id}
        index = 0  # requests before it were skipped: their adapter would exceed max_loras
        while index < len(self.waiting) and budget > 0 and len(self.running) < self.config.max_num_seqs:
            request = self.waiting[index]
            if request.lora_id and request.lora_id not in adapters and len(adapters) >= self.config.max_loras:
                index += 1
                continue
            blocks, num_cached = self.kv.get_computed_blocks(request)
            num_new = request.num_tokens - num_cached
            if num_new > budget:
                if not self.config.enable_chunked_prefill or request.whole_prompt:
                    break  # a pooler of every prompt row (cls, mean, all ...) needs the whole prompt in one step
                num_new = budget
            if self.kv.allocate_slots(request, num_new, blocks) is None:
                break
            self.waiting.pop(index)
            self.running.append(request)
            if request.lora_id:
                adapters.add(request.lora_id)
            request.status = RequestStatus.RUNNING
            request.num_computed_tokens = num_cached
            if request.num_cached_tokens < 0:
                request.num_cached_tokens = num_cached
                request.first_scheduled_time = time.monotonic()
            budget -= num_new
            out.scheduled.append(self._advance(request, num_new))
        return budget

    def _advance(self, request: Request, num_new: int) -> ScheduledRequest:
        scheduled = ScheduledRequest(request, request.num_computed_tokens, num_new)
        request.num_computed_tokens += num_new
        if not scheduled.completes_sequence:
            self.num_prefill_chunks += 1
        return scheduled

    def update_from_output(self, out: SchedulerOutput, sampled: list[int | None]) -> list[Request]:
        """Append each request's sampled token (None for a partial prefill chunk) and
        finish the requests that hit EOS, a stop token, ``max_tokens`` or the context limit.
        Returns the requests that got a new token."""
        updated = []
        for item, token in zip(out.scheduled, sampled, strict=True):
            request = item.request
            if token is None or request.is_finished:
                continue
            request.append_token(token)
            updated.append(request)
            status = self._check_stop(request, token)
            if status is not None:
                # as in vLLM, stop_reason names a stop token id, but stays None for EOS
                stop_reason = token if token in request.params.stop_token_ids else None
                self.finish(
                    request, status, stop_reason=stop_reason if status == RequestStatus.FINISHED_STOPPED else None
                )
        return updated

    def _check_stop(self, request: Request, token: int) -> RequestStatus | None:
        # an end or stop token wins over the length cap it lands on, as in vLLM: the answer ended by itself
        params = request.params
        if request.num_output_tokens >= params.min_tokens and (
            (token in request.eos_token_ids and not params.ignore_eos) or token in params.stop_token_ids
        ):
            return RequestStatus.FINISHED_STOPPED
        if request.num_output_tokens >= request.max_tokens or request.num_tokens >= self.config.max_model_len:
            return RequestStatus.FINISHED_LENGTH
        return None

    # -- queueing and preemption -----------------------------------------

    def _rank(self, request: Request) -> tuple:
        if self.config.policy == "priority":
            return (request.priority, request.arrival_time)
        return (request.arrival_time,)

    def _enqueue(self, request: Request) -> None:
        bisect.insort(self.waiting, request, key=self._rank)

    def _pick_victim(self) -> Request:
        if self.config.policy == "priority":
            return max(self.running, key=self._rank)
        return self.running[-1]

    def _unschedule(self, out: SchedulerOutput, request: Request) -> int:
        # under the priority policy the victim may already be in this step: take it out
        for i, item in enumerate(out.scheduled):
            if item.request is request:
                del out.scheduled[i]
                return item.num_tokens
        return 0

    def _preempt(self, request: Request) -> None:
        self.running.remove(request)
        self.kv.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self._enqueue(request)
