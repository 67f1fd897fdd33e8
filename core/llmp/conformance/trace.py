"""A scheduler and a KV-cache manager driven through a seeded random request trace, as the engine
drives them, with every step checked.

The trace: requests arriving over time, of varied prompt and output lengths, many after a shared
prefix, some identical, some aborted or ended early (a stop string), pooling requests that need
their whole prompt in one step, prompt-logprobs requests, LoRA adapters, priorities, and a KV pool
small enough to force preemption. The model is a stand-in: the token after a sequence is a hash
of it (and of its adapter), so every request's output is known in advance, whatever the schedule.

Besides the sampled tokens, the harness keeps the KV cache's contents: what each slot of each
block holds (which prefix's key/value, written by which request at which step). Each step it writes
the scheduled tokens where the block table says, then checks that every position a scheduled
request reads (those before its ``start``) holds the KV of that request's own prefix. That catches
whatever breaks attention: a block evicted while in use, a prefix-cache hit on another prompt or
adapter, a preempted request resumed on stale blocks, a whole-prompt request's blocks reused.

After every call and every step: the KV manager's ``usage`` equals the blocks the requests hold
(no leak), block tables are consistent, the token budget and ``max_num_seqs`` hold, no more than
``max_loras`` adapters run at once, and every request's tokens equal the stand-in model's; at the
end every block is free again and a request needing the whole pool gets it.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from llmp.scheduling import Request, RequestStatus, SchedulerConfig, SchedulerOutput

__all__ = ["BLOCK_SIZE", "EOS", "SCENARIOS", "Scenario", "TraceRun", "new_request", "stand_in_token"]

BLOCK_SIZE = 4
VOCAB = 40
EOS = 1
STOP_STRING = "stop string"  # the stop_reason of a request the harness ends as the engine does on a stop string


@dataclass(frozen=True)
class Scenario:
    """One engine configuration a trace runs under."""

    name: str
    num_blocks: int = 16
    max_num_seqs: int = 6
    max_num_batched_tokens: int = 24
    max_model_len: int = 48
    chunked_prefill: bool = True
    prefix_caching: bool = True
    policy: str = "fcfs"
    max_loras: int = 0  # > 0: requests of adapters 1..3 and the base model
    num_requests: int = 24
    arrival_steps: int = 30

    def scheduler_config(self) -> SchedulerConfig:
        return SchedulerConfig(
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_model_len=self.max_model_len,
            enable_chunked_prefill=self.chunked_prefill,
            policy=self.policy,  # type: ignore[arg-type]
            max_loras=self.max_loras,
        )


SCENARIOS = (
    Scenario("FCFS, prefix caching, chunked prefill"),
    Scenario("priority policy", policy="priority"),
    Scenario(
        "no chunked prefill, no prefix caching", chunked_prefill=False, prefix_caching=False, max_num_batched_tokens=48
    ),
    Scenario("LoRA adapters (max_loras 2)", max_loras=2),
)


def stand_in_token(lora_id: int, tokens: Sequence[int]) -> int:
    """The stand-in model's greedy token after ``tokens`` (EOS about one time in 40)."""
    value = 1469598103934665603 ^ lora_id
    for token in tokens:
        value = ((value ^ token) * 1099511628211) % (1 << 64)
    return value % VOCAB


@dataclass(frozen=True)
class Planned:
    """A request of the trace, before it arrives."""

    request_id: str
    prompt: list[int]
    arrival: int  # the step it arrives at
    max_tokens: int
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    prompt_logprobs: bool = False
    whole_prompt: bool = False  # a pooling request whose pooler reads every prompt row
    lora_id: int = 0
    priority: int = 0
    abort_at: int | None = None  # the step the engine aborts it at (it may have finished by then)
    stop_at: int | None = None  # the step the engine ends it at, as on a stop string, once it has a token


