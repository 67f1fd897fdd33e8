"""`llmp bench throughput` and `llmp bench latency` as real subprocesses, each on a tiny random Llama.

Every run uses one torch thread and a few short prompts; nothing here asserts on
how fast anything was, only on counts, shapes and the consistency of the figures.
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path
from typing import Any

import pytest

from llmp.cli.bench_offline import ThroughputWorkload, mixed_bounds, throughput_lengths
from llmp.testing import run_llmp, save_tiny_llama

ONE_THREAD = ("--num-threads", "1")  # the machine is shared: keep each run to one core


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("tiny-llama")
    save_tiny_llama(path)
    return str(path)


def bench_json(command: str, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    result = run_llmp("bench", command, "--json", *ONE_THREAD, *args, env=env)
    assert "Traceback" not in result.stderr
    return json.loads(result.stdout)  # the whole of stdout: the report and nothing else


def assert_engine_facts(report: dict[str, Any], model_dir: str) -> None:
    assert report["model"] == model_dir and report["dtype"] == "float32" and report["executor"] == "uniproc"
    assert report["kv_cache_dtype"] == "float32"  # --dtype's: no --kv-cache-dtype given
    assert report["max_model_len"] == 512 and report["num_threads"] == 1  # the model's context; --num-threads
    assert isinstance(report["kernels"], str) and report["kernels"]
    assert report["load_time_s"] > 0


# -- throughput ---------------------------------------------------------------------------


THROUGHPUT_KEYS = {
    "model",
    "kernels",
    "dtype",
    "kv_cache_dtype",
    "executor",
    "max_model_len",
    "num_threads",
    "load_time_s",
    "dataset",
    "num_prompts",
    "input_len",
    "output_len",
    "seed",
    "elapsed_s",
    "num_requests",
    "total_prompt_tokens",
    "total_output_tokens",
    "total_num_tokens",
    "cached_prompt_tokens",
    "requests_per_s",
    "output_tokens_per_s",
    "total_tokens_per_s",
    "elapsed_time",
    "requests_per_second",
    "tokens_per_second",
}


def assert_rates_agree(report: dict[str, Any]) -> None:
    elapsed = report["elapsed_s"]
    assert elapsed > 0 and report["elapsed_time"] == elapsed
    assert report["total_num_tokens"] == report["total_prompt_tokens"] + report["total_output_tokens"]
    assert report["requests_per_s"] == pytest.approx(report["num_requests"] / elapsed)
    assert report["output_tokens_per_s"] == pytest.approx(report["total_output_tokens"] / elapsed)
    assert report["total_tokens_per_s"] == pytest.approx(report["total_num_tokens"] / elapsed)
    assert report["requests_per_second"] == report["requests_per_s"]
    assert report["tokens_per_second"] == report["total_tokens_per_s"]


def test_throughput_random_with_torch_kernels_and_saved_result(model_dir: str, tmp_path: Path) -> None:
    saved = tmp_path / "throughput.json"
    report = bench_json(
        "throughput",
        model_dir,
        "--num-prompts",
        "5",
        "--input-len",
        "8",
        "--output-len",
        "4",
        "--kernels",
        "torch",
        "--save-result",
        str(saved),
    )
    assert set(report) == THROUGHPUT_KEYS
    assert_engine_facts(report, model_dir)
    assert report["kernels"] == "torch"  # the default on CPU is another kernel set
    assert report["dataset"] == "random" and report["num_prompts"] == report["num_requests"] == 5
    assert report["total_prompt_tokens"] == 5 * 8
    assert report["total_output_tokens"] == 5 * 4  # ignore_eos and min_tokens: every request to its length
    assert_rates_agree(report)
    assert json.loads(saved.read_text()) == report


def test_throughput_mixed_lengths_are_the_seeded_ones(model_dir: str, tmp_path: Path) -> None:
    config = tmp_path / "bench.yaml"
    config.write_text("dataset: mixed\nnum-prompts: 6\nmin-input-len: 3\n")  # and the seed from the environment
    report = bench_json(
        "throughput",
        model_dir,
        "--input-len",
        "12",
        "--output-len",
        "6",
        "--min-output-len",
        "2",
        "--config",
        str(config),
        env={"LLMP_SEED": "7"},
    )
    assert report["dataset"] == "mixed" and report["seed"] == 7 and report["num_requests"] == 6
    assert (report["min_input_len"], report["min_output_len"]) == (3, 2)
    expected = throughput_lengths(
        ThroughputWorkload(
            dataset="mixed", num_prompts=6, input_len=12, output_len=6, min_input_len=3, min_output_len=2
        ),
        seed=7,
    )
    assert report["total_prompt_tokens"] == sum(n for n, _ in expected)
    assert report["total_output_tokens"] == sum(n for _, n in expected)
    assert 6 * 3 <= report["total_prompt_tokens"] <= 6 * 12 and 6 * 2 <= report["total_output_tokens"] <= 6 * 6
    assert_rates_agree(report)


def test_mixed_lengths_are_seeded_and_bounded() -> None:
    workload = ThroughputWorkload(dataset="mixed", num_prompts=200, input_len=50, output_len=20, min_input_len=10)
    lengths = throughput_lengths(workload, seed=3)
    assert lengths == throughput_lengths(workload, seed=3)
    assert lengths != throughput_lengths(workload, seed=4)
    assert mixed_bounds(workload) == (10, 10)  # --min-output-len defaults to half of --output-len
    assert {n for n, _ in lengths} <= set(range(10, 51)) and {n for _, n in lengths} <= set(range(10, 21))
    assert len({n for n, _ in lengths}) > 20  # spread over the range, not one length
    fixed = throughput_lengths(ThroughputWorkload(num_prompts=3, input_len=50, output_len=20), seed=0)
    assert fixed == [(50, 20)] * 3


def test_throughput_prefix_dataset_and_prefix_caching(model_dir: str) -> None:
    args = (
        "throughput",
        model_dir,
        "--dataset",
        "prefix",
        "--prefix-len",
        "32",
        "--num-prompts",
        "4",
        "--input-len",
        "8",
        "--output-len",
        "2",
        "--max-num-seqs",
        "1",
    )  # one at a time: later ones reuse it
    cached = bench_json(*args)
    assert cached["dataset"] == "prefix" and cached["prefix_len"] == 32
    assert cached["total_prompt_tokens"] == 4 * (32 + 8) and cached["total_output_tokens"] == 4 * 2
    assert 0 < cached["cached_prompt_tokens"] <= 3 * 32  # the shared prefix, never the prompts' own tokens
    uncached = bench_json(*args, "--no-enable-prefix-caching")
    assert uncached["cached_prompt_tokens"] == 0
    assert uncached["total_prompt_tokens"] == cached["total_prompt_tokens"]


def test_throughput_table(model_dir: str) -> None:
    result = run_llmp(
        "bench", "throughput", model_dir, *ONE_THREAD, "--num-prompts", "3", "--input-len", "8", "--output-len", "5"
    )
    out = result.stdout
    assert "Traceback" not in result.stderr and not out.lstrip().startswith("{")
    for label in (
        "Kernels",
        "Load time (s)",
        "Request throughput (req/s)",
        "Output token throughput (tok/s)",
        "Total token throughput (tok/s)",
    ):
        assert label in out, label
    assert re.search(r"Requests\W+3\W", out) and re.search(r"Total prompt tokens\W+24\W", out)
    assert re.search(r"Total output tokens\W+15\W", out)
    assert re.search(
        r"^Throughput: [\d.]+ requests/s, [\d.]+ total tokens/s, [\d.]+ output tokens/s$", out, re.MULTILINE
    )


# -- latency ---------------------------------------------------------------------------


def test_latency_json_and_saved_result(model_dir: str, tmp_path: Path) -> None:
    saved = tmp_path / "latency.json"
    report = bench_json(
        "latency",
        model_dir,
        "--batch-size",
        "3",
        "--input-len",
        "8",
        "--output-len",
        "4",
        "--num-iters-warmup",
        "1",
        "--num-iters",
        "3",
        "--kernels",
        "torch",
        "--save-result",
        str(saved),
    )
    assert_engine_facts(report, model_dir)
    assert report["kernels"] == "torch"
    assert (report["batch_size"], report["input_len"], report["output_len"]) == (3, 8, 4)
    assert (report["num_iters_warmup"], report["num_iters"]) == (1, 3)
    latencies, prefills = report["latencies"], report["prefill_latencies"]
    assert len(latencies) == len(prefills) == 3 and all(x > 0 for x in latencies + prefills)
    assert report["avg_latency_s"] == report["avg_latency"] == pytest.approx(statistics.fmean(latencies))
    assert report["avg_prefill_s"] == pytest.approx(statistics.fmean(prefills))
    percentiles = report["percentiles"]
    assert list(percentiles) == ["10", "25", "50", "75", "90", "99"]
    values = list(percentiles.values())
    assert values == sorted(values) and min(latencies) <= values[0] and values[-1] <= max(latencies)
    assert percentiles["50"] == pytest.approx(statistics.median(latencies))
    decode_s = report["avg_latency_s"] - report["avg_prefill_s"]
    if report["decode_tokens_per_s"] is None:  # only when the prefill alone took as long as the whole batch
        assert decode_s <= 0 and report["per_token_latency_ms"] is None
    else:
        assert report["decode_tokens_per_s"] == pytest.approx(3 * (4 - 1) / decode_s)
        assert report["per_token_latency_ms"] == pytest.approx(decode_s / (4 - 1) * 1000)
    assert json.loads(saved.read_text()) == report


def test_latency_of_one_output_token_has_no_decode_figures(model_dir: str) -> None:
    result = run_llmp(
        "bench",
        "latency",
        model_dir,
        *ONE_THREAD,
        "--batch-size",
        "2",
        "--input-len",
        "4",
        "--output-len",
        "1",
        "--num-iters-warmup",
        "0",
        "--num-iters",
        "2",
    )
    out = result.stdout
    for label in ("Avg latency (s)", "P50 latency (s)", "P99 latency (s)", "Avg prefill (s)"):
        assert label in out, label
    assert re.search(r"Batch size\W+2\W", out) and re.search(r"Iterations\W+2\W", out)
    assert re.search(r"Decode throughput \(tok/s\)\W+-\W", out) and re.search(r"Per-token latency \(ms\)\W+-\W", out)
    assert re.search(r"^Avg latency: [\d.]+ seconds$", out, re.MULTILINE)


# -- usage errors ---------------------------------------------------------------------------


def assert_usage_error(result: Any, *words: str) -> None:
    assert result.returncode == 2, result.stderr
    assert result.stdout == "" and "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("llmp: error: "), result.stderr
    for word in words:
        assert word in last, (word, last)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("latency", "--batch-size", "0"), ("--batch-size", ">= 1")),
        (("latency", "--num-iters", "0"), ("--num-iters",)),
        (("latency", "--max-model-len", "64", "--input-len", "40", "--output-len", "40"), ("80", "64")),
        (("throughput", "--dataset", "sharegpt"), ("--dataset",)),
        (("throughput", "--dataset", "mixed", "--input-len", "8", "--min-input-len", "9"), ("--min-input-len", "9")),
        (("throughput", "--dataset", "prefix", "--prefix-len", "60", "--max-model-len", "100"), ("252", "100")),
        (("throughput", "--dtype", "float8"), ("--dtype",)),
    ],
)
def test_invalid_options_are_one_line_usage_errors(model_dir: str, args: tuple[str, ...], words: tuple[str]) -> None:
    command, *rest = args
    assert_usage_error(run_llmp("bench", command, model_dir, *rest, check=False), *words)


def test_what_the_engine_refuses_is_a_usage_error_too(model_dir: str, tmp_path: Path) -> None:
    too_long = run_llmp(
        "bench", "latency", model_dir, *ONE_THREAD, "--input-len", "400", "--output-len", "200", check=False
    )
    assert_usage_error(too_long, "600", "max_model_len", "512")  # the tiny model's context, known once loaded
    missing = run_llmp("bench", "throughput", str(tmp_path / "no-such-model"), check=False)
    assert_usage_error(missing, "no-such-model")
