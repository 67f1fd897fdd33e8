"""``llmp bench throughput`` and ``llmp bench latency``: the engine in this process, no HTTP.

Both mirror vLLM's commands of the same names. Prompts are seeded random token
ids fed as ``{"prompt_token_ids": ...}``; sampling is greedy with
``ignore_eos=True`` and ``min_tokens == max_tokens``, so every request yields
exactly its output length. torch, the engine and rich are imported inside
functions: this module is imported whenever the CLI lists commands.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Literal

import typer
from pydantic import Field

from llmp.cli import ConfigOption
from llmp.config import CommandSettings, load_settings

PERCENTILES = (10, 25, 50, 75, 90, 99)
WARMUP_PROMPTS = 4  # requests of the throughput warm-up
WARMUP_TOKENS = 4  # their output tokens


class BenchEngineSettings(CommandSettings):
    """The engine options of the offline benchmarks (the same names and defaults as ``llmp serve``)."""

    model: str | None = None
    executor: str = "uniproc"
    tensor_parallel_size: int = Field(1, ge=1)
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    max_model_len: int | None = Field(None, ge=2)
    max_num_seqs: int = Field(256, ge=1)
    max_num_batched_tokens: int = Field(2048, ge=1)
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    kv_cache_memory_gib: float = Field(4.0, gt=0)
    block_size: int = Field(16, ge=1)
    kernels: str | None = None
    model_impl: Literal["auto", "native", "transformers"] = "auto"
    num_threads: int | None = Field(None, ge=1)
    seed: int = 0
    json_output: bool = False
    save_result: Path | None = None


class BenchThroughputSettings(BenchEngineSettings):
    dataset: Literal["random", "mixed", "prefix"] = "random"
    num_prompts: int = Field(64, ge=1)
    input_len: int = Field(128, ge=1)
    output_len: int = Field(64, ge=1)
    min_input_len: int | None = Field(None, ge=1)
    min_output_len: int | None = Field(None, ge=1)
    prefix_len: int = Field(128, ge=0)


class BenchLatencySettings(BenchEngineSettings):
    batch_size: int = Field(8, ge=1)
    input_len: int = Field(32, ge=1)
    output_len: int = Field(128, ge=1)
    num_iters_warmup: int = Field(1, ge=0)
    num_iters: int = Field(5, ge=1)


# -- the options both commands share (one OptionInfo may default several commands' parameters) --

ModelArgument: Any = typer.Argument(
    None, help="Model directory, .gguf file or Hugging Face id in the local cache; default SmolLM2-135M-Instruct."
)
ExecutorOption: Any = typer.Option("uniproc", help="Executor plugin: uniproc, mp or ray.")
TensorParallelOption: Any = typer.Option(1, "--tensor-parallel-size", "-tp", help="Tensor-parallel workers.")
DtypeOption: Any = typer.Option("auto", help="auto, bfloat16, float16 or float32.")
MaxModelLenOption: Any = typer.Option(None, help="Context length (default: the model's, capped by the KV cache).")
MaxNumSeqsOption: Any = typer.Option(256, help="Most sequences in one step.")
MaxNumBatchedTokensOption: Any = typer.Option(2048, help="Most tokens in one step.")
PrefixCachingOption: Any = typer.Option(True, "--enable-prefix-caching/--no-enable-prefix-caching")
ChunkedPrefillOption: Any = typer.Option(True, "--enable-chunked-prefill/--no-enable-chunked-prefill")
KvCacheOption: Any = typer.Option(4.0, help="Memory for the KV cache, in GiB.")
BlockSizeOption: Any = typer.Option(16, help="Tokens per KV-cache block.")
KernelsOption: Any = typer.Option(None, help="Kernel set (default: the best for the device).")
ModelImplOption: Any = typer.Option("auto", help="auto, native or transformers.")
NumThreadsOption: Any = typer.Option(None, help="Torch threads of the engine (default: all cores).")
SeedOption: Any = typer.Option(0, help="Seed of the engine and of the random prompts.")
JsonOption: Any = typer.Option(False, "--json/--no-json", help="Print the result as JSON, not a table.")
SaveResultOption: Any = typer.Option(None, "--save-result", help="Also write the result as JSON to this file.")


def throughput(
    ctx: typer.Context,
    model: str | None = ModelArgument,
    dataset: str = typer.Option(
        "random",
        "--dataset",
        help="random: fixed lengths; mixed: lengths uniform between the min and max ones; "
        "prefix: one shared prefix, then each prompt's own tokens.",
    ),
    num_prompts: int = typer.Option(64, "--num-prompts", help="Requests, all given to one generate call."),
    input_len: int = typer.Option(128, "--input-len", help="Prompt tokens (mixed: the most; prefix: after it)."),
    output_len: int = typer.Option(64, "--output-len", help="Output tokens of each request (mixed: the most)."),
    min_input_len: int | None = typer.Option(
        None, "--min-input-len", help="mixed: the fewest prompt tokens (default: half of --input-len)."
    ),
    min_output_len: int | None = typer.Option(
        None, "--min-output-len", help="mixed: the fewest output tokens (default: half of --output-len)."
    ),
    prefix_len: int = typer.Option(128, "--prefix-len", help="prefix: tokens of the prefix all prompts share."),
    executor: str = ExecutorOption,
    tensor_parallel_size: int = TensorParallelOption,
    dtype: str = DtypeOption,
    max_model_len: int | None = MaxModelLenOption,
    max_num_seqs: int = MaxNumSeqsOption,
    max_num_batched_tokens: int = MaxNumBatchedTokensOption,
    enable_prefix_caching: bool = PrefixCachingOption,
    enable_chunked_prefill: bool = ChunkedPrefillOption,
    kv_cache_memory_gib: float = KvCacheOption,
    block_size: int = BlockSizeOption,
    kernels: str | None = KernelsOption,
    model_impl: str = ModelImplOption,
    num_threads: int | None = NumThreadsOption,
    seed: int = SeedOption,
    json_output: bool = JsonOption,
    save_result: Path | None = SaveResultOption,
    config: Path | None = ConfigOption,
) -> None:
    """Offline throughput: generate for every prompt in one batch and report tokens per second."""
    settings = _settings(BenchThroughputSettings, ctx)
    check_throughput(settings, settings.max_model_len, "--max-model-len")
    report = _interruptible(run_throughput, settings)
    _emit(report, settings, print_throughput_table)


def latency(
    ctx: typer.Context,
    model: str | None = ModelArgument,
    batch_size: int = typer.Option(8, "--batch-size", help="Prompts generated together in each iteration."),
    input_len: int = typer.Option(32, "--input-len", help="Prompt tokens."),
    output_len: int = typer.Option(128, "--output-len", help="Output tokens of each prompt."),
    num_iters_warmup: int = typer.Option(1, "--num-iters-warmup", help="Untimed iterations first."),
    num_iters: int = typer.Option(5, "--num-iters", help="Timed iterations."),
    executor: str = ExecutorOption,
    tensor_parallel_size: int = TensorParallelOption,
    dtype: str = DtypeOption,
    max_model_len: int | None = MaxModelLenOption,
    max_num_seqs: int = MaxNumSeqsOption,
    max_num_batched_tokens: int = MaxNumBatchedTokensOption,
    enable_prefix_caching: bool = PrefixCachingOption,
    enable_chunked_prefill: bool = ChunkedPrefillOption,
    kv_cache_memory_gib: float = KvCacheOption,
    block_size: int = BlockSizeOption,
    kernels: str | None = KernelsOption,
    model_impl: str = ModelImplOption,
    num_threads: int | None = NumThreadsOption,
    seed: int = SeedOption,
    json_output: bool = JsonOption,
    save_result: Path | None = SaveResultOption,
    config: Path | None = ConfigOption,
) -> None:
    """Offline latency: time one batch end to end, and its prefill alone, over several iterations."""
    settings = _settings(BenchLatencySettings, ctx)
    check_latency(settings, settings.max_model_len, "--max-model-len")
    report = _interruptible(run_latency, settings)
    _emit(report, settings, print_latency_table)


# -- settings and errors -------------------------------------------------------------


def usage_error(message: str) -> typer.Exit:
    """Print one ``llmp: error:`` line; the caller raises the returned exit (status 2)."""
    print(f"llmp: error: {message}", file=sys.stderr)
    return typer.Exit(2)


def _settings(settings_cls: type[Any], ctx: typer.Context) -> Any:
    try:
        return load_settings(settings_cls, ctx)
    except typer.BadParameter as exc:  # one line, not click's usage panel
        raise usage_error(exc.message) from None


def check_throughput(settings: BenchThroughputSettings, max_model_len: int | None, limit: str) -> None:
    """Usage errors of the workload; with ``max_model_len`` (named ``limit``), the longest request must fit it."""
    if settings.dataset == "mixed":
        min_in, min_out = mixed_bounds(settings)
        if min_in > settings.input_len:
            raise usage_error(f"--min-input-len ({min_in}) must be <= --input-len ({settings.input_len})")
        if min_out > settings.output_len:
            raise usage_error(f"--min-output-len ({min_out}) must be <= --output-len ({settings.output_len})")
    prefix = settings.prefix_len if settings.dataset == "prefix" else 0
    longest = prefix + settings.input_len + settings.output_len
    if max_model_len is not None and longest > max_model_len:
        what = "--prefix-len + --input-len + --output-len" if prefix else "--input-len + --output-len"
        raise usage_error(f"{what} ({longest}) exceeds {limit} ({max_model_len})")


def check_latency(settings: BenchLatencySettings, max_model_len: int | None, limit: str) -> None:
    longest = settings.input_len + settings.output_len
    if max_model_len is not None and longest > max_model_len:
        raise usage_error(f"--input-len + --output-len ({longest}) exceeds {limit} ({max_model_len})")


def mixed_bounds(settings: BenchThroughputSettings) -> tuple[int, int]:
    """The fewest prompt and output tokens of the mixed dataset (default: half the most, at least 1)."""
    min_in = settings.min_input_len if settings.min_input_len is not None else max(1, settings.input_len // 2)
    min_out = settings.min_output_len if settings.min_output_len is not None else max(1, settings.output_len // 2)
    return min_in, min_out


def _interruptible(run: Any, settings: Any) -> dict[str, Any]:
    try:
        return run(settings)
    except KeyboardInterrupt:
        print("llmp: interrupted", file=sys.stderr)
        raise typer.Exit(130) from None


def _emit(report: dict[str, Any], settings: BenchEngineSettings, print_table: Any) -> None:
    from llmp.cli.bench_cmd import emit_report

    emit_report(report, settings.json_output, settings.save_result, print_table)


# -- the workloads (pure: no engine, no torch) -------------------------------------------


def throughput_lengths(settings: BenchThroughputSettings) -> list[tuple[int, int]]:
    """(own prompt tokens, output tokens) of each request, seeded: the prefix dataset's prefix is not counted."""
    import random

    if settings.dataset != "mixed":
        return [(settings.input_len, settings.output_len)] * settings.num_prompts
    rng = random.Random(settings.seed)
    min_in, min_out = mixed_bounds(settings)
    return [
        (rng.randint(min_in, settings.input_len), rng.randint(min_out, settings.output_len))
        for _ in range(settings.num_prompts)
    ]