def new_request(
    request_id: str,
    prompt: Sequence[int],
    *,
    max_tokens: int = 4,
    whole_prompt: bool = False,
    prompt_logprobs: bool = False,
    lora_id: int = 0,
    **params: Any,
) -> Request:
    """A :class:`llmp.scheduling.Request` as the engine makes it (a pooling request when
    ``whole_prompt``); ``params`` are more ``SamplingParams`` fields."""
    from llmp import PoolingParams, SamplingParams

    if whole_prompt:
        return Request(
            request_id,
            list(prompt),
            SamplingParams(max_tokens=1),
            max_tokens=1,
            pooling_params=PoolingParams(),
            pooling_task="embed",
            pooler="mean",
            whole_prompt=True,
            lora_id=lora_id,
        )
    sampling = SamplingParams(max_tokens=max_tokens, prompt_logprobs=1 if prompt_logprobs else None, **params)
    return Request(
        request_id, list(prompt), sampling, eos_token_ids=frozenset({EOS}), max_tokens=max_tokens, lora_id=lora_id
    )


def make_trace(scenario: Scenario, seed: int) -> list[Planned]:
    rng = random.Random(seed)
    room = scenario.max_model_len - 2
    prefixes = [[rng.randrange(2, VOCAB) for _ in range(length)] for length in (4, 8, 10)]
    plans: list[Planned] = []
    for index in range(scenario.num_requests):
        arrival = rng.randrange(scenario.arrival_steps)
        if plans and rng.random() < 0.1:  # the very prompt of an earlier request
            prompt = list(rng.choice(plans).prompt)
        else:
            prefix = rng.choice(prefixes) if rng.random() < 0.6 else []
            prompt = prefix + [rng.randrange(2, VOCAB) for _ in range(rng.randint(1, 20))]
        draw = rng.random()
        whole_prompt = draw < 0.08
        prompt = prompt[: min(room, scenario.max_num_batched_tokens if whole_prompt else room)]
        plans.append(
            Planned(
                request_id=f"r{index}",
                prompt=prompt,
                arrival=arrival,
                max_tokens=rng.randint(1, 12),
                ignore_eos=rng.random() < 0.3,
                stop_token_ids=(rng.randrange(2, VOCAB),) if rng.random() < 0.2 else (),
                prompt_logprobs=0.08 <= draw < 0.16,
                whole_prompt=whole_prompt,
                lora_id=rng.choice((0, 0, 1, 2, 3)) if scenario.max_loras else 0,
                priority=rng.randint(-2, 2) if scenario.policy == "priority" else 0,
                abort_at=arrival + rng.randint(0, 15) if rng.random() < 0.12 else None,
                stop_at=arrival + rng.randint(1, 15) if rng.random() < 0.08 else None,
            )
        )
    return sorted(plans, key=lambda p: p.arrival)


@dataclass
class Tracked:
    """A request of the trace in flight, with what the stand-in model says it must come to."""

    plan: Planned
    request: Request
    expected: list[int]  # the stand-in model's whole output (none for a pooling request)
    reasons: set[str]  # the finish reasons that output may end with
    preemptions: int = 0
    first_start: int | None = None
    ended_by: str | None = None  # "abort" or STOP_STRING: the harness ended it, as the engine would
    final_checked: bool = False
    num_outputs: int = 0  # outputs at the last check: they never shrink

    @property
    def label(self) -> str:
        times = "once" if self.preemptions == 1 else f"{self.preemptions} times"
        preempted = f", preempted {times}" if self.preemptions else ""
        return f"request {self.plan.request_id!r} ({len(self.plan.prompt)}-token prompt{preempted})"


def expected_output(plan: Planned, max_model_len: int) -> tuple[list[int], set[str]]:
    """The stand-in model's output for ``plan`` and how it may end (both reasons when the last
    token is both a stop and the length limit: which wins is the scheduler's choice)."""
    if plan.whole_prompt:
        return [], {"stop"}
    tokens, output = list(plan.prompt), []
    while True:
        token = stand_in_token(plan.lora_id, tokens)
        tokens.append(token)
        output.append(token)
        length = len(output) >= plan.max_tokens or len(tokens) >= max_model_len
        stop = (token == EOS and not plan.ignore_eos) or token in plan.stop_token_ids
        if length or stop:
            return output, ({"length"} if length else set()) | ({"stop"} if stop else set())


