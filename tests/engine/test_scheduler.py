"""Model-free tests of the default Scheduler: budget, chunked prefill, policies, preemption, stopping."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterator

import pytest

from llmp.api import RequestValidationError
from llmp.engine.kv_cache import BlockKVCacheManager
from llmp.engine.request import Request, RequestStatus
from llmp.engine.scheduler import Scheduler, SchedulerConfig, SchedulerOutput, check_priority
from llmp.options import EngineConfig
from llmp.sampling_params import SamplingParams

BS = 4  # block size used throughout
EOS = 2

_clock = itertools.count(1)
_bases = itertools.count(1)


def make(
    request_id: str,
    prompt: list[int] | int,
    *,
    max_tokens: int = 16,
    priority: int = 0,
    arrival: float | None = None,
    eos: frozenset[int] = frozenset({EOS}),
    **params,
) -> Request:
    if isinstance(prompt, int):  # distinct tokens per request, so no accidental prefix hits
        base = 1000 * next(_bases)
        tokens = list(range(base, base + prompt))
    else:
        tokens = list(prompt)
    return Request(
        request_id,
        tokens,
        SamplingParams(**params),
        eos_token_ids=eos,
        max_tokens=max_tokens,
        priority=priority,
        arrival_time=float(next(_clock)) if arrival is None else arrival,
    )


DEFAULTS = SchedulerConfig.from_engine_config(EngineConfig(), max_model_len=4096)


def make_scheduler(num_blocks: int = 64, *, prefix_caching: bool = True, **config) -> Scheduler:
    return Scheduler(dataclasses.replace(DEFAULTS, **config), BlockKVCacheManager(num_blocks, BS, prefix_caching))


def default_token(request: Request) -> int:
    return 100 + request.num_output_tokens  # never EOS


def sample(out: SchedulerOutput, token: Callable[[Request], int] = default_token) -> list[int | None]:
    return [token(item.request) if item.completes_sequence else None for item in out.scheduled]


def step(s: Scheduler, token: Callable[[Request], int] = default_token) -> tuple[SchedulerOutput, list[Request]]:
    out = s.schedule()
    return out, s.update_from_output(out, sample(out, token))


def items(out: SchedulerOutput) -> list[tuple[str, int, int, bool]]:
    """(id, start, num_tokens, completes_sequence); take it before update_from_output appends tokens."""
    return [(i.request.request_id, i.start, i.num_tokens, i.completes_sequence) for i in out.scheduled]


def step_items(
    s: Scheduler, token: Callable[[Request], int] = default_token
) -> tuple[SchedulerOutput, list[tuple[str, int, int, bool]], list[Request]]:
    out = s.schedule()
    snapshot = items(out)
    return out, snapshot, s.update_from_output(out, sample(out, token))


def run(s: Scheduler, token: Callable[[Request], int] = default_token, max_steps: int = 500) -> list[SchedulerOutput]:
    outs = []
    for _ in range(max_steps):
        if not s.has_unfinished_requests():
            return outs
        out, _ = step(s, token)
        assert not out.is_empty or out.preempted, "scheduler made no progress"
        outs.append(out)
    raise AssertionError("requests did not finish")


def scripted(tokens: list[int]) -> Callable[[Request], int]:
    it: Iterator[int] = iter(tokens)
    return lambda request: next(it)


def ids(out: SchedulerOutput) -> list[str]:
    return [item.request.request_id for item in out.scheduled]


# -- config ------------------------------------------------------------------


def test_the_engine_config_rejects_what_the_scheduler_cannot_take() -> None:
    """The scheduler's values come from EngineConfig, which checks them once."""
    with pytest.raises(ValueError, match="scheduling_policy must be fcfs or priority, got 'lifo'"):
        EngineConfig(scheduling_policy="lifo")
    with pytest.raises(ValueError, match="max_num_seqs"):
        EngineConfig(max_num_seqs=0)
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        EngineConfig(max_num_batched_tokens=0)


def test_config_comes_from_the_engine_config() -> None:
    engine = EngineConfig(
        max_num_seqs=7, max_num_batched_tokens=64, enable_chunked_prefill=False, scheduling_policy="priority"
    )
    config = SchedulerConfig.from_engine_config(engine, max_model_len=128)
    assert config == SchedulerConfig(
        max_num_seqs=7, max_num_batched_tokens=64, max_model_len=128, enable_chunked_prefill=False, policy="priority"
    )
    assert DEFAULTS.max_num_seqs == EngineConfig().max_num_seqs and DEFAULTS.policy == "fcfs"