def throughput_workload(settings: BenchThroughputSettings, pool: list[int]) -> list[tuple[list[int], int]]:
    """(prompt token ids, output tokens) of each request, token ids drawn from ``pool``."""
    import random

    rng = random.Random(settings.seed + 1)  # its own stream: the lengths do not depend on the vocabulary
    prefix = rng.choices(pool, k=settings.prefix_len) if settings.dataset == "prefix" else []
    return [(prefix + rng.choices(pool, k=own), out) for own, out in throughput_lengths(settings)]


def random_prompts(rng: Any, pool: list[int], count: int, length: int) -> list[dict[str, list[int]]]:
    return [{"prompt_token_ids": rng.choices(pool, k=length)} for _ in range(count)]


# -- the engine ---------------------------------------------------------------------------


def engine_options(settings: BenchEngineSettings) -> dict[str, Any]:
    """``LLM(**options)`` of the settings (as ``llmp serve`` builds its engine)."""
    return {
        "executor": settings.executor,
        "tensor_parallel_size": settings.tensor_parallel_size,
        "dtype": settings.dtype,
        "max_model_len": settings.max_model_len,
        "max_num_seqs": settings.max_num_seqs,
        "max_num_batched_tokens": settings.max_num_batched_tokens,
        "enable_prefix_caching": settings.enable_prefix_caching,
        "enable_chunked_prefill": settings.enable_chunked_prefill,
        "kv_cache_memory_bytes": int(settings.kv_cache_memory_gib * (1 << 30)),
        "block_size": settings.block_size,
        "kernels": settings.kernels,
        "model_impl": settings.model_impl,
        "task": "generate",
        "num_threads": settings.num_threads,
        "seed": settings.seed,
    }