class TraceFailure(AssertionError):
    """A check of the trace failed; the message says where (scenario, seed, step) and how."""


class ObservedKV:
    """The KV-cache manager as the scheduler sees it: each call's contract is checked as it returns.
    Everything else is the manager's own (attributes pass through)."""

    def __init__(self, inner: Any, scenario: Scenario, holders: Callable[[], dict[int, list[str]]]) -> None:
        self._inner = inner
        self._scenario = scenario
        self._holders = holders  # block -> ids of the requests whose block table holds it
        self.lookups: dict[str, int] = {}  # request id -> tokens its last lookup found cached

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def get_computed_blocks(self, request: Request) -> tuple[list[int], int]:
        inner = self._inner
        queries, hits = inner.prefix_cache_queries, inner.prefix_cache_hits
        blocks, num_cached = inner.get_computed_blocks(request)
        blocks = list(blocks)
        where = f"get_computed_blocks(request {request.request_id!r} of {request.num_tokens} tokens)"
        _require(
            num_cached == len(blocks) * BLOCK_SIZE,
            f"{where} returned {len(blocks)} blocks said to hold {num_cached} tokens: cached blocks are full "
            f"({len(blocks)} x {BLOCK_SIZE} = {len(blocks) * BLOCK_SIZE} tokens)",
        )
        _require(
            num_cached == 0 or num_cached < request.num_tokens,
            f"{where} found all {num_cached} tokens cached: at least one token must be left to compute "
            "(the step needs its logits)",
        )
        reason = _uncacheable(request, self._scenario.prefix_caching)
        _require(not (reason and num_cached), f"{where} found {num_cached} tokens cached although {reason}")
        self._check_block_ids(where, blocks)
        grew_hits = inner.prefix_cache_hits - hits
        grew_queries = inner.prefix_cache_queries - queries
        _require(
            grew_hits == num_cached,
            f"{where} found {num_cached} tokens cached but prefix_cache_hits grew by {grew_hits}: "
            "hits count the tokens found in the cache",
        )
        _require(
            grew_hits <= grew_queries <= request.num_tokens,
            f"{where}: prefix_cache_queries grew by {grew_queries} (hits by {grew_hits}): queries count the "
            f"tokens looked up, at most the request's {request.num_tokens} and at least the hits",
        )
        self.lookups[request.request_id] = num_cached
        return blocks, num_cached

    def allocate_slots(
        self, request: Request, num_new_tokens: int, computed_blocks: Sequence[int] = ()
    ) -> list[int] | None:
        before, usage = list(request.block_ids), self._inner.usage
        others = {b: ids for b, ids in self._holders().items() if ids != [request.request_id]}
        new = self._inner.allocate_slots(request, num_new_tokens, computed_blocks)
        where = (
            f"allocate_slots(request {request.request_id!r}, {num_new_tokens} new tokens, "
            f"{len(computed_blocks)} cached blocks)"
        )
        if new is None:
            _require(
                request.block_ids == before,
                f"{where} returned None (out of blocks) but changed request.block_ids from {before} to "
                f"{request.block_ids}: it must change nothing",
            )
            _require(
                self._inner.usage == usage,
                f"{where} returned None (out of blocks) but usage went from {usage:.4f} to {self._inner.usage:.4f}: "
                "it must change nothing",
            )
            return None
        new = list(new)
        expected = before + list(computed_blocks) + new
        _require(
            request.block_ids == expected,
            f"{where} returned new blocks {new}, and request.block_ids is {request.block_ids}; expected {expected} "
            "(the blocks it held, then the cached blocks, then the new ones)",
        )
        self._check_block_ids(where, request.block_ids)
        taken = {b: others[b] for b in new if b in others}
        _require(not taken, f"{where} handed out blocks that other requests hold: {taken} (block: holders)")
        self.check_usage(where)
        return new

    def free(self, request: Request) -> None:
        held = list(request.block_ids)
        self._inner.free(request)
        where = f"free(request {request.request_id!r} holding blocks {held})"
        _require(
            request.block_ids == [],
            f"{where} left request.block_ids = {request.block_ids}: freeing empties the request's block table",
        )
        self.check_usage(where)

    def check_usage(self, after: str) -> None:
        held = self._holders()
        num_blocks, usage = self._scenario.num_blocks, self._inner.usage
        in_use = usage * num_blocks
        if abs(in_use - len(held)) > 1e-6:
            how = (
                "blocks were not released (a leak)"
                if in_use > len(held)
                else "blocks the requests hold are counted as free"
            )
            raise TraceFailure(
                f"after {after}: usage is {usage:.4f} ({in_use:g} of {num_blocks} blocks in use) but the requests "
                f"hold {len(held)} blocks {sorted(held)}: {how}. usage is the fraction of blocks requests hold "
                "(cached blocks no request holds count as free)"
            )

    def _check_block_ids(self, where: str, blocks: Sequence[int]) -> None:
        wrong = [b for b in blocks if not (isinstance(b, int) and 0 <= b < self._scenario.num_blocks)]
        _require(not wrong, f"{where}: block ids {wrong} are not in 0..{self._scenario.num_blocks - 1}")
        _require(len(set(blocks)) == len(blocks), f"{where}: a block appears twice in {list(blocks)}")


