"""``llmp bench throughput`` and ``llmp bench latency``: the engine in this process, no HTTP.

Both mirror vLLM's commands of the same names. Prompts are seeded random token
ids fed as ``{"prompt_token_ids": ...}``; sampling is greedy with
``ignore_eos=True`` and ``min_tokens == max_tokens``, so every request yields
exactly its output length. torch, the engine and rich are imported inside
functions: this module is imported whenever the CLI lists commands.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import typer

from llmp.cli.bench_report import ReportOptions, emit_report, percentile
from llmp.cli.options import Select, options_command
from llmp.options import EngineConfig, option

PERCENTILES = (10, 25, 50, 75, 90, 99)
WARMUP_PROMPTS = 4  # requests of the throughput warm-up
WARMUP_TOKENS = 4  # their output tokens

# The engine options of ``llmp serve`` but --task: the benchmarks generate.
BenchEngine = Annotated[
    EngineConfig,
    Select(omit=("task", "runner", "convert"), help={"seed": "Seed of the engine and of the random prompts."}),
]


@dataclass(frozen=True, kw_only=True)
class ThroughputWorkload:
    dataset: Literal["random", "mixed", "prefix"] = option(
        "random",
        "random: fixed lengths; mixed: lengths uniform between the min and max ones; "
        "prefix: one shared prefix, then each prompt's own tokens.",
    )
    num_prompts: int = option(64, "Requests, all given to one generate call.", ge=1)
    input_len: int = option(128, "Prompt tokens (mixed: the most; prefix: after it).", ge=1)
    output_len: int = option(64, "Output tokens of each request (mixed: the most).", ge=1)
    min_input_len: int | None = option(None, "mixed: the fewest prompt tokens (default: half of --input-len).", ge=1)
    min_output_len: int | None = option(None, "mixed: the fewest output tokens (default: half of --output-len).", ge=1)
    prefix_len: int = option(128, "prefix: tokens of the prefix all prompts share.", ge=0)


@dataclass(frozen=True, kw_only=True)
class LatencyWorkload:
    batch_size: int = option(8, "Prompts generated together in each iteration.", ge=1)
    input_len: int = option(32, "Prompt tokens.", ge=1)
    output_len: int = option(128, "Output tokens of each prompt.", ge=1)
    num_iters_warmup: int = option(1, "Untimed iterations first.", ge=0)
    num_iters: int = option(5, "Timed iterations.", ge=1)


@options_command
def throughput(engine: BenchEngine, workload: ThroughputWorkload, output: ReportOptions) -> None:
    """Offline throughput: generate for every prompt in one batch and report tokens per second."""
    check_throughput(workload, engine.max_model_len, "--max-model-len")
    report = _interruptible(run_throughput, engine, workload)
    emit_report(report, output, print_throughput_table)


@options_command
def latency(engine: BenchEngine, workload: LatencyWorkload, output: ReportOptions) -> None:
    """Offline latency: time one batch end to end, and its prefill alone, over several iterations."""
    check_latency(workload, engine.max_model_len, "--max-model-len")
    report = _interruptible(run_latency, engine, workload)
    emit_report(report, output, print_latency_table)


# -- usage errors ------------------------------------------------------------------------


def usage_error(message: str) -> typer.Exit:
    """Print one ``llmp: error:`` line; the caller raises the returned exit (status 2)."""
    print(f"llmp: error: {message}", file=sys.stderr)
    return typer.Exit(2)


def check_throughput(workload: ThroughputWorkload, max_model_len: int | None, limit: str) -> None:
    """Usage errors of the workload; with ``max_model_len`` (named ``limit``), the longest request must fit it."""
    if workload.dataset == "mixed":
        min_in, min_out = mixed_bounds(workload)
        if min_in > workload.input_len:
            raise usage_error(f"--min-input-len ({min_in}) must be <= --input-len ({workload.input_len})")
        if min_out > workload.output_len:
            raise usage_error(f"--min-output-len ({min_out}) must be <= --output-len ({workload.output_len})")
    prefix = workload.prefix_len if workload.dataset == "prefix" else 0
    longest = prefix + workload.input_len + workload.output_len
    if max_model_len is not None and longest > max_model_len:
        what = "--prefix-len + --input-len + --output-len" if prefix else "--input-len + --output-len"
        raise usage_error(f"{what} ({longest}) exceeds {limit} ({max_model_len})")


def check_latency(workload: LatencyWorkload, max_model_len: int | None, limit: str) -> None:
    longest = workload.input_len + workload.output_len
    if max_model_len is not None and longest > max_model_len:
        raise usage_error(f"--input-len + --output-len ({longest}) exceeds {limit} ({max_model_len})")


def mixed_bounds(workload: ThroughputWorkload) -> tuple[int, int]:
    """The fewest prompt and output tokens of the mixed dataset (default: half the most, at least 1)."""
    min_in = workload.min_input_len if workload.min_input_len is not None else max(1, workload.input_len // 2)
    min_out = workload.min_output_len if workload.min_output_len is not None else max(1, workload.output_len // 2)
    return min_in, min_out


def _interruptible(run: Any, engine: EngineConfig, workload: Any) -> dict[str, Any]:
    try:
        return run(engine, workload)
    except KeyboardInterrupt:
        print("llmp: interrupted", file=sys.stderr)
        raise typer.Exit(130) from None


# -- the workloads (pure: no engine, no torch) -------------------------------------------


def throughput_lengths(workload: ThroughputWorkload, seed: int) -> list[tuple[int, int]]:
    """(own prompt tokens, output tokens) of each request, seeded: the prefix dataset's prefix is not counted."""
    import random

    if workload.dataset != "mixed":
        return [(workload.input_len, workload.output_len)] * workload.num_prompts
    rng = random.Random(seed)
    min_in, min_out = mixed_bounds(workload)
    return [
        (rng.randint(min_in, workload.input_len), rng.randint(min_out, workload.output_len))
        for _ in range(workload.num_prompts)
    ]