def load_engine(settings: BenchEngineSettings, command: str) -> tuple[Any, float]:
    """``LLM(model, **options)`` and the seconds it took; a model or option it refuses is a usage error."""
    import time

    from llmp.api import LLMPError
    from llmp.llm import LLM

    print(f"llmp bench {command}: loading {settings.model or 'the default model'}", file=sys.stderr)
    start = time.perf_counter()
    try:
        llm = LLM(settings.model, **engine_options(settings))
    except (LLMPError, ValueError, OSError) as exc:
        raise usage_error(f"cannot load the engine: {exc}") from None
    return llm, time.perf_counter() - start


def engine_facts(llm: Any, load_s: float) -> dict[str, Any]:
    import torch

    info = llm.engine.info
    return {
        "model": info.model,
        "kernels": info.kernels,
        "dtype": str(info.options.get("dtype", "")).removeprefix("torch."),
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


def run_throughput(settings: BenchThroughputSettings) -> dict[str, Any]:
    """Warm up, then time one ``generate`` of every request."""
    import contextlib
    import random
    import time

    with contextlib.redirect_stdout(sys.stderr):  # stdout carries the report alone
        llm, load_s = load_engine(settings, "throughput")
        try:
            check_throughput(settings, llm.engine.max_model_len, "the engine's max_model_len")
            pool = token_pool(llm)
            workload = throughput_workload(settings, pool)
            # Warm-up: prompts of their own (the prefix cache must not hold the timed prompts), as long as the first.
            warm = random_prompts(
                random.Random(settings.seed + 2), pool, min(WARMUP_PROMPTS, settings.num_prompts), len(workload[0][0])
            )
            llm.generate(warm, exact(min(WARMUP_TOKENS, settings.output_len)), use_tqdm=False)
            prompts = [{"prompt_token_ids": ids} for ids, _ in workload]
            params = [exact(out) for _, out in workload]
            print(f"llmp bench throughput: {len(prompts)} requests ({settings.dataset} dataset)", file=sys.stderr)
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
        "dataset": settings.dataset,
        "num_prompts": settings.num_prompts,
        "input_len": settings.input_len,
        "output_len": settings.output_len,
        "seed": settings.seed,
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
    if settings.dataset == "mixed":
        report["min_input_len"], report["min_output_len"] = mixed_bounds(settings)
    if settings.dataset == "prefix":
        report["prefix_len"] = settings.prefix_len
    return report


def run_latency(settings: BenchLatencySettings) -> dict[str, Any]:
    """Per iteration: the batch's prefill alone (one output token), then the whole batch, each timed."""
    import contextlib
    import random
    import statistics
    import time

    from llmp.cli.bench_cmd import percentile

    with contextlib.redirect_stdout(sys.stderr):
        llm, load_s = load_engine(settings, "latency")
        try:
            check_latency(settings, llm.engine.max_model_len, "the engine's max_model_len")
            pool = token_pool(llm)
            rng = random.Random(settings.seed)
            prefill_params, full_params = exact(1), exact(settings.output_len)

            def timed(params: Any) -> float:
                # fresh prompts every time: a batch seen before would come back from the prefix cache
                prompts = random_prompts(rng, pool, settings.batch_size, settings.input_len)
                start = time.perf_counter()
                outputs = llm.generate(prompts, params, use_tqdm=False)
                seconds = time.perf_counter() - start
                produced = [len(c.token_ids) for o in outputs for c in o.outputs]
                if produced != [params.max_tokens] * settings.batch_size:
                    raise RuntimeError(f"the engine produced {produced} tokens, not {params.max_tokens} each")
                return seconds

            for _ in range(settings.num_iters_warmup):
                timed(prefill_params)
                timed(full_params)
            print(
                f"llmp bench latency: {settings.num_iters} iterations of a batch of {settings.batch_size}",
                file=sys.stderr,
            )
            prefills, latencies = [], []
            for _ in range(settings.num_iters):
                prefills.append(timed(prefill_params))
                latencies.append(timed(full_params))
            facts = engine_facts(llm, load_s)
        finally:
            llm.shutdown()
    avg_latency = statistics.fmean(latencies)
    avg_prefill = statistics.fmean(prefills)
    decode_s = avg_latency - avg_prefill
    decode_tokens = settings.batch_size * (settings.output_len - 1)
    timed_decode = settings.output_len > 1 and decode_s > 0  # else no decode step, or noise hid it
    return {
        **facts,
        "batch_size": settings.batch_size,
        "input_len": settings.input_len,
        "output_len": settings.output_len,
        "num_iters_warmup": settings.num_iters_warmup,
        "num_iters": settings.num_iters,
        "seed": settings.seed,
        "avg_latency_s": avg_latency,
        "avg_latency": avg_latency,  # vLLM's name
        "latencies": latencies,
        "percentiles": {str(q): percentile(latencies, q) for q in PERCENTILES},
        "avg_prefill_s": avg_prefill,
        "prefill_latencies": prefills,
        "decode_tokens_per_s": decode_tokens / decode_s if timed_decode else None,
        "per_token_latency_ms": decode_s / (settings.output_len - 1) * 1000 if timed_decode else None,
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