def _uncacheable(request: Request, prefix_caching: bool) -> str:
    """Why ``request`` may get nothing from the prefix cache ('' when it may)."""
    if not prefix_caching:
        return "prefix caching is off"
    if request.whole_prompt:
        return "the request has whole_prompt set (a pooling request that needs every prompt row computed)"
    if request.params.prompt_logprobs is not None:
        return "the request asks for prompt logprobs (every prompt row computed)"
    return ""


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise TraceFailure(message)


@dataclass
class _Slot:
    identity: Any  # the prefix (a hash chain over lora id and tokens) whose KV the slot holds
    writer: str
    step: int


@dataclass
class TraceRun:
    """One trace through ``scheduler_cls(config, ObservedKV(kv_manager_cls(...)))``; :meth:`run`
    returns figures (steps, preemptions, prefix-cache hits) or raises :class:`TraceFailure`."""

    scenario: Scenario
    seed: int
    scheduler_cls: Callable[..., Any]
    kv_manager_cls: Callable[..., Any]
    tracked: dict[str, Tracked] = field(default_factory=dict)
    extra_holders: list[Request] = field(default_factory=list)
    kv_contents: dict[int, list[_Slot | None]] = field(default_factory=dict)
    step: int = 0
    preemptions: int = 0

    def run(self) -> dict[str, int]:
        scenario = self.scenario
        inner = self.kv_manager_cls(scenario.num_blocks, BLOCK_SIZE, scenario.prefix_caching)
        self.kv = ObservedKV(inner, scenario, self._holders)
        self.scheduler = self.scheduler_cls(scenario.scheduler_config(), self.kv)
        try:
            self._drive(make_trace(scenario, self.seed))
            self._check_all_free()
        except TraceFailure as failure:
            raise TraceFailure(f"{scenario.name}, seed {self.seed}, step {self.step}: {failure}") from None
        return {"steps": self.step, "preemptions": self.preemptions, "prefix_cache_hits": inner.prefix_cache_hits}

    # -- the engine's loop ---------------------------------------------------------------------------

    def _drive(self, plans: list[Planned]) -> None:
        pending = list(plans)
        idle = 0
        limit = 40 * len(plans) + self.scenario.arrival_steps
        while pending or self._unfinished():
            while pending and pending[0].arrival <= self.step:
                self._arrive(pending.pop(0))
            self._end_by_engine()
            if not self._unfinished():
                self.step += 1
                continue
            out = self.scheduler.schedule()
            self._check_schedule(out)
            self._run_model(out)
            sampled = [self._sample(item) for item in out.scheduled]
            before = [item.request.num_output_tokens for item in out.scheduled]
            self.scheduler.update_from_output(out, sampled)
            for item in out.scheduled:  # the engine ends a pooling request in the step that pools it
                request = item.request
                if request.pooling_params is not None and item.completes_sequence and not request.is_finished:
                    self.scheduler.finish(request, RequestStatus.FINISHED_STOPPED)
            self._check_after_step(out, sampled, before)
            idle = idle + 1 if out.is_empty else 0
            _require(
                idle < 3,
                f"schedule() returned no work for 3 steps while {len(self._unfinished())} requests are unfinished "
                f"({self._statuses()}), usage {self.kv.usage:.2f}: the scheduler stalls",
            )
            self.step += 1
            _require(self.step < limit, f"requests still unfinished after {limit} steps: {self._statuses()}")

    def _arrive(self, plan: Planned) -> None:
        params: dict[str, Any] = {"ignore_eos": plan.ignore_eos, "stop_token_ids": list(plan.stop_token_ids)}
        request = new_request(
            plan.request_id,
            plan.prompt,
            max_tokens=plan.max_tokens,
            whole_prompt=plan.whole_prompt,
            prompt_logprobs=plan.prompt_logprobs,
            lora_id=plan.lora_id,
            **({} if plan.whole_prompt else params),
        )
        request.priority = plan.priority
        request.arrival_time = float(self.step) + len(self.tracked) * 1e-6  # arrival order, reproducibly
        expected, reasons = expected_output(plan, self.scenario.max_model_len)
        self.tracked[plan.request_id] = Tracked(plan, request, expected, reasons)
        self.scheduler.add_request(request)

    def _end_by_engine(self) -> None:
        for tracked in self.tracked.values():
            request, plan = tracked.request, tracked.plan
            if request.is_finished:
                continue
            if plan.abort_at == self.step:
                aborted = self.scheduler.abort_requests([plan.request_id])
                tracked.ended_by = "abort"
                _require(
                    request in aborted and request.status == RequestStatus.FINISHED_ABORTED,
                    f"abort_requests([{plan.request_id!r}]) of an unfinished request returned {aborted} and left it "
                    f"{request.status.value}: it must return the request, aborted",
                )
            elif plan.stop_at is not None and plan.stop_at <= self.step and request.output_token_ids:
                self.scheduler.finish(request, RequestStatus.FINISHED_STOPPED, stop_reason=STOP_STRING)
                tracked.ended_by = STOP_STRING
                _require(
                    request.status == RequestStatus.FINISHED_STOPPED and request.stop_reason == STOP_STRING,
                    f"finish({plan.request_id!r}, FINISHED_STOPPED, {STOP_STRING!r}) left it {request.status.value} "
                    f"with stop_reason {request.stop_reason!r}",
                )
            else:
                continue
            _require(
                request.block_ids == [],
                f"{tracked.label} was ended by the engine ({tracked.ended_by}) but still holds blocks "
                f"{request.block_ids}: ending a request frees its blocks",
            )
            self._check_request_tokens(tracked)
        self.kv.check_usage(f"the engine's aborts and stops of step {self.step}")
        self._check_counts()

    # -- checks --------------------------------------------------------------------------------------

    def _check_schedule(self, out: SchedulerOutput) -> None:
        scenario, items = self.scenario, out.scheduled
        ids = [item.request.request_id for item in items]
        _require(len(set(ids)) == len(ids), f"schedule() scheduled a request twice in one step: {ids}")
        _require(
            len(items) <= scenario.max_num_seqs,
            f"schedule() ran {len(items)} requests in one step; max_num_seqs is {scenario.max_num_seqs}",
        )
        total = sum(item.num_tokens for item in items)
        _require(
            total <= scenario.max_num_batched_tokens,
            f"schedule() scheduled {total} tokens in one step; max_num_batched_tokens is "
            f"{scenario.max_num_batched_tokens}",
        )
        for item in items:
            self._check_item(item)
        adapters = sorted({item.request.lora_id for item in items} - {0})
        _require(
            not scenario.max_loras or len(adapters) <= scenario.max_loras,
            f"schedule() ran {len(adapters)} LoRA adapters {adapters} in one step; max_loras is {scenario.max_loras}",
        )
        for request in out.preempted:
            tracked = self.tracked.get(request.request_id)
            _require(tracked is not None, f"schedule() preempted {request.request_id!r}, which was never added")
            tracked.preemptions += 1
            self.preemptions += 1
            rescheduled = request.request_id in ids
            _require(
                rescheduled or (not request.is_finished and request.status != RequestStatus.RUNNING),
                f"schedule() preempted {tracked.label} but left it {request.status.value}",
            )
            _require(
                rescheduled or request.block_ids == [],
                f"schedule() preempted {tracked.label} but it still holds blocks {request.block_ids}: a preempted "
                "request's KV is recomputed later, its blocks freed now",
            )
        count = getattr(self.scheduler, "num_preemptions", None)
        _require(
            count == self.preemptions,
            f"num_preemptions is {count} after {self.preemptions} requests were preempted "
            "(SchedulerOutput.preempted, every step)",
        )

    def _check_item(self, item: Any) -> None:
        request = item.request
        tracked = self.tracked.get(request.request_id)
        _require(tracked is not None, f"schedule() returned request {request.request_id!r}, which was never added")
        label, start, count = tracked.label, item.start, item.num_tokens
        _require(not request.is_finished, f"schedule() returned {label}, which has finished ({request.status.value})")
        _require(request.status == RequestStatus.RUNNING, f"schedule() returned {label} as {request.status.value}")
        _require(count >= 1, f"schedule() scheduled {count} tokens of {label}")
        _require(
            start + count <= request.num_tokens,
            f"schedule() scheduled tokens {start}..{start + count - 1} of {label}, which has {request.num_tokens}",
        )
        _require(
            request.num_computed_tokens == start + count,
            f"after schedule(), {label} has num_computed_tokens {request.num_computed_tokens}; it was scheduled "
            f"from {start} for {count} tokens, so {start + count}",
        )
        if tracked.plan.whole_prompt:
            _require(
                start == 0 and count == request.num_prompt_tokens,
                f"schedule() ran tokens {start}..{start + count - 1} of whole-prompt {label}: a pooling request "
                f"with whole_prompt runs its {request.num_prompt_tokens} prompt tokens in one step, from 0",
            )
        if not self.scenario.chunked_prefill:
            _require(
                item.completes_sequence,
                f"schedule() split {label} (tokens {start}..{start + count - 1} of {request.num_tokens}) "
                "with chunked prefill off",
            )
        if tracked.first_start is None:
            tracked.first_start = start
            _require(
                start == 0 or not tracked.plan.prompt_logprobs,
                f"schedule() first ran prompt-logprobs {label} from token {start}: every prompt row is needed",
            )
        blocks = request.block_ids
        _require(
            len(blocks) * BLOCK_SIZE >= start + count,
            f"{label} is scheduled up to token {start + count - 1} but its {len(blocks)} blocks {blocks} hold "
            f"{len(blocks) * BLOCK_SIZE} tokens",
        )
        self.kv._check_block_ids(f"the block table of {label}", blocks)

    def _run_model(self, out: SchedulerOutput) -> None:
        """Write each scheduled token's KV where the block table says, then check every position the
        scheduled requests attend to holds their own prefix (a step writes all its KV before reading)."""
        for item in out.scheduled:
            request, identities = item.request, self._identities(item.request)
            for position in range(item.start, item.start + item.num_tokens):
                block, offset = request.block_ids[position // BLOCK_SIZE], position % BLOCK_SIZE
                slots = self.kv_contents.setdefault(block, [None] * BLOCK_SIZE)
                slots[offset] = _Slot(identities[position], request.request_id, self.step)
        for item in out.scheduled:
            self._check_reads(item)

    def _check_reads(self, item: Any) -> None:
        request, tracked = item.request, self.tracked[item.request.request_id]
        identities = self._identities(request)
        for position in range(item.start):
            block, offset = request.block_ids[position // BLOCK_SIZE], position % BLOCK_SIZE
            slot = self.kv_contents.get(block, [None] * BLOCK_SIZE)[offset]
            if slot is not None and slot.identity == identities[position]:
                continue
            held = "nothing (never written)" if slot is None else _describe(slot, self.tracked)
            cached = self.kv.lookups.get(request.request_id, 0)
            hint = " (a prefix-cache hit: get_computed_blocks gave this block)" if position < cached else ""
            raise TraceFailure(
                f"{tracked.label}, scheduled from token {item.start}, attends to token {position} in block {block} "
                f"slot {offset}{hint}, which holds {held}: not this request's own prefix (its block table is "
                f"{request.block_ids})"
            )

    def _identities(self, request: Request) -> list[Any]:
        """What the KV at each position of ``request`` is: a hash chain over its adapter and tokens
        (a whole-prompt request's KV is its own: no other request may read it)."""
        if request.whole_prompt:
            return [("whole-prompt", request.request_id, p) for p in range(request.num_tokens)]
        value: Any = ("kv", request.lora_id)
        chain = []
        for token in request.all_token_ids:
            value = hash((value, token))
            chain.append(value)
        return chain

    def _sample(self, item: Any) -> int | None:
        request = item.request
        if request.pooling_params is not None or not item.completes_sequence:
            return None
        return stand_in_token(request.lora_id, request.all_token_ids)

    def _check_after_step(self, out: SchedulerOutput, sampled: list[int | None], before: list[int]) -> None:
        for item, token, count in zip(out.scheduled, sampled, before, strict=True):
            request, tracked = item.request, self.tracked[item.request.request_id]
            if token is not None and tracked.ended_by is None:
                outputs = request.output_token_ids
                _require(
                    len(outputs) == count + 1 and outputs[-1] == token,
                    f"update_from_output with the token {token} for {tracked.label} took its outputs from {count} "
                    f"tokens to {len(outputs)} ending {outputs[-3:]}: it appends the sampled token",
                )
        for tracked in self.tracked.values():
            if not tracked.final_checked:
                self._check_request_tokens(tracked)
        self.kv.check_usage(f"step {self.step}")
        self._check_counts()

    def _check_request_tokens(self, tracked: Tracked) -> None:
        request, plan = tracked.request, tracked.plan
        outputs = list(request.output_token_ids)
        _require(
            len(outputs) >= tracked.num_outputs,
            f"{tracked.label} had {tracked.num_outputs} output tokens and now has {len(outputs)}: generated tokens "
            "are kept (a preempted request recomputes its KV, not its tokens)",
        )
        tracked.num_outputs = len(outputs)
        _require(
            request.all_token_ids == plan.prompt + outputs,
            f"{tracked.label}: all_token_ids is no longer its prompt followed by its outputs {outputs}",
        )
        _require(
            outputs == tracked.expected[: len(outputs)],
            f"{tracked.label} has outputs {outputs}; the same request run alone gives {tracked.expected}",
        )
        if not request.is_finished:
            _require(
                len(outputs) < len(tracked.expected) or plan.whole_prompt,
                f"{tracked.label} has all {len(outputs)} tokens of its output (ending: {'/'.join(tracked.reasons)}) "
                "but is not finished: update_from_output finishes a request on EOS, a stop token, max_tokens or "
                "the context length",
            )
            return
        tracked.final_checked = True
        reason = request.status.finish_reason
        if tracked.ended_by is None:
            _require(
                outputs == tracked.expected and reason in tracked.reasons,
                f"{tracked.label} finished ({reason}) with {outputs}; the same request run alone finishes "
                f"({'/'.join(sorted(tracked.reasons))}) with {tracked.expected}",
            )
        _require(
            request.block_ids == [],
            f"{tracked.label} finished ({reason}) but still holds blocks {request.block_ids}: a finished "
            "request's blocks are freed",
        )

    def _check_counts(self) -> None:
        unfinished = self._unfinished()
        scheduler = self.scheduler
        _require(
            scheduler.has_unfinished_requests() == bool(unfinished),
            f"has_unfinished_requests() is {scheduler.has_unfinished_requests()} with {len(unfinished)} "
            "requests unfinished",
        )
        counted = scheduler.num_running + scheduler.num_waiting
        _require(
            counted == len(unfinished),
            f"num_running {scheduler.num_running} + num_waiting {scheduler.num_waiting} = {counted}, but "
            f"{len(unfinished)} requests are unfinished ({self._statuses()})",
        )
        if self.scenario.max_loras:
            running, waiting = scheduler.lora_counts()
            expected_running = _count_adapters(
                t.request for t in unfinished if t.request.status == RequestStatus.RUNNING
            )
            expected_waiting = _count_adapters(
                t.request for t in unfinished if t.request.status != RequestStatus.RUNNING
            )
            _require(
                (dict(running), dict(waiting)) == (expected_running, expected_waiting),
                f"lora_counts() is ({dict(running)}, {dict(waiting)}); the requests running and waiting per "
                f"adapter are ({expected_running}, {expected_waiting})",
            )

    def _check_all_free(self) -> None:
        """Every request has ended: every block is free, and a request needing the whole pool gets it."""
        self.kv.check_usage("every request ended")
        _require(self.kv.usage == 0, f"after every request ended, usage is {self.kv.usage}: blocks leaked")
        size = self.scenario.num_blocks * BLOCK_SIZE
        probe = new_request("whole-pool-probe", [2 + i % (VOCAB - 2) for i in range(size)])
        self.extra_holders.append(probe)
        new = self.kv.allocate_slots(probe, size)
        _require(
            new is not None and len(probe.block_ids) == self.scenario.num_blocks,
            f"after every request ended, a request needing all {self.scenario.num_blocks} blocks got "
            f"{None if new is None else len(probe.block_ids)}: blocks leaked",
        )
        self.kv.free(probe)
        self.extra_holders.remove(probe)

    # -- bookkeeping ---------------------------------------------------------------------------------

    def _unfinished(self) -> list[Tracked]:
        return [t for t in self.tracked.values() if not t.request.is_finished]

    def _holders(self) -> dict[int, list[str]]:
        holders: dict[int, list[str]] = {}
        for request in [t.request for t in self.tracked.values()] + self.extra_holders:
            for block in request.block_ids:
                holders.setdefault(block, []).append(request.request_id)
        return holders

    def _statuses(self) -> str:
        unfinished = self._unfinished()
        shown = ", ".join(f"{t.plan.request_id} {t.request.status.value}" for t in unfinished[:8])
        return shown + (f" and {len(unfinished) - 8} more" if len(unfinished) > 8 else "")


def _describe(slot: _Slot, tracked: dict[str, Tracked]) -> str:
    if isinstance(slot.identity, tuple) and slot.identity[:1] == ("whole-prompt",):
        return (
            f"the KV of whole-prompt request {slot.writer!r} (written at step {slot.step}), which no other request "
            "may reuse"
        )
    owner = tracked.get(slot.writer)
    adapter = f" (LoRA adapter {owner.request.lora_id})" if owner and owner.request.lora_id else ""
    return f"KV written by request {slot.writer!r}{adapter} at step {slot.step} for another prefix"


def _count_adapters(requests: Iterable[Request]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for request in requests:
        if request.lora_id:
            counts[request.lora_id] = counts.get(request.lora_id, 0) + 1
    return counts