def throughput_workload(workload: ThroughputWorkload, seed: int, pool: list[int]) -> list[tuple[list[int], int]]:
    """(prompt token ids, output tokens) of each request, token ids drawn from ``pool``."""
    import random

    rng = random.Random(seed + 1)  # its own stream: the lengths do not depend on the vocabulary
    prefix = rng.choices(pool, k=workload.prefix_len) if workload.dataset == "prefix" else []
    return [(prefix + rng.choices(pool, k=own), out) for own, out in throughput_lengths(workload, seed)]


def random_prompts(rng: Any, pool: list[int], count: int, length: int) -> list[dict[str, list[int]]]:
    return [{"prompt_token_ids": rng.choices(pool, k=length)} for _ in range(count)]


# -- the engine ---------------------------------------------------------------------------


def load_engine(engine: EngineConfig, command: str) -> tuple[Any, float]:
    """``LLM`` of ``engine`` (generating) and the seconds it took; a model or option it refuses is a usage error."""
    import dataclasses
    import time

    from llmp.api import LLMPError
    from llmp.llm import LLM

    print(f"llmp bench {command}: loading {engine.model or 'the default model'}", file=sys.stderr)
    start = time.perf_counter()
    try:
        llm = LLM(engine.model, **dataclasses.replace(engine, task="generate").keywords())
    except (LLMPError, ValueError, OSError) as exc:
        raise usage_error(f"cannot load the engine: {exc}") from None
    return llm, time.perf_counter() - start


def engine_facts(llm: Any, load_s: float) -> dict[str, Any]:
    import torch

    info = llm.engine.info
    return {
        "model": info.model,
        "kernels": info.kernels,
        "dtype": info.options["dtype"],
        "kv_cache_dtype": info.options["kv_cache_dtype"],
        "executor": info.executor,
        "max_model_len": llm.engine.max_model_len,
        # torch threads of this process, where the uniproc executor runs the model (other executors: their own)
        "num_threads": torch.get_num_threads() if info.executor == "uniproc" else None,
        "load_time_s": load_s,
    }


def token_pool(llm: Any) -> list[int]:
    """Token ids to draw prompts from: the tokenizer's vocabulary within the model's, special tokens left out."""
    tokenizer = llm.get_tokenizer()
    vocab_size = llm.engine.vocab_size
    try:
        ids = set(tokenizer.get_vocab().values())
    except (AttributeError, NotImplementedError, TypeError):
        ids = set(range(len(tokenizer)))
    in_range = sorted(i for i in ids if 0 <= i < vocab_size) or list(range(vocab_size))
    special = set(getattr(tokenizer, "all_special_ids", ()) or ())
    return [i for i in in_range if i not in special] or in_range


