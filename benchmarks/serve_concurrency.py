"""``llmp bench serve`` against ``llmp serve`` at several concurrencies, on one model, and beside ``vllm serve``.

    .venv/bin/python benchmarks/serve_concurrency.py [--model-dir DIR] [--concurrency 1 4 16]
                                                     [--vllm-python PATH] [--rounds 2] [--kernels NAME]

The default model is the Qwen2.5-0.5B-shaped Llama that ``benchmarks/engine_throughput.py`` builds
(random weights, real shapes), given a word-level tokenizer of its whole 151936-token vocabulary so that
every generated token streams as text (the engine benchmark's 400-token BPE leaves most ids without
text, and a stream would arrive in one piece at the end); ``--model-dir`` takes any other model. Each concurrency sends
``--requests-per-slot`` requests per concurrent slot of ``--input-len`` random-word prompts and
``--output-len`` generated tokens (ignore_eos), and reports the bench's figures as one table.

With ``--vllm-python`` (a venv with vLLM's CPU build: ``engine_throughput.py --setup-vllm`` makes one), ``vllm
serve`` runs on the same model directory beside ``llmp serve``, both alive, with the engine benchmark's limits
(bfloat16, max_model_len 1024, max_num_seqs 64, max_num_batched_tokens 2048) and vLLM's worker bound to the
same cores; the same client sends the same prompts to each in turn at every concurrency, ``--rounds`` times, and
the best round of each is compared: output tok/s and TTFT p99, llmp / vLLM. ``engine_throughput.py`` runs this
as its ``online`` workload.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from llmp.cli.bench_cmd import BenchServeSettings, run_benchmark
from llmp.testing import LiveServer, free_port, serving

DEFAULT_MODEL = Path.home() / ".cache" / "llmp" / "bench" / "qwen05b-shape"
COLUMNS = (
    "request_throughput",
    "output_throughput",
    "median_ttft_ms",
    "p99_ttft_ms",
    "median_tpot_ms",
    "median_itl_ms",
    "p99_itl_ms",
    "median_e2el_ms",
)


def with_word_tokenizer(model_dir: Path) -> Path:
    """The engine benchmark's model (built if missing), beside a tokenizer with a word for every id."""
    from engine_throughput import build_model
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from llmp.cli.bench_cmd import WORDS

    build_model(model_dir)
    words_dir = model_dir.with_name(model_dir.name + "-words")
    if (words_dir / "tokenizer.json").is_file():
        return words_dir
    words_dir.mkdir(exist_ok=True)
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        if (model_dir / name).exists() and not (words_dir / name).exists():
            (words_dir / name).symlink_to(model_dir / name)
    vocab_size = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    names = ["<s>", "</s>", "<unk>", *dict.fromkeys(WORDS)]
    names += [f"w{i}" for i in range(vocab_size - len(names))]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(names)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    ).save_pretrained(words_dir)
    return words_dir


ENGINE_LIMITS = {"max-model-len": 1024, "max-num-seqs": 64, "max-num-batched-tokens": 2048}  # engine_throughput's


def limit_args() -> list[str]:
    return ["--dtype", "bfloat16", *(a for name, value in ENGINE_LIMITS.items() for a in (f"--{name}", str(value)))]


@contextmanager
def vllm_serving(python: Path, model_dir: Path, threads: int) -> Iterator[LiveServer]:
    """``vllm serve MODEL_DIR`` (its OpenAI server) on a free loopback port until the block ends."""
    port = free_port()
    env = {
        **os.environ,
        "VLLM_CPU_OMP_THREADS_BIND": f"0-{threads - 1}",
        "VLLM_CPU_KVCACHE_SPACE": "4",
        "HF_HUB_OFFLINE": "1",
    }
    log_path = Path(tempfile.mkstemp(prefix="vllm-serve-", suffix=".log")[1])
    command = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir)]
    command += ["--host", "127.0.0.1", "--port", str(port), "--seed", "0", "--disable-uvicorn-access-log"]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command + limit_args(), stdout=log, stderr=subprocess.STDOUT, env=env)
    server = LiveServer(process, port, log_path)
    try:
        server.wait_ready(900)
        yield server
    finally:
        server.stop()


def bench(url: str, concurrency: int, requests_per_slot: int, input_len: int, output_len: int) -> dict:
    settings = BenchServeSettings(
        url=url,
        num_prompts=concurrency * requests_per_slot,
        max_concurrency=concurrency,
        input_len=input_len,
        output_len=output_len,
    )
    report = asyncio.run(run_benchmark(settings))
    assert report["failed"] == 0, report["first_error"]
    return report


