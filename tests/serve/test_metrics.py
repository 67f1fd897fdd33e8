"""``/metrics`` as operators read it: the histograms vLLM's dashboards watch, filled from a real
``llmp serve`` (engine timings, tokens per step), and ``--metrics-names vllm`` exposing every one
under vLLM's name too. Without the flag there is no ``vllm:`` name (``test_server_ops``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from llmp.server.metrics import VLLM_NAMES
from llmp.testing import LiveServer, save_tiny_llama, serving

MODEL = "tiny-metrics"
# every series vLLM's Grafana dashboard queries (examples/online_serving/prometheus_grafana/grafana.json;
# its vLLM-v0-only num_requests_swapped and cpu_cache_usage_perc have no v1 counterpart)
DASHBOARD_SERIES = (
    "vllm:e2e_request_latency_seconds_bucket",
    "vllm:e2e_request_latency_seconds_sum",
    "vllm:e2e_request_latency_seconds_count",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:time_per_output_token_seconds_bucket",
    "vllm:time_per_output_token_seconds_sum",
    "vllm:time_per_output_token_seconds_count",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:time_to_first_token_seconds_bucket",
    "vllm:time_to_first_token_seconds_sum",
    "vllm:time_to_first_token_seconds_count",
    "vllm:gpu_cache_usage_perc",
    "vllm:request_prompt_tokens_bucket",
    "vllm:request_generation_tokens_bucket",
    "vllm:request_success_total",
    "vllm:request_queue_time_seconds_sum",
    "vllm:request_prefill_time_seconds_sum",
    "vllm:request_decode_time_seconds_sum",
    "vllm:request_max_num_generation_tokens_sum",
)
# and the rest of vLLM's v1 names for what llmp measures
OTHER_VLLM_SERIES = (
    "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:num_preemptions_total",
    "vllm:inter_token_latency_seconds_count",
    "vllm:request_time_per_output_token_seconds_count",
    "vllm:request_inference_time_seconds_count",
    "vllm:request_params_n_bucket",
    "vllm:request_params_max_tokens_bucket",
    "vllm:iteration_tokens_total_bucket",
    "vllm:iteration_tokens_total_sum",
)
PER_REQUEST = (
    "time_to_first_token_seconds",
    "e2e_request_latency_seconds",
    "request_queue_time_seconds",
    "request_inference_time_seconds",
    "request_prefill_time_seconds",
    "request_decode_time_seconds",
    "request_prompt_tokens",
    "request_generation_tokens",
    "request_max_num_generation_tokens",
    "request_params_n",
    "request_params_max_tokens",
)

Samples = dict[tuple[str, frozenset], float]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    path = tmp_path_factory.mktemp("tiny-llama-metrics")
    save_tiny_llama(path, vocab_size=400)
    # one running request at a time: concurrent ones wait, so queue time is real
    args = ("--dtype", "float32", "--block-size", "4", "--max-num-seqs", "1", "--served-model-name", MODEL)
    with serving(Path(path), *args, "--metrics-names", "vllm") as live:
        yield live


def scrape(server: LiveServer) -> Samples:
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def total(samples: Samples, name: str) -> float:
    return sum(value for (sample, labels), value in samples.items() if sample == name and ("le", "+Inf") not in labels)


def wait_idle(server: LiveServer) -> Samples:
    deadline = time.monotonic() + 20
    while True:
        samples = scrape(server)
        if total(samples, "llmp_num_requests_running") == total(samples, "llmp_num_requests_waiting") == 0:
            return samples
        assert time.monotonic() < deadline, "requests still in flight"
        time.sleep(0.05)


async def _workload(server: LiveServer) -> tuple[int, int, int]:
    """Five requests: three streamed at once (two of them wait), one with n=2, one of a single token.
    Returns the prompt tokens the engine computes, the prompt tokens of the requests, the tokens generated."""
    client = openai.AsyncOpenAI(base_url=server.api_url, api_key="none")
    # distinct first tokens: no prompt shares a cached block with another
    streamed = [[300 + i, *range(10, 10 + 4 * i + 5)] for i in range(3)]

    async def stream(prompt: list[int]) -> int:
        chunks = await client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=12, temperature=0, stream=True, extra_body={"ignore_eos": True}
        )
        return len([chunk async for chunk in chunks])

    await asyncio.gather(*(stream(p) for p in streamed))
    pair = await client.completions.create(
        model=MODEL, prompt=[350, 7, 8], max_tokens=4, n=2, temperature=1, extra_body={"ignore_eos": True}
    )
    assert pair.usage.completion_tokens == 8
    one = await client.completions.create(
        model=MODEL, prompt=[360, 11, 12, 13, 14, 15], max_tokens=1, extra_body={"ignore_eos": True}
    )
    assert one.usage.completion_tokens == 1
    await client.close()
    prompts = sum(map(len, streamed)) + 3 + 6
    return prompts + 3, prompts, 3 * 12 + 8 + 1  # the n=2 request computes its prompt once per sequence


@pytest.fixture(scope="module")
def observed(server: LiveServer) -> tuple[Samples, Samples, tuple[int, int, int]]:
    before = wait_idle(server)
    counts = asyncio.run(_workload(server))
    return before, wait_idle(server), counts


def test_each_request_is_observed_once_in_every_histogram(observed):
    before, after, (_, prompt_tokens, generated) = observed

    def grew(name: str) -> float:
        return total(after, name) - total(before, name)

    for name in PER_REQUEST:
        assert grew(f"llmp_{name}_count") == 5, name
    assert grew("llmp_request_time_per_output_token_seconds_count") == 4  # not the one-token request
    assert grew("llmp_request_prompt_tokens_sum") == grew("llmp_prompt_tokens_total") == prompt_tokens
    assert grew("llmp_request_generation_tokens_sum") == grew("llmp_generation_tokens_total") == generated
    assert grew("llmp_request_max_num_generation_tokens_sum") == 3 * 12 + 4 + 1
    assert grew("llmp_request_params_n_sum") == 1 + 1 + 1 + 2 + 1
    assert grew("llmp_request_params_max_tokens_sum") == 3 * 12 + 4 + 1


def test_engine_times_add_up(observed):
    before, after, _ = observed

    def grew(name: str) -> float:
        return total(after, f"llmp_{name}_seconds_sum") - total(before, f"llmp_{name}_seconds_sum")

    queue, inference = grew("request_queue_time"), grew("request_inference_time")
    assert grew("request_prefill_time") + grew("request_decode_time") == pytest.approx(inference, abs=1e-6)
    assert grew("request_decode_time") > 0 and grew("request_prefill_time") > 0
    # the engine's span of a request (arrival to last token) lies inside the server's
    assert queue + inference <= grew("e2e_request_latency") + 0.05
    # one running request at a time: of three sent together, two waited for others' whole generation
    assert queue > 0.5 * inference / 3, (queue, inference)


def test_iteration_tokens_are_prompt_plus_generated_tokens(observed):
    before, after, (computed, _, generated) = observed
    assert total(before, "llmp_iteration_tokens_count") == 0  # the server's warm-up request is not counted
    assert total(before, "llmp_prefix_cache_queries_total") == 0  # nor its prompt in the prefix cache
    assert total(after, "llmp_prefix_cache_queries_total") == computed
    assert total(after, "llmp_iteration_tokens_sum") == computed + generated
    steps = total(after, "llmp_iteration_tokens_count")
    assert 0 < steps <= computed + generated


def test_every_metric_is_also_under_its_vllm_name_with_the_same_values(observed):
    _, after, _ = observed
    names = {name for name, _ in after}
    for series in DASHBOARD_SERIES + OTHER_VLLM_SERIES:
        assert series in names, series
        assert any(name == series and ("model_name", MODEL) in labels for name, labels in after), series
    compared = 0
    for (name, labels), value in after.items():
        for family, aliases in VLLM_NAMES.items():
            if name.startswith(family) and name[len(family) :] in ("", "_total", "_bucket", "_sum", "_count"):
                for alias in aliases:
                    assert after[(alias + name[len(family) :], labels)] == value, (name, alias)
                    compared += 1
    assert compared > 100
    finished = frozenset({("model_name", MODEL), ("finished_reason", "length")})
    assert after[("vllm:request_success_total", finished)] == after[("llmp_request_success_total", finished)] == 5


def test_series_exist_from_the_start_and_none_is_created(observed):
    before, after, _ = observed
    # as vLLM: every finish reason and rejection reason at 0 before any happened (rate() reads 0)
    for reason in ("stop", "length", "abort"):
        labels = frozenset({("model_name", MODEL), ("finished_reason", reason)})
        assert before[("llmp_request_success_total", labels)] == 0, reason
        assert before[("vllm:request_success_total", labels)] == 0, reason
    rejected = frozenset({("model_name", MODEL), ("reason", "overloaded")})
    assert before[("llmp_requests_rejected_total", rejected)] == 0
    # no *_created series (vLLM disables them; several API servers could not export them)
    assert not [name for name, _ in after if name.endswith("_created")]