def exact(output_len: int) -> Any:
    """Greedy sampling that yields exactly ``output_len`` tokens."""
    from llmp.sampling_params import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=output_len, min_tokens=output_len, ignore_eos=True)


def run_throughput(engine: EngineConfig, workload: ThroughputWorkload) -> dict[str, Any]:
    """Warm up, then time one ``generate`` of every request."""
    import contextlib
    import random
    import time

    with contextlib.redirect_stdout(sys.stderr):  # stdout carries the report alone
        llm, load_s = load_engine(engine, "throughput")
        try:
            check_throughput(workload, llm.engine.max_model_len, "the engine's max_model_len")
            pool = token_pool(llm)
            requests = throughput_workload(workload, engine.seed, pool)
            # Warm-up: prompts of their own (the prefix cache must not hold the timed prompts), as long as the first.
            warm = random_prompts(
                random.Random(engine.seed + 2), pool, min(WARMUP_PROMPTS, workload.num_prompts), len(requests[0][0])
            )
            llm.generate(warm, exact(min(WARMUP_TOKENS, workload.output_len)), use_tqdm=False)
            prompts = [{"prompt_token_ids": ids} for ids, _ in requests]
            params = [exact(out) for _, out in requests]
            print(f"llmp bench throughput: {len(prompts)} requests ({workload.dataset} dataset)", file=sys.stderr)
            start = time.perf_counter()
            outputs = llm.generate(prompts, params, use_tqdm=False)
            elapsed = time.perf_counter() - start
            facts = engine_facts(llm, load_s)
        finally:
            llm.shutdown()
    prompt_tokens = sum(len(o.prompt_token_ids) for o in outputs)
    output_tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    report: dict[str, Any] = {
        **facts,
        "dataset": workload.dataset,
        "num_prompts": workload.num_prompts,
        "input_len": workload.input_len,
        "output_len": workload.output_len,
        "seed": engine.seed,
        "elapsed_s": elapsed,
        "num_requests": len(outputs),
        "total_prompt_tokens": prompt_tokens,
        "total_output_tokens": output_tokens,
        "total_num_tokens": prompt_tokens + output_tokens,
        "cached_prompt_tokens": sum(o.num_cached_tokens for o in outputs),
        "requests_per_s": len(outputs) / elapsed,
        "output_tokens_per_s": output_tokens / elapsed,
        "total_tokens_per_s": (prompt_tokens + output_tokens) / elapsed,
        # vLLM's --output-json names of the same figures
        "elapsed_time": elapsed,
        "requests_per_second": len(outputs) / elapsed,
        "tokens_per_second": (prompt_tokens + output_tokens) / elapsed,
    }
    if workload.dataset == "mixed":
        report["min_input_len"], report["min_output_len"] = mixed_bounds(workload)
    if workload.dataset == "prefix":
        report["prefix_len"] = workload.prefix_len
    return report