# -- requests ----------------------------------------------------------------


def test_duplicate_request_id_is_rejected() -> None:
    s = make_scheduler()
    first = make("a", 4, max_tokens=1)
    s.add_request(first)
    with pytest.raises(ValueError, match="already in use"):
        s.add_request(make("a", 5))
    assert s.num_waiting == 1 and s.waiting[0] is first
    run(s)
    s.add_request(make("a", 3))  # a finished request's id is free again
    assert s.num_waiting == 1


def test_has_unfinished_requests() -> None:
    s = make_scheduler()
    assert not s.has_unfinished_requests()
    assert s.schedule().is_empty
    s.add_request(make("a", 4, max_tokens=2))
    assert s.has_unfinished_requests()
    step(s)
    assert s.has_unfinished_requests() and s.num_running == 1
    step(s)
    assert not s.has_unfinished_requests()
    assert s.num_running == 0 and s.num_waiting == 0


# -- token budget and chunked prefill ----------------------------------------


def test_token_budget_is_respected() -> None:
    s = make_scheduler(max_num_batched_tokens=8)
    reqs = [make("a", 10, max_tokens=3), make("b", 7, max_tokens=3), make("c", 6, max_tokens=3)]
    for r in reqs:
        s.add_request(r)
    outs = run(s)
    assert all(0 < out.num_tokens <= 8 for out in outs)
    assert outs[0].num_tokens == 8
    # every prompt token and every sampled token but the last is computed exactly once
    assert sum(out.num_tokens for out in outs) == 10 + 7 + 6 + 3 * 2
    for r in reqs:
        assert r.status == RequestStatus.FINISHED_LENGTH
        assert r.output_token_ids == [100, 101, 102]


def test_chunked_prefill_splits_a_long_prompt() -> None:
    s = make_scheduler(max_num_batched_tokens=8)
    a = make("a", 20, max_tokens=4)
    s.add_request(a)

    chunks = []
    for _ in range(3):
        _, snapshot, updated = step_items(s)
        ((_, start, num, completes),) = snapshot
        chunks.append((start, num, completes))
        if not completes:
            assert updated == [] and a.output_token_ids == []
    assert chunks == [(0, 8, False), (8, 8, False), (16, 4, True)]
    assert s.num_prefill_chunks == 2
    assert a.num_computed_tokens == 20
    assert a.output_token_ids == [100]  # sampled only on the completing chunk

    _, snapshot, updated = step_items(s)  # now a decode
    assert snapshot == [("a", 20, 1, True)]
    assert updated == [a] and a.output_token_ids == [100, 101]
    assert s.num_prefill_chunks == 2


def test_decode_and_prefill_share_a_step() -> None:
    s = make_scheduler(max_num_batched_tokens=8)
    a = make("a", 4)
    s.add_request(a)
    step(s)
    b = make("b", 10)
    s.add_request(b)
    out, snapshot, updated = step_items(s)
    assert snapshot == [("a", 4, 1, True), ("b", 0, 7, False)]  # running requests first
    assert out.num_tokens == 8
    assert updated == [a]
    out, _ = step(s)
    assert [(i.request.request_id, i.start, i.num_tokens) for i in out.scheduled] == [("a", 5, 1), ("b", 7, 3)]
    assert b.output_token_ids == [100]


def test_without_chunked_prefill_a_prompt_is_never_split() -> None:
    s = make_scheduler(max_num_batched_tokens=8, enable_chunked_prefill=False)
    a = make("a", 6, max_tokens=3)
    b = make("b", 6, max_tokens=3)
    s.add_request(a)
    s.add_request(b)
    out, _ = step(s)
    assert ids(out) == ["a"]  # b would need a split (2 tokens left)
    assert b.status == RequestStatus.WAITING and b.num_computed_tokens == 0
    out, _ = step(s)
    assert [(i.request.request_id, i.num_tokens) for i in out.scheduled] == [("a", 1), ("b", 6)]
    run(s)
    assert s.num_prefill_chunks == 0


