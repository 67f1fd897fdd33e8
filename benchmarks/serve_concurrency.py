"""``llmp bench serve`` against ``llmp serve`` at several concurrencies, on one model.

    .venv/bin/python benchmarks/serve_concurrency.py [--model-dir DIR] [--concurrency 1 4 16]

The default model is the Qwen2.5-0.5B-shaped Llama that ``benchmarks/engine_throughput.py`` builds
(random weights, real shapes); ``--model-dir`` takes any other. Each concurrency sends
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
COLUMNS = ("request_throughput", "output_throughput", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms",
           "median_itl_ms", "p99_itl_ms", "median_e2el_ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--requests-per-slot", type=int, default=2)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--serve-args", default="", help="extra `llmp serve` arguments, space-separated")
    args = parser.parse_args()
    if args.model_dir == DEFAULT_MODEL and not DEFAULT_MODEL.exists():
        from engine_throughput import build_model  # the same model the engine benchmark measures

        build_model(DEFAULT_MODEL)
    rows = []
    with serving(args.model_dir, "--disable-access-log", *args.serve_args.split(), ready_timeout=600) as server:
        for concurrency in args.concurrency:
            settings = BenchServeSettings(
                base_url=server.url, num_prompts=concurrency * args.requests_per_slot, max_concurrency=concurrency,
                input_len=args.input_len, output_len=args.output_len)
            report = asyncio.run(run_benchmark(settings))
            assert report["failed"] == 0, report["first_error"]
            rows.append((concurrency, report))
            print(json.dumps({"concurrency": concurrency, **{k: report[k] for k in COLUMNS}}), flush=True)
    print("\n| concurrency | req/s | output tok/s | TTFT median / p99 (ms) | TPOT median (ms) | ITL median / p99 (ms) "
          "| E2E median (ms) |\n|---|---|---|---|---|---|---|")
    for concurrency, r in rows:
        print(f"| {concurrency} | {r['request_throughput']:.2f} | {r['output_throughput']:.1f} | "
              f"{r['median_ttft_ms']:.0f} / {r['p99_ttft_ms']:.0f} | {r['median_tpot_ms']:.1f} | "
              f"{r['median_itl_ms']:.1f} / {r['p99_itl_ms']:.1f} | {r['median_e2el_ms']:.0f} |")


if __name__ == "__main__":
    main()