def run_latency(engine: EngineConfig, workload: LatencyWorkload) -> dict[str, Any]:
    """Per iteration: the batch's prefill alone (one output token), then the whole batch, each timed."""
    import contextlib
    import random
    import statistics
    import time

    with contextlib.redirect_stdout(sys.stderr):
        llm, load_s = load_engine(engine, "latency")
        try:
            check_latency(workload, llm.engine.max_model_len, "the engine's max_model_len")
            pool = token_pool(llm)
            rng = random.Random(engine.seed)
            prefill_params, full_params = exact(1), exact(workload.output_len)

            def timed(params: Any) -> float:
                # fresh prompts every time: a batch seen before would come back from the prefix cache
                prompts = random_prompts(rng, pool, workload.batch_size, workload.input_len)
                start = time.perf_counter()
                outputs = llm.generate(prompts, params, use_tqdm=False)
                seconds = time.perf_counter() - start
                produced = [len(c.token_ids) for o in outputs for c in o.outputs]
                if produced != [params.max_tokens] * workload.batch_size:
                    raise RuntimeError(f"the engine produced {produced} tokens, not {params.max_tokens} each")
                return seconds

            for _ in range(workload.num_iters_warmup):
                timed(prefill_params)
                timed(full_params)
            print(
                f"llmp bench latency: {workload.num_iters} iterations of a batch of {workload.batch_size}",
                file=sys.stderr,
            )
            prefills, latencies = [], []
            for _ in range(workload.num_iters):
                prefills.append(timed(prefill_params))
                latencies.append(timed(full_params))
            facts = engine_facts(llm, load_s)
        finally:
            llm.shutdown()
    avg_latency = statistics.fmean(latencies)
    avg_prefill = statistics.fmean(prefills)
    decode_s = avg_latency - avg_prefill
    decode_tokens = workload.batch_size * (workload.output_len - 1)
    timed_decode = workload.output_len > 1 and decode_s > 0  # else no decode step, or noise hid it
    return {
        **facts,
        "batch_size": workload.batch_size,
        "input_len": workload.input_len,
        "output_len": workload.output_len,
        "num_iters_warmup": workload.num_iters_warmup,
        "num_iters": workload.num_iters,
        "seed": engine.seed,
        "avg_latency_s": avg_latency,
        "avg_latency": avg_latency,  # vLLM's name
        "latencies": latencies,
        "percentiles": {str(q): percentile(latencies, q) for q in PERCENTILES},
        "avg_prefill_s": avg_prefill,
        "prefill_latencies": prefills,
        "decode_tokens_per_s": decode_tokens / decode_s if timed_decode else None,
        "per_token_latency_ms": decode_s / (workload.output_len - 1) * 1000 if timed_decode else None,
    }


# -- the tables -----------------------------------------------------------------------------


def _table(title: str, rows: list[tuple[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    table.add_column("metric", no_wrap=True)
    table.add_column("value", justify="right")
    for label, value in rows:
        if label == "-":
            table.add_section()
        else:
            table.add_row(label, _format(value))
    Console().print(table)


def _format(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):  # seconds of a tiny model are small: keep 4 significant digits
        return f"{value:.2f}" if abs(value) >= 100 else f"{value:.4g}"
    return str(value)


def _engine_rows(report: dict[str, Any]) -> list[tuple[str, Any]]:
    return [
        ("Kernels", report["kernels"]),
        ("Dtype", report["dtype"]),
        ("Torch threads", report["num_threads"]),
        ("Max model len", report["max_model_len"]),
        ("Load time (s)", report["load_time_s"]),
        ("-", None),
    ]


def print_throughput_table(report: dict[str, Any]) -> None:
    _table(
        f"llmp bench throughput: {report['model']}",
        _engine_rows(report)
        + [
            ("Dataset", report["dataset"]),
            ("Requests", report["num_requests"]),
            ("Total prompt tokens", report["total_prompt_tokens"]),
            ("Cached prompt tokens", report["cached_prompt_tokens"]),
            ("Total output tokens", report["total_output_tokens"]),
            ("Elapsed (s)", report["elapsed_s"]),
            ("Request throughput (req/s)", report["requests_per_s"]),
            ("Output token throughput (tok/s)", report["output_tokens_per_s"]),
            ("Total token throughput (tok/s)", report["total_tokens_per_s"]),
        ],
    )
    print(
        f"Throughput: {report['requests_per_s']:.2f} requests/s, {report['total_tokens_per_s']:.2f} total tokens/s, "
        f"{report['output_tokens_per_s']:.2f} output tokens/s"
    )


def print_latency_table(report: dict[str, Any]) -> None:
    rows = _engine_rows(report) + [
        ("Batch size", report["batch_size"]),
        ("Input tokens", report["input_len"]),
        ("Output tokens", report["output_len"]),
        ("Iterations", report["num_iters"]),
        ("-", None),
        ("Avg latency (s)", report["avg_latency_s"]),
    ]
    rows += [(f"P{q} latency (s)", value) for q, value in report["percentiles"].items()]
    rows += [
        ("-", None),
        ("Avg prefill (s)", report["avg_prefill_s"]),
        ("Decode throughput (tok/s)", report["decode_tokens_per_s"]),
        ("Per-token latency (ms)", report["per_token_latency_ms"]),
    ]
    _table(f"llmp bench latency: {report['model']}", rows)
    print(f"Avg latency: {report['avg_latency_s']:.4f} seconds")
