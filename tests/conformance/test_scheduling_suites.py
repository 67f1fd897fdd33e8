"""The scheduler and KV-cache manager suites fail deliberately broken components precisely, and the
traces they run exercise what they claim to (preemption, prefix-cache hits) on llmp's own.

(llmp's own scheduler and KV-cache manager pass their suites in ``test_executor_suites.py``, in the
one ``verify`` of the kernel's built-ins.) The broken components are registered in-process; their
traces fail at the first wrong step, so no engine is built for them.
"""

from __future__ import annotations

import re

import pytest

from llmp import hookimpl, registry
from llmp.api import KVManagerSpec, SchedulerSpec
from llmp.conformance import Report, verify
from llmp.conformance.trace import SCENARIOS, TraceRun
from llmp.testing import registered

DefaultKVManager = registry.load_component("kv_manager", "default")
DefaultScheduler = registry.load_component("scheduler", "default")


class LeaksABlock(DefaultKVManager):
    """Never gives back the last block of a request holding more than two."""

    def free(self, request):
        if len(request.block_ids) > 2:
            request.block_ids.pop()  # its reference stays counted: the block is never free again
        super().free(request)


class ForgetsItsTokens(DefaultScheduler):
    """Drops a preempted request's generated tokens: it starts its output over."""

    def _preempt(self, request):
        super()._preempt(request)
        del request.all_token_ids[request.num_prompt_tokens :]
        request.output_token_ids.clear()


class BrokenScheduling:
    @hookimpl
    def llmp_register_kv_managers(self):
        yield KVManagerSpec(name="leaks-a-block", impl=f"{__name__}:LeaksABlock")

    @hookimpl
    def llmp_register_schedulers(self):
        yield SchedulerSpec(name="forgets-its-tokens", impl=f"{__name__}:ForgetsItsTokens")


@pytest.fixture(scope="module")
def broken_report() -> Report:
    with registered(BrokenScheduling(), "broken-scheduling"):
        return verify("broken-scheduling")


def result(report: Report, kind: str, check: str):
    return next(r for r in report.results if r.kind == kind and r.check == check)


def test_a_kv_manager_leaking_a_block_fails_where_it_leaks(broken_report):
    assert not broken_report.passed
    trace = result(broken_report, "kv_manager", "randomized trace: FCFS, prefix caching, chunked prefill")
    assert trace.status == "failed"
    assert re.fullmatch(
        r"FCFS, prefix caching, chunked prefill, seed 1, step \d+: after free\(request 'r\d+' holding blocks "
        r"\[[\d, ]+\]\): usage is [\d.]+ \((\d+) of 16 blocks in use\) but the requests hold (\d+) blocks "
        r"\[[\d, ]*\]: blocks were not released \(a leak\)\. .*",
        trace.detail,
    ), trace.detail
    full = result(broken_report, "kv_manager", "allocate_slots returns None and changes nothing when out of blocks")
    assert (full.status, full.detail) == ("failed", "after freeing every request, usage is 0.25")
    engine = result(broken_report, "kv_manager", "a real engine that preempts gives the built-in stack's greedy output")
    assert engine.status == "skipped" and "a randomized trace failed" in engine.detail
    # what does not depend on freeing passes: the failures point at the leak only
    assert result(broken_report, "kv_manager", "a cached block serves only its own LoRA adapter").status == "passed"


def test_a_scheduler_dropping_a_preempted_requests_tokens_fails_at_the_preemption(broken_report):
    trace = result(broken_report, "scheduler", "randomized trace: FCFS, prefix caching, chunked prefill")
    assert trace.status == "failed"
    assert re.fullmatch(
        r"FCFS, prefix caching, chunked prefill, seed 1, step \d+: request 'r\d+' \(\d+-token prompt, preempted "
        r"once\) had [1-9]\d* output tokens and now has 0: generated tokens are kept \(a preempted request "
        r"recomputes its KV, not its tokens\)",
        trace.detail,
    ), trace.detail
    ended = "finish() and abort_requests() of ended or unknown requests change nothing"
    assert result(broken_report, "scheduler", ended).status == "passed"


def test_the_traces_preempt_and_hit_the_prefix_cache_on_llmps_own_components():
    for scenario in SCENARIOS:
        figures = TraceRun(scenario, 1, DefaultScheduler, DefaultKVManager).run()
        assert figures["preemptions"] > 0, (scenario.name, figures)
        assert (figures["prefix_cache_hits"] > 0) == scenario.prefix_caching, (scenario.name, figures)
