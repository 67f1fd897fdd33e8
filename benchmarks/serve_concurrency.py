"""``llmp bench serve`` against ``llmp serve`` at several concurrencies, on one model.

    .venv/bin/python benchmarks/serve_concurrency.py [--model-dir DIR] [--concurrency 1 4 16]

The default model is the Qwen2.5-0.5B-shaped Llama that ``benchmarks/engine_throughput.py`` builds
(random weights, real shapes), given a word-level tokenizer of its whole 151936-token vocabulary so that
every generated token streams as text (the engine benchmark's 400-token BPE leaves most ids without
text, and a stream would arrive in one piece at the end); ``--model-dir`` takes any other model. Each concurrency sends
``--requests-per-slot`` requests per concurrent slot of ``--input-len`` random-word prompts and
``--output-len`` generated tokens (ignore_eos), and reports the bench's figures as one table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from llmp.cli.bench_cmd import BenchServeSettings, run_benchmark
from llmp.testing import serving

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--requests-per-slot", type=int, default=2)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--serve-args", default="", help="extra `llmp serve` arguments, space-separated")
    args = parser.parse_args()
    if args.model_dir == DEFAULT_MODEL:
        args.model_dir = with_word_tokenizer(DEFAULT_MODEL)
    rows = []
    with serving(args.model_dir, "--disable-access-log", *args.serve_args.split(), ready_timeout=600) as server:
        for concurrency in args.concurrency:
            settings = BenchServeSettings(
                base_url=server.url,
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