def test_without_chunked_prefill_a_too_long_prompt_waits() -> None:
    s = make_scheduler(max_num_batched_tokens=8, enable_chunked_prefill=False)
    a = make("a", 10)
    s.add_request(a)
    assert s.schedule().is_empty
    assert a.status == RequestStatus.WAITING and a.block_ids == []
    assert s.kv.num_free_blocks == s.kv.num_blocks
    # with chunking it would have started
    s2 = make_scheduler(max_num_batched_tokens=8)
    s2.add_request(make("a", 10))
    assert s2.schedule().num_tokens == 8


def test_max_num_seqs_is_respected() -> None:
    s = make_scheduler(max_num_seqs=2)
    s.add_request(make("a", 3, max_tokens=2))
    s.add_request(make("b", 3, max_tokens=5))
    s.add_request(make("c", 3, max_tokens=2))
    out, _ = step(s)
    assert ids(out) == ["a", "b"]
    assert s.num_running == 2 and s.num_waiting == 1
    out, _ = step(s)  # a finishes here
    assert ids(out) == ["a", "b"]
    out, _ = step(s)
    assert ids(out) == ["b", "c"]
    for out in run(s):
        assert len(out.scheduled) <= 2


def test_prefix_cache_hit_skips_cached_tokens() -> None:
    s = make_scheduler()
    a = make("a", list(range(1, 10)), max_tokens=1)
    s.add_request(a)
    run(s)
    b = make("b", list(range(1, 9)) + [50, 51], max_tokens=1)
    s.add_request(b)
    out, _ = step(s)
    (item,) = out.scheduled
    assert (item.start, item.num_tokens) == (8, 2)
    assert b.num_cached_tokens == 8
    assert a.num_cached_tokens == 0
    assert s.kv.prefix_cache_hits == 8


# -- ordering and policies ---------------------------------------------------


def test_fcfs_admits_in_arrival_order_ignoring_priority() -> None:
    s = make_scheduler(max_num_seqs=1)
    s.add_request(make("c", 3, max_tokens=1, arrival=3.0, priority=0))
    s.add_request(make("a", 3, max_tokens=1, arrival=1.0, priority=9))
    s.add_request(make("b", 3, max_tokens=1, arrival=2.0, priority=5))
    order = [ids(out) for out in run(s)]
    assert order == [["a"], ["b"], ["c"]]


def test_priority_policy_admits_lower_value_first_then_by_arrival() -> None:
    s = make_scheduler(max_num_seqs=1, policy="priority")
    s.add_request(make("p5", 3, max_tokens=1, priority=5, arrival=1.0))
    s.add_request(make("p0-late", 3, max_tokens=1, priority=0, arrival=3.0))
    s.add_request(make("p3", 3, max_tokens=1, priority=3, arrival=2.0))
    s.add_request(make("p0-early", 3, max_tokens=1, priority=0, arrival=0.5))
    order = [ids(out) for out in run(s)]
    assert order == [["p0-early"], ["p0-late"], ["p3"], ["p5"]]


def test_priority_preemption_picks_the_lowest_priority_running_request() -> None:
    # 3 blocks of 4 tokens; every request has a 1-token prompt, so the first to reach
    # 5 tokens (a) needs a second block while all three are taken.
    s = make_scheduler(num_blocks=3, policy="priority")
    a = make("a", 1, priority=0)
    low = make("low", 1, priority=9)
    mid = make("mid", 1, priority=5)
    s.add_request(a)
    step(s)
    s.add_request(low)
    step(s)
    s.add_request(mid)
    step(s)
    assert [r.request_id for r in s.running] == ["a", "low", "mid"]
    assert s.kv.num_free_blocks == 0
    step(s)
    out, _ = step(s)  # a computes its 5th token
    assert out.preempted == [low]  # not running[-1] (mid), as FCFS would pick
    assert ids(out) == ["a", "mid"]
    assert low.status == RequestStatus.PREEMPTED
    assert low.block_ids == [] and low.num_computed_tokens == 0
    assert s.num_preemptions == 1 and low.num_preemptions == 1
    assert s.waiting == [low]
    assert len(a.block_ids) == 2


