"""The scheduler and KV-cache manager suites.

Each drives the component with the built-in other half (a scheduler plugin with the default KV-cache
manager, a KV-cache manager with the default scheduler) through the seeded random request traces
of :mod:`llmp.conformance.trace`, checking after every call and step: no block leak (``usage``
equals the blocks requests hold; every block free again at the end), consistent block tables, every
attended position holding the request's own prefix's KV (prefix-cache hits, preemption,
eviction), preempted requests keeping their tokens and finishing as an unpreempted run does,
prefix-cache hit accounting, the token budget, ``whole_prompt`` and ``max_loras``. Then a real
engine on the tiny Llama with a KV cache small enough to preempt: its greedy output must equal the
built-in stack's with an ample cache.

The KV-cache manager suite also checks the manager alone: prefix reuse (and only of the same
prompt and adapter), nothing cached with prefix caching off or for whole-prompt and
prompt-logprobs requests, ``allocate_slots`` changing nothing when out of blocks, and
``reset_prefix_cache`` when it has one.

Options (``verify(..., **options)``): ``scheduling_seeds``, the trace seeds (default ``(1, 2, 3)``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

from llmp.api import ComponentSpec, KVManagerSpec, SchedulerSpec
from llmp.conformance.engines import (
    ENGINE_OPTIONS,
    EngineHandle,
    Timeout,
    first_difference,
    greedy,
    reference_engine,
    tiny_llama,
    token_prompts,
    within,
)
from llmp.conformance.runner import Check, Context, SkipCheck
from llmp.conformance.trace import BLOCK_SIZE, SCENARIOS, Scenario, TraceRun, new_request, stand_in_token
from llmp.scheduling import RequestStatus

__all__ = ["kv_manager_suite", "scheduler_suite"]

SEEDS = (1, 2, 3)
MAX_TOKENS = 10
CALL_TIMEOUT_S = 120.0
# 12 blocks of 4 tokens for 6 requests of up to 42 tokens: the built-in stack preempts 4 times, chunks
# 2 prompts and reuses the shared prefix
TIGHT_ENGINE = dict(max_model_len=48, num_kv_blocks=12, max_num_batched_tokens=32)
PROMPT = list(range(2, 11))  # 9 tokens: two full blocks of 4 and one more token


@dataclass(frozen=True)
class _Pair:
    """The scheduler and KV-cache manager a check runs together (one of them under test)."""

    scheduler: ComponentSpec
    kv_manager: ComponentSpec

    @property
    def key(self) -> str:
        return f"{self.scheduler.plugin}:{self.scheduler.name}+{self.kv_manager.plugin}:{self.kv_manager.name}"

    def lora_support(self) -> str:
        """Why the pair cannot serve LoRA adapters ('' when it can)."""
        kv = self.kv_manager.load()(8, BLOCK_SIZE, True)
        if not getattr(kv, "supports_lora", False):
            return "the KV-cache manager does not set supports_lora"
        scheduler = self.scheduler.load()(SCENARIOS[0].scheduler_config(), kv)
        if not callable(getattr(scheduler, "lora_counts", None)):
            return "the scheduler has no lora_counts()"
        return ""


def scheduler_suite(spec: SchedulerSpec, context: Context) -> Iterator[Check]:
    pair = _Pair(spec, _builtin("kv_manager"))
    yield Check(
        "finish() and abort_requests() of ended or unknown requests change nothing", partial(_check_ended, spec)
    )
    yield from _trace_and_engine_checks(pair, context)


def kv_manager_suite(spec: KVManagerSpec, context: Context) -> Iterator[Check]:
    pair = _Pair(_builtin("scheduler"), spec)
    yield Check("a repeated prompt is served from the prefix cache, and only that prompt", partial(_check_reuse, spec))
    yield Check("with prefix caching off nothing is served from the cache", partial(_check_caching_off, spec))
    yield Check(
        "whole-prompt and prompt-logprobs requests neither use nor fill the prefix cache",
        partial(_check_uncacheable, spec),
    )
    yield Check("allocate_slots returns None and changes nothing when out of blocks", partial(_check_full, spec))
    yield Check("a cached block serves only its own LoRA adapter", partial(_check_lora, spec))
    yield Check("reset_prefix_cache() forgets the cache once no block is held", partial(_check_reset, spec))
    yield from _trace_and_engine_checks(pair, context)


def _trace_and_engine_checks(pair: _Pair, context: Context) -> Iterator[Check]:
    for scenario in SCENARIOS:
        yield Check(f"randomized trace: {scenario.name}", partial(_check_trace, pair, scenario, context))
    yield Check(
        "a real engine that preempts gives the built-in stack's greedy output", partial(_check_engine, pair, context)
    )


def _builtin(kind: str) -> ComponentSpec:
    from llmp import registry

    return registry.get_component(kind, "default")


def _memo(context: Context, key: str, check: Callable[[], None]) -> None:
    """Run ``check`` once per ``verify`` for ``key`` (the built-in pair is checked by both suites);
    a later call repeats its failure."""
    if key in context.cache:
        if context.cache[key] is not None:
            raise context.cache[key]
        return
    try:
        check()
    except Exception as failure:
        context.cache[key] = failure
        raise
    context.cache[key] = None


# -- the traces and the real engine -------------------------------------------------------------------


def _check_trace(pair: _Pair, scenario: Scenario, context: Context) -> None:
    if scenario.max_loras and (why := pair.lora_support()):
        raise SkipCheck(f"{why}: the engine refuses --enable-lora with it (optional)")
    seeds = tuple(context.options.get("scheduling_seeds", SEEDS))

    def run() -> None:
        scheduler_cls, kv_manager_cls = pair.scheduler.load(), pair.kv_manager.load()
        for seed in seeds:
            TraceRun(scenario, seed, scheduler_cls, kv_manager_cls).run()

    _memo(context, f"scheduling:trace:{pair.key}:{scenario.name}:{seeds}", run)


def _check_engine(pair: _Pair, context: Context) -> None:
    prefix = f"scheduling:trace:{pair.key}:"
    if any(key.startswith(prefix) and value is not None for key, value in context.cache.items()):
        raise SkipCheck("a randomized trace failed (above): a real engine could hang on these components")
    _memo(context, f"scheduling:engine:{pair.key}", partial(_engine_parity, pair, context))


def _engine_parity(pair: _Pair, context: Context) -> None:
    from llmp import LLM

    prompts = token_prompts(6, seed=31, shared_prefix=8, lengths=(4, 24))
    expected = greedy(reference_engine(context), prompts, MAX_TOKENS)
    options = {**ENGINE_OPTIONS, **TIGHT_ENGINE}
    llm = LLM(str(tiny_llama(context)), scheduler=pair.scheduler.name, kv_manager=pair.kv_manager.name, **options)
    handle = EngineHandle(llm)
    try:
        got = within(CALL_TIMEOUT_S, lambda: greedy(llm, prompts, MAX_TOKENS))
    except Timeout:
        handle.wedged = True
        raise AssertionError(
            f"generate() of 6 prompts did not return within {CALL_TIMEOUT_S:g} s (scheduler {pair.scheduler.name!r}, "
            f"KV-cache manager {pair.kv_manager.name!r}, {TIGHT_ENGINE['num_kv_blocks']} blocks)"
        ) from None
    finally:
        handle.close()
    difference = first_difference(expected, got)
    preempted = getattr(getattr(getattr(llm, "engine", None), "scheduler", None), "num_preemptions", "?")
    assert not difference, (
        f"with scheduler {pair.scheduler.name!r} and KV-cache manager {pair.kv_manager.name!r} on "
        f"{TIGHT_ENGINE['num_kv_blocks']} blocks ({preempted} preemptions), the greedy output differs from the "
        f"built-in stack's with an ample cache: {difference}"
    )


# -- the scheduler alone ------------------------------------------------------------------------------


def _check_ended(spec: ComponentSpec) -> None:
    kv = _builtin("kv_manager").load()(16, BLOCK_SIZE, True)
    scheduler = spec.load()(SCENARIOS[0].scheduler_config(), kv)
    request = new_request("a", PROMPT, max_tokens=1)
    scheduler.add_request(request)
    out = scheduler.schedule()
    assert [item.request for item in out.scheduled] == [request], (
        f"schedule() of one 9-token request with 16 free blocks ran {[i.request.request_id for i in out.scheduled]}"
    )
    scheduler.update_from_output(out, [stand_in_token(0, PROMPT)])
    assert request.status == RequestStatus.FINISHED_LENGTH, (
        f"a request with max_tokens=1 is {request.status.value} after its first token, not finished (length)"
    )
    scheduler.finish(request, RequestStatus.FINISHED_STOPPED, stop_reason="late")
    assert (request.status, request.stop_reason) == (RequestStatus.FINISHED_LENGTH, None), (
        f"finish() of a request that had finished (length) made it {request.status.value} with stop_reason "
        f"{request.stop_reason!r}: the engine calls finish() on finished requests and expects nothing to change"
    )
    aborted = scheduler.abort_requests(["a", "never-added"])
    assert aborted == [], f"abort_requests of a finished and an unknown request returned {aborted}, expected []"
    assert not scheduler.has_unfinished_requests() and kv.usage == 0, (
        f"after its only request finished: has_unfinished_requests() {scheduler.has_unfinished_requests()}, "
        f"KV usage {kv.usage}"
    )


# -- the KV-cache manager alone -------------------------------------------------------------------------


def _manager(spec: ComponentSpec, num_blocks: int = 16, prefix_caching: bool = True) -> Any:
    return spec.load()(num_blocks, BLOCK_SIZE, prefix_caching)


def _prefill(kv: Any, request: Any) -> int:
    """Admit ``request`` whole, as the scheduler does; the tokens found cached."""
    blocks, cached = kv.get_computed_blocks(request)
    new = kv.allocate_slots(request, request.num_tokens - cached, blocks)
    assert new is not None, (
        f"allocate_slots for request {request.request_id!r} ({request.num_tokens} tokens) returned None with "
        f"usage {kv.usage:.2f}: out of blocks on a nearly empty cache"
    )
    request.num_computed_tokens = request.num_tokens
    return cached


def _cached(kv: Any, request: Any) -> int:
    return kv.get_computed_blocks(request)[1]


def _check_reuse(spec: ComponentSpec) -> None:
    kv = _manager(spec)
    first = new_request("first", PROMPT)
    _prefill(kv, first)
    kv.free(first)
    again = _cached(kv, new_request("again", PROMPT))
    assert 0 < again < len(PROMPT), (
        f"the 9-token prompt of a finished request, sent again with prefix caching on, found {again} tokens "
        "cached; expected its full blocks (at least one token left to compute)"
    )
    other = _cached(kv, new_request("other", [PROMPT[0] + 1, *PROMPT[1:]]))
    assert other == 0, f"a prompt differing from a cached one in its first token found {other} tokens cached"


def _check_caching_off(spec: ComponentSpec) -> None:
    kv = _manager(spec, prefix_caching=False)
    first = new_request("first", PROMPT)
    _prefill(kv, first)
    kv.free(first)
    again = _cached(kv, new_request("again", PROMPT))
    assert again == 0, f"with enable_prefix_caching=False, a repeated 9-token prompt found {again} tokens cached"


def _check_uncacheable(spec: ComponentSpec) -> None:
    kv = _manager(spec)
    first = new_request("first", PROMPT)
    _prefill(kv, first)
    kv.free(first)
    for request, what in (
        (new_request("pooled", PROMPT, whole_prompt=True), "a whole-prompt (pooling) request"),
        (new_request("logprobs", PROMPT, prompt_logprobs=True), "a prompt-logprobs request"),
    ):
        found = _cached(kv, request)
        assert found == 0, f"{what} found {found} tokens of its cached prompt: it needs every prompt row computed"
    kv = _manager(spec)
    pooled = new_request("pooled", PROMPT, whole_prompt=True)
    _prefill(kv, pooled)
    kv.free(pooled)
    found = _cached(kv, new_request("after", PROMPT))
    assert found == 0, (
        f"after a whole-prompt request ran a prompt, the same prompt found {found} tokens cached: a whole-prompt "
        "request's blocks must not enter the prefix cache (its KV saw the whole prompt)"
    )


def _check_full(spec: ComponentSpec) -> None:
    kv = _manager(spec, num_blocks=4, prefix_caching=False)
    first = new_request("first", list(range(2, 14)))
    assert kv.allocate_slots(first, 12) is not None, "allocate_slots of 12 tokens into 4 empty blocks returned None"
    second = new_request("second", list(range(20, 28)))
    usage = kv.usage
    got = kv.allocate_slots(second, 8)
    assert got is None, f"allocate_slots of 8 more tokens (2 blocks) with usage {usage} returned {got}, not None"
    assert second.block_ids == [] and kv.usage == usage, (
        f"allocate_slots returned None but changed the request's blocks ({second.block_ids}) or usage "
        f"({usage} -> {kv.usage}): it must change nothing"
    )
    if usage < 1:
        assert kv.allocate_slots(second, 4) is not None, (
            f"with usage {usage} (a block free), allocate_slots of 4 tokens (one block) returned None"
        )
    kv.free(first)
    kv.free(second)
    assert kv.usage == 0, f"after freeing every request, usage is {kv.usage}"


def _check_lora(spec: ComponentSpec) -> None:
    kv = _manager(spec)
    if not getattr(kv, "supports_lora", False):
        raise SkipCheck("supports_lora is not set: the engine refuses --enable-lora with this manager (optional)")
    first = new_request("adapter-1", PROMPT, lora_id=1)
    _prefill(kv, first)
    kv.free(first)
    for name, lora_id in (("adapter-2", 2), ("base model", 0)):
        found = _cached(kv, new_request(name, PROMPT, lora_id=lora_id))
        assert found == 0, (
            f"the {name} request found {found} tokens cached by adapter 1's request for the same prompt: "
            "cached blocks are keyed by request.lora_id"
        )
    found = _cached(kv, new_request("adapter-1 again", PROMPT, lora_id=1))
    assert found > 0, "adapter 1's prompt, sent again with adapter 1, found nothing cached"


def _check_reset(spec: ComponentSpec) -> None:
    kv = _manager(spec)
    reset = getattr(kv, "reset_prefix_cache", None)
    if not callable(reset):
        raise SkipCheck("no reset_prefix_cache() (optional: the engine's reset_prefix_cache() and sleep() need it)")
    held = new_request("held", PROMPT)
    _prefill(kv, held)
    assert reset() is False, "reset_prefix_cache() returned True while a request holds blocks; expected False"
    kv.free(held)
    assert reset() is True, "reset_prefix_cache() returned False with no block held; expected True"
    found = _cached(kv, new_request("after", PROMPT))
    assert found == 0, f"after reset_prefix_cache(), the prompt cached before found {found} tokens cached"