def compare_online(
    model_dir: Path,
    vllm_python: Path,
    *,
    threads: int = 2,
    kernels: str | None = None,
    concurrency: tuple[int, ...] = (1, 4, 16),
    rounds: int = 2,
    requests_per_slot: int = 2,
    input_len: int = 128,
    output_len: int = 64,
    serve_args: tuple[str, ...] = (),
) -> dict[str, float]:
    """``llmp serve`` and ``vllm serve`` under the same client, taking turns; the best round of each side.
    Returns ``online_c{C}_{llmp|vllm}_tok_s``, ``..._ttft_p99_ms`` and the ratios llmp / vLLM."""
    llmp_args = ["--disable-access-log", *limit_args(), *(["--kernels", kernels] if kernels else []), *serve_args]
    env = {"OMP_NUM_THREADS": str(threads)}
    results: dict[str, float] = {}
    with (
        serving(model_dir, *llmp_args, env=env, ready_timeout=600) as ours,
        vllm_serving(vllm_python, model_dir, threads) as theirs,
    ):
        servers = {"llmp": ours.url, "vllm": theirs.url}
        for url in servers.values():  # first requests pay for allocations, primitive creation, compilation
            bench(url, 2, 1, input_len, 8)
        for _ in range(rounds):
            for c in concurrency:
                for name, url in servers.items():
                    report = bench(url, c, requests_per_slot, input_len, output_len)
                    tok_s, p99 = f"online_c{c}_{name}_tok_s", f"online_c{c}_{name}_ttft_p99_ms"
                    results[tok_s] = max(results.get(tok_s, 0.0), report["output_throughput"])
                    results[p99] = min(results.get(p99, float("inf")), report["p99_ttft_ms"])
    for c in concurrency:
        results[f"online_c{c}_tok_s_ratio_vllm"] = (
            results[f"online_c{c}_llmp_tok_s"] / results[f"online_c{c}_vllm_tok_s"]
        )
        results[f"online_c{c}_ttft_p99_ratio_vllm"] = (
            results[f"online_c{c}_llmp_ttft_p99_ms"] / results[f"online_c{c}_vllm_ttft_p99_ms"]
        )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--requests-per-slot", type=int, default=2)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--serve-args", default="", help="extra `llmp serve` arguments, space-separated")
    parser.add_argument("--vllm-python", type=Path, help="python of a venv with vllm-cpu: compare with vllm serve")
    parser.add_argument("--rounds", type=int, default=2, help="with --vllm-python: turns of each side; best kept")
    parser.add_argument("--kernels", default=None, help="with --vllm-python: llmp's kernel set")
    parser.add_argument("--threads", type=int, default=2, help="with --vllm-python: cores of each engine")
    args = parser.parse_args()
    if args.model_dir == DEFAULT_MODEL:
        args.model_dir = with_word_tokenizer(DEFAULT_MODEL)
    if args.vllm_python:
        figures = compare_online(
            args.model_dir,
            args.vllm_python,
            threads=args.threads,
            kernels=args.kernels,
            concurrency=tuple(args.concurrency),
            rounds=args.rounds,
            requests_per_slot=args.requests_per_slot,
            input_len=args.input_len,
            output_len=args.output_len,
            serve_args=tuple(args.serve_args.split()),
        )
        for key, value in figures.items():
            print(f"{key:40s} {value:10.2f}")
        print(json.dumps({k: round(v, 4) for k, v in figures.items()}))
        return
    rows = []
    with serving(args.model_dir, "--disable-access-log", *args.serve_args.split(), ready_timeout=600) as server:
        for concurrency in args.concurrency:
            settings = BenchServeSettings(
                url=server.url,
                num_prompts=concurrency * args.requests_per_slot,
                max_concurrency=concurrency,
                input_len=args.input_len,
                output_len=args.output_len,
            )
            report = asyncio.run(run_benchmark(settings))
            assert report["failed"] == 0, report["first_error"]
            rows.append((concurrency, report))
            print(json.dumps({"concurrency": concurrency, **{k: report[k] for k in COLUMNS}}), flush=True)
    print(
        "\n| concurrency | req/s | output tok/s | TTFT median / p99 (ms) | TPOT median (ms) | ITL median / p99 (ms) "
        "| E2E median (ms) |\n|---|---|---|---|---|---|---|"
    )
    for concurrency, r in rows:
        cells = [
            ("-" if r[k] is None else f"{r[k]:.2f}" if k == "request_throughput" else f"{r[k]:.1f}") for k in COLUMNS
        ]
        print(
            f"| {concurrency} | {cells[0]} | {cells[1]} | {cells[2]} / {cells[3]} | {cells[4]} | "
            f"{cells[5]} / {cells[6]} | {cells[7]} |"
        )


if __name__ == "__main__":
    main()