def test_priority_preemption_breaks_ties_by_latest_arrival() -> None:
    s = make_scheduler(num_blocks=3, policy="priority")
    a = make("a", 1, priority=0, arrival=1.0)
    early = make("early", 1, priority=5, arrival=2.0)
    late = make("late", 1, priority=5, arrival=3.0)
    for request in (a, late, early):
        s.add_request(request)
    step(s)
    assert [r.request_id for r in s.running] == ["a", "early", "late"]
    for _ in range(4):
        out, _ = step(s)
        if out.preempted:
            break
    assert out.preempted == [late, early]  # equal priority: the later arrival goes first


def test_nonzero_priority_needs_the_priority_policy() -> None:
    check_priority(0, "fcfs")
    check_priority(-3, "priority")
    with pytest.raises(RequestValidationError, match="Got priority 2 but Priority scheduling is not enabled") as info:
        check_priority(2, "fcfs")
    assert info.value.field == "priority"


def test_priority_preemption_never_leaves_the_victim_scheduled() -> None:
    s = make_scheduler(num_blocks=2, policy="priority")
    low = make("low", 1, priority=9)
    s.add_request(low)
    step(s)
    high = make("high", 4, priority=0)
    s.add_request(high)
    step(s)  # low decodes, high prefills: both blocks taken
    assert [r.request_id for r in s.running] == ["low", "high"]
    outputs_before = list(low.output_token_ids)
    out, _ = step(s)  # low fits its block; high needs a second one -> low is the victim
    assert out.preempted == [low]
    assert low.status == RequestStatus.PREEMPTED
    assert all(item.request is not low for item in out.scheduled)
    assert low.output_token_ids == outputs_before


def test_a_waiting_request_never_preempts_a_running_one() -> None:
    """As in vLLM: priority orders the queue and picks the victim when a running request needs
    blocks; a waiting request of higher priority waits for free blocks."""
    s = make_scheduler(num_blocks=2, policy="priority")
    low = make("low", BS + 1, priority=9, max_tokens=BS)  # two blocks, which its decodes fit in
    s.add_request(low)
    step(s)
    high = make("high", 1, priority=0)
    s.add_request(high)
    for _ in range(2):
        out, _ = step(s)
        assert out.preempted == [] and ids(out) == ["low"]
    assert s.running == [low] and s.waiting == [high] and s.num_preemptions == 0


# -- preemption by recompute -------------------------------------------------


def test_preemption_by_recompute_when_kv_blocks_run_out() -> None:
    s = make_scheduler(num_blocks=3)
    a = make("a", 4, max_tokens=4)  # needs 2 blocks at most, so b's cached block survives
    b = make("b", 4, max_tokens=6)
    s.add_request(a)
    s.add_request(b)
    out, _ = step(s)
    assert ids(out) == ["a", "b"]
    assert s.kv.num_free_blocks == 1

    out, _ = step(s)  # both need a 2nd block, only one is left
    assert ids(out) == ["a"]
    assert out.preempted == [b]  # FCFS: the last running request
    assert b.status == RequestStatus.PREEMPTED
    assert b.block_ids == [] and b.num_computed_tokens == 0
    assert b.output_token_ids == [100]  # generated tokens are kept
    assert s.num_preemptions == 1 and b.num_preemptions == 1
    assert s.running == [a] and s.waiting == [b]
    assert s.kv.num_free_blocks == 1  # b's block went back

    snapshots = []
    for _ in range(50):
        if not s.has_unfinished_requests():
            break
        _, snapshot, _ = step_items(s)
        snapshots.append(snapshot)
    assert a.status == RequestStatus.FINISHED_LENGTH and b.status == RequestStatus.FINISHED_LENGTH
    assert a.output_token_ids == [100, 101, 102, 103]
    assert b.output_token_ids == [100, 101, 102, 103, 104, 105]
    # b resumed after a finished: its full first block came from the prefix cache, its kept token is recomputed
    resume = next(item for snapshot in snapshots for item in snapshot if item[0] == "b")
    assert resume == ("b", 4, 1, True)
    assert b.num_cached_tokens == 0  # only the first schedule sets it
    assert s.num_preemptions == 1
    assert s.kv.num_free_blocks == 3
    assert not s.has_unfinished_requests()


