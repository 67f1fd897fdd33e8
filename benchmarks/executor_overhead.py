"""Cost of the process split and of tensor parallelism: uniproc vs mp (TP=1, TP=2).

    .venv/bin/python benchmarks/executor_overhead.py [--requests 16]

For each executor, in one run:
  step overhead  decode step time at batch 1 on a tiny model (2 layers, hidden 64), where
                 compute is negligible, so the time is the engine's and the executor's own;
  offline        output tok/s on the Qwen2.5-0.5B-shaped model of engine_throughput.py
                 (bfloat16; N requests, prompts 64-256, outputs 32-64, seeded).
Ratios are against uniproc. On a 2-core machine TP=2 gives each rank one core.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from engine_throughput import build_model, llmp_generate, random_prompts  # noqa: E402

EXECUTORS = [("uniproc", 1), ("mp", 1), ("mp", 2)]


def step_seconds(llm, steps: int = 64) -> float:
    from llmp import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=steps + 1, ignore_eos=True)
    llm.generate({"prompt_token_ids": [5, 6, 7]}, SamplingParams(max_tokens=2), use_tqdm=False)  # warm-up
    start = time.perf_counter()
    llm.generate({"prompt_token_ids": [5, 6, 7]}, params, use_tqdm=False)
    return (time.perf_counter() - start) / (steps + 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--model-dir", type=Path, default=Path.home() / ".cache" / "llmp" / "bench" / "qwen05b-shape")
    args = parser.parse_args()
    from llmp import LLM
    from llmp.testing import save_tiny_llama

    tiny = Path(tempfile.mkdtemp()) / "tiny"
    save_tiny_llama(tiny)
    model_dir = build_model(args.model_dir)
    rng = random.Random(0)
    prompt_lengths = [rng.randint(64, 256) for _ in range(args.requests)]
    output_lengths = [rng.randint(32, 64) for _ in range(args.requests)]
    prompts = random_prompts(rng, prompt_lengths)
    results: dict[str, float] = {}
    for executor, tp in EXECUTORS:
        label = f"{executor}_tp{tp}"
        llm = LLM(str(tiny), dtype="float32", max_model_len=256, executor=executor, tensor_parallel_size=tp)
        results[f"{label}_step_ms"] = step_seconds(llm) * 1000
        llm.shutdown()
        llm = LLM(str(model_dir), dtype="bfloat16", max_model_len=1024, executor=executor, tensor_parallel_size=tp)
        llmp_generate(llm, random_prompts(rng, [32]), [4])  # warm-up
        results[f"{label}_offline_tok_s"] = sum(output_lengths) / llmp_generate(llm, prompts, output_lengths)
        llm.shutdown()
        del llm
        print(
            f"{label:12s} step {results[f'{label}_step_ms']:8.2f} ms   "
            f"offline {results[f'{label}_offline_tok_s']:8.1f} tok/s",
            flush=True,
        )
    for executor, tp in EXECUTORS[1:]:
        label = f"{executor}_tp{tp}"
        results[f"{label}_step_overhead_ms"] = results[f"{label}_step_ms"] - results["uniproc_tp1_step_ms"]
        results[f"{label}_offline_ratio"] = results[f"{label}_offline_tok_s"] / results["uniproc_tp1_offline_tok_s"]
        print(
            f"{label:12s} step overhead {results[f'{label}_step_overhead_ms']:+.2f} ms   "
            f"offline ratio {results[f'{label}_offline_ratio']:.2f}x vs uniproc",
            flush=True,
        )
    print(json.dumps({k: round(v, 3) for k, v in results.items()}))


if __name__ == "__main__":
    main()
