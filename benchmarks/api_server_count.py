"""Requests per second of ``llmp serve --api-server-count N`` for N = 1, 2, 4, on a model that costs
nothing per step, so the API servers (HTTP, JSON, tokenization, detokenized streaming) are what
is measured, not the model.

    .venv/bin/python benchmarks/api_server_count.py [--counts 1 2 4] [--num-prompts 512] [--concurrency 64]

The null model is ``benchmarks/null_model`` (a real plugin, installed into a temporary directory,
as ``frontend_overhead.py`` does); the load is ``llmp bench serve``'s (streamed completions), sent
from this process. Each server is warmed up with a short run first.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
from pathlib import Path

from frontend_overhead import null_model_dir  # benchmarks/ is the script's directory

from llmp.cli.bench_cmd import BenchServeSettings, run_benchmark
from llmp.testing import pip_install_target, serving

HERE = Path(__file__).resolve().parent


async def _load(url: str, num_prompts: int, concurrency: int, output_len: int) -> dict:
    settings = BenchServeSettings(
        url=url, num_prompts=num_prompts, max_concurrency=concurrency, input_len=16, output_len=output_len
    )
    return await run_benchmark(settings)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--counts", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--num-prompts", type=int, default=512)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=16)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        site = root / "site"
        pip_install_target(site, HERE / "null_model")
        model = null_model_dir(root)
        env = {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
        for count in args.counts:
            flags = ("--api-server-count", str(count), "--disable-access-log", "--disable-log-stats")
            with serving(model, *flags, env=env, ready_timeout=300) as server:
                asyncio.run(_load(server.url, min(64, args.num_prompts), args.concurrency, 4))  # warm-up
                report = asyncio.run(_load(server.url, args.num_prompts, args.concurrency, args.output_len))
            assert report["failed"] == 0, report["first_error"]
            rows.append((count, report))
            print(f"N={count}: {report['request_throughput']:.1f} req/s", flush=True)
    print(f"\n{args.num_prompts} streamed completions, {args.concurrency} at once, {args.output_len} tokens each")
    print(f"{'N':>3} {'req/s':>8} {'tok/s':>9} {'median TTFT ms':>15} {'median ITL ms':>14} {'vs N=1':>7}")
    base = rows[0][1]["request_throughput"]
    for count, r in rows:
        print(
            f"{count:>3} {r['request_throughput']:8.1f} {r['output_throughput']:9.1f} {r['median_ttft_ms']:15.1f} "
            f"{r['median_itl_ms'] or 0:14.2f} {r['request_throughput'] / base:6.2f}x"
        )
    print(
        f"\nCPU cores: {os.cpu_count()}. The engine process runs the steps of every API server on one core "
        "(its loop, scheduling, sampling, detokenizing); the API servers need cores of their own beside it "
        "and the load generator's. With fewer cores than N + 2 the processes share them and N stops paying."
    )


if __name__ == "__main__":
    main()