def test_no_admission_in_a_step_that_preempted() -> None:
    s = make_scheduler(num_blocks=3, policy="priority")
    a = make("a", 4, max_tokens=3, priority=0)
    b = make("b", 8, max_tokens=3, priority=5)  # 2 blocks
    s.add_request(a)
    s.add_request(b)
    step(s)
    assert s.kv.num_free_blocks == 0
    c = make("c", 3, max_tokens=1, priority=1)  # ahead of b in the queue, fits in one block
    s.add_request(c)
    out, _ = step(s)  # a needs a 2nd block: b is preempted, a takes one of its two blocks
    assert out.preempted == [b]
    assert s.kv.num_free_blocks == 1
    assert ids(out) == ["a"]
    assert c.status == RequestStatus.WAITING
    assert s.waiting == [c, b]
    out, _ = step(s)
    assert ids(out) == ["a", "c"]


def test_preempted_request_resumes_without_prefix_caching() -> None:
    s = make_scheduler(num_blocks=3, prefix_caching=False)
    a = make("a", 4, max_tokens=6)
    b = make("b", 4, max_tokens=6)
    s.add_request(a)
    s.add_request(b)
    outs = run(s)
    assert any(b in out.preempted for out in outs)
    resume = [item for out in outs for item in out.scheduled if item.request is b][1]
    assert resume.start == 0 and resume.num_tokens == 5  # prompt + its kept token, recomputed
    assert b.output_token_ids == [100, 101, 102, 103, 104, 105]
    assert s.kv.num_free_blocks == 3


# -- stopping ----------------------------------------------------------------


def test_stop_on_eos() -> None:
    s = make_scheduler()
    a = make("a", 5, max_tokens=10)
    s.add_request(a)
    outs = run(s, scripted([7, 8, EOS]))
    assert len(outs) == 3
    assert a.output_token_ids == [7, 8, EOS]
    assert a.status == RequestStatus.FINISHED_STOPPED
    assert a.status.finish_reason == "stop"
    assert a.is_finished
    assert a.block_ids == [] and s.kv.num_free_blocks == s.kv.num_blocks
    assert s.running == [] and "a" not in s.requests


def test_eos_leaves_stop_reason_none() -> None:
    s = make_scheduler()
    a = make("a", 5, max_tokens=10)
    s.add_request(a)
    run(s, scripted([EOS]))
    assert a.status == RequestStatus.FINISHED_STOPPED
    assert a.stop_reason is None


def test_eos_or_a_stop_token_on_the_last_allowed_token_is_a_stop() -> None:
    # as vLLM 0.32's check_stop (v1/core/sched/utils.py): end and stop tokens are checked before the length cap
    s = make_scheduler()
    a = make("a", 5, max_tokens=2)
    b = make("b", 5, max_tokens=1, stop_token_ids=[42])
    c = make("c", 5, max_tokens=2, min_tokens=2)
    s.add_request(a)
    s.add_request(b)
    s.add_request(c)
    streams = {"a": iter([7, EOS]), "b": iter([42]), "c": iter([EOS, EOS])}
    run(s, lambda r: next(streams[r.request_id]))
    assert a.output_token_ids == [7, EOS] and (a.status, a.stop_reason) == (RequestStatus.FINISHED_STOPPED, None)
    assert b.output_token_ids == [42] and (b.status, b.stop_reason) == (RequestStatus.FINISHED_STOPPED, 42)
    assert c.output_token_ids == [EOS, EOS] and c.status == RequestStatus.FINISHED_STOPPED  # min_tokens reached


def test_a_token_other_than_eos_on_the_last_allowed_token_is_the_length() -> None:
    s = make_scheduler()
    a = make("a", 5, max_tokens=2)
    s.add_request(a)
    run(s, scripted([7, 8]))
    assert a.status == RequestStatus.FINISHED_LENGTH


def test_stop_on_stop_token_ids_sets_stop_reason() -> None:
    s = make_scheduler()
    a = make("a", 5, max_tokens=10, stop_token_ids=[42, 43])
    s.add_request(a)
    run(s, scripted([7, 43]))
    assert a.output_token_ids == [7, 43]
    assert a.status == RequestStatus.FINISHED_STOPPED
    assert a.stop_reason == 43


def test_stop_token_ids_apply_even_with_ignore_eos() -> None:
    s = make_scheduler()
    a = make("a", 5, max_tokens=10, stop_token_ids=[42], ignore_eos=True)
    s.add_request(a)
    run(s, scripted([EOS, 42]))
    assert a.output_token_ids == [EOS, 42]
    assert a.status == RequestStatus.FINISHED_STOPPED and a.stop_reason == 42


def test_stop_on_max_tokens() -> None:
    s = make_scheduler()
    a = make("a", 5, max_tokens=3)
    s.add_request(a)
    outs = run(s)
    assert len(outs) == 3
    assert a.num_output_tokens == 3
    assert a.status == RequestStatus.FINISHED_LENGTH
    assert a.status.finish_reason == "length"
    assert a.stop_reason is None


def test_stop_on_max_model_len() -> None:
    s = make_scheduler(max_model_len=8)
    a = make("a", 5, max_tokens=100)
    s.add_request(a)
    run(s)
    assert a.num_tokens == 8 and a.num_output_tokens == 3
    assert a.status == RequestStatus.FINISHED_LENGTH
    assert a.stop_reason is None


def test_ignore_eos_keeps_generating_until_max_tokens() -> None:
    s = make_scheduler()
    a = make("a", 5, max_tokens=4, ignore_eos=True)
    s.add_request(a)
    run(s, scripted([EOS, 7, EOS, 8]))
    assert a.output_token_ids == [EOS, 7, EOS, 8]
    assert a.status == RequestStatus.FINISHED_LENGTH


def test_min_tokens_delays_eos_and_stop_tokens() -> None:
    s = make_scheduler()
    a = make("a", 5, max_tokens=10, min_tokens=3)
    b = make("b", 5, max_tokens=10, min_tokens=2, stop_token_ids=[42])
    s.add_request(a)
    s.add_request(b)
    streams = {"a": iter([EOS, EOS, EOS]), "b": iter([42, 42])}
    run(s, lambda r: next(streams[r.request_id]))
    assert a.output_token_ids == [EOS, EOS, EOS]  # EOS counts only once min_tokens are out
    assert a.status == RequestStatus.FINISHED_STOPPED
    assert b.output_token_ids == [42, 42]
    assert b.status == RequestStatus.FINISHED_STOPPED and b.stop_reason == 42


def test_eos_set_of_several_tokens() -> None:
    s = make_scheduler()
    a = make("a", 5, max_tokens=10, eos=frozenset({2, 3}))
    s.add_request(a)
    run(s, scripted([7, 3]))
    assert a.output_token_ids == [7, 3]
    assert a.status == RequestStatus.FINISHED_STOPPED


def test_update_skips_none_and_returns_updated_requests() -> None:
    s = make_scheduler(max_num_batched_tokens=6)
    a = make("a", 3)
    b = make("b", 10)
    s.add_request(a)
    s.add_request(b)
    out = s.schedule()
    assert [i.completes_sequence for i in out.scheduled] == [True, False]
    updated = s.update_from_output(out, [55, None])
    assert updated == [a]
    assert a.output_token_ids == [55] and b.output_token_ids == []
    with pytest.raises(ValueError):
        s.update_from_output(out, [1])  # one token per scheduled item


# -- abort -------------------------------------------------------------------


def test_abort_frees_blocks_of_running_and_waiting_requests() -> None:
    s = make_scheduler(num_blocks=8, max_num_seqs=1)
    a = make("a", 9)
    b = make("b", 4)
    s.add_request(a)
    s.add_request(b)
    step(s)
    assert a.status == RequestStatus.RUNNING and len(a.block_ids) == 3
    assert b.status == RequestStatus.WAITING
    assert s.kv.num_free_blocks == 5

    aborted = s.abort_requests(["a", "b", "unknown"])
    assert aborted == [a, b]
    assert a.status == RequestStatus.FINISHED_ABORTED and b.status == RequestStatus.FINISHED_ABORTED
    assert a.status.finish_reason == "abort"
    assert a.block_ids == []
    assert s.kv.num_free_blocks == 8 and s.kv.usage == 0.0
    assert s.running == [] and s.waiting == []
    assert not s.has_unfinished_requests()
    assert s.abort_requests(["a"]) == []  # already gone
    assert s.schedule().is_empty


def test_abort_a_preempted_request() -> None:
    s = make_scheduler(num_blocks=3)
    a = make("a", 4, max_tokens=6)
    b = make("b", 4, max_tokens=6)
    s.add_request(a)
    s.add_request(b)
    step(s)
    out, _ = step(s)
    assert out.preempted == [b]
    assert s.abort_requests(["b"]) == [b]
    assert b.status == RequestStatus.FINISHED_ABORTED
    assert s.waiting == [] and s.running == [a]
    run(s)
    assert s.kv.num_free_blocks == 3


def test_abort_between_schedule_and_update_drops_the_token() -> None:
    s = make_scheduler()
    a = make("a", 4)
    s.add_request(a)
    out = s.schedule()
    s.abort_requests(["a"])
    assert s.update_from_output(out, sample(out)) == []
    assert a.output_token_ids == []
    assert a.status == RequestStatus.FINISHED_ABORTED


# -- prefix cache and chunking together --------------------------------------


def test_partly_computed_block_is_not_a_prefix_hit() -> None:
    s = make_scheduler(max_num_batched_tokens=5)
    prompt = list(range(1, 11))  # 10 tokens: blocks [1..4], [5..8], tail [9, 10]
    a = make("a", prompt)
    s.add_request(a)
    out, _ = step(s)  # computes tokens 1..5 only
    assert out.scheduled[0].num_tokens == 5
    s.abort_requests(["a"])
    b = make("b", prompt)
    s.add_request(b)
    out = s.schedule()
    assert b.num_cached_tokens <= 4
    assert out.scheduled[0].start <= 4


# -- LoRA adapters -----------------------------------------------------------


def with_adapter(request: Request, lora_id: int) -> Request:
    request.lora_id = lora_id
    return request


def test_max_loras_comes_from_the_engine_config_only_with_lora_enabled() -> None:
    assert SchedulerConfig.from_engine_config(EngineConfig(max_loras=3), max_model_len=128).max_loras == 0
    config = SchedulerConfig.from_engine_config(EngineConfig(enable_lora=True, max_loras=3), max_model_len=128)
    assert config.max_loras == 3


def test_a_third_adapter_is_skipped_not_waited_on() -> None:
    """Under max_loras=2 the request of a third adapter stays waiting while those behind it
    (the base model's, a running adapter's) are admitted; it runs once an adapter is free."""
    s = make_scheduler(max_loras=2)
    for request in (
        with_adapter(make("a1", 4, max_tokens=2), 1),
        with_adapter(make("b", 4, max_tokens=6), 2),
        with_adapter(make("c", 4, max_tokens=2), 3),
        make("base", 4, max_tokens=2),
        with_adapter(make("a2", 4, max_tokens=2), 1),
    ):
        s.add_request(request)
    out, _ = step(s)
    assert ids(out) == ["a1", "b", "base", "a2"]
    assert [r.request_id for r in s.waiting] == ["c"]
    assert s.lora_counts() == ({1: 2, 2: 1}, {3: 1})
    out, _ = step(s)  # a1, a2 and base finish: adapter 1 leaves, but b (adapter 2) still runs
    assert "c" not in ids(out)
    out, _ = step(s)
    assert ids(out) == ["b", "c"]
    assert s.lora_counts() == ({2: 1, 3: 1}, {})
    run(s)
    assert s.lora_counts() == ({}, {})


def test_without_max_loras_the_waiting_queue_is_unchanged_by_adapters() -> None:
    s = make_scheduler(max_loras=4)
    for i in range(4):
        s.add_request(with_adapter(make(f"r{i}", 4, max_tokens=1), i + 1))
    assert ids(s.schedule()) == ["r0", "r1", "r2", "r3"]


def test_under_preemption_no_step_runs_more_adapters_than_max_loras() -> None:
    s = make_scheduler(num_blocks=12, max_loras=2, max_num_batched_tokens=16)
    requests = [with_adapter(make(f"r{i}", 5 + i % 3, max_tokens=8 + i % 5), i % 4) for i in range(12)]
    for request in requests:
        s.add_request(request)
    outs = run(s)
    assert s.num_preemptions > 0
    for out in outs:
        assert len({item.request.lora_id for item in out.scheduled} - {0}) <= 2
    assert all(r.status == RequestStatus.FINISHED_LENGTH for r in requests)
