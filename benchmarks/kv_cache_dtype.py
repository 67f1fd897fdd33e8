"""A float32 model's KV cache in 16 bits (--kv-cache-dtype): batch-1 decode over long contexts, and the tokens held.

    .venv/bin/python benchmarks/kv_cache_dtype.py                       # the default model's Q4_1 file
    .venv/bin/python benchmarks/kv_cache_dtype.py --contexts 128 4000 --rounds 3 --gguf path/to/model.gguf

For each context length, a random prompt of that many tokens is prefilled once (then in the prefix cache), and
batch-1 decode tok/s over it is N / (time for N + 1 tokens - time for 1 token). Each cache dtype runs in its own
process (the engine's OpenMP settings apply before torch loads), the dtypes taking turns for --rounds rounds, best
kept. Prints each run, then per context the tok/s of each dtype and its ratio to float32's, the KV cache's tokens
in the same memory (4 GiB, the CPU default), and a JSON line of all. The answers differ from float32's within the
cache's rounding (tests/engine/test_kv_cache_dtype.py); this measures speed and capacity only.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

DTYPES = ("float32", "bfloat16", "float16")


def worker(gguf: str, dtype: str, contexts: list[int], new: int, threads: int) -> dict:
    """One engine with a cache of ``dtype``: decode tok/s at each context, and its KV cache's tokens."""
    from llmp import LLM, SamplingParams

    llm = LLM(gguf, max_model_len=max(contexts) + new + 64, num_threads=threads, kv_cache_dtype=dtype)
    rng = random.Random(0)

    def seconds(prompt: list[int], tokens: int) -> float:
        params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
        started = time.perf_counter()
        llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
        return time.perf_counter() - started

    seconds([5] * 64, 8)  # first calls pay for allocations and the trace
    decode = {}
    for context in contexts:
        prompt = [rng.randrange(1000, llm.engine.vocab_size) for _ in range(context)]
        seconds(prompt, 1)  # its prefill, into the prefix cache
        decode[context] = new / (seconds(prompt, new + 1) - seconds(prompt, 1))
    options = llm.engine.info.options
    return {"decode_tok_s": decode, "kv_tokens": options["num_kv_blocks"] * options["block_size"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", default=None, help="a GGUF file (default: the default model's Q4_1 file)")
    parser.add_argument("--contexts", type=int, nargs="+", default=[128, 1000, 4000])
    parser.add_argument("--new", type=int, default=64, help="tokens decoded over each context")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--worker", choices=DTYPES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.gguf is None:
        from llmp.model_files.packaged import packaged_model
        from llmp.options import DEFAULT_MODEL

        location = packaged_model(DEFAULT_MODEL).location()
        if location is None:
            sys.exit("the default model's package is not installed; pass --gguf")
        args.gguf = str(location)
    if args.worker:
        print(json.dumps(worker(args.gguf, args.worker, args.contexts, args.new, args.threads)))
        return

    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        "unknown",
    )
    print(f"{Path(args.gguf).name}, {args.threads} threads, {cpu}, load {os.getloadavg()[0]:.2f}", flush=True)
    best: dict[str, dict[int, float]] = {dtype: {} for dtype in DTYPES}
    tokens: dict[str, int] = {}
    common = ["--gguf", args.gguf, "--new", str(args.new), "--threads", str(args.threads), "--contexts"]
    for round_index in range(args.rounds):
        for dtype in DTYPES:
            command = [sys.executable, __file__, *common, *map(str, args.contexts), "--worker", dtype]
            out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            figures = json.loads(out.splitlines()[-1])
            tokens[dtype] = figures["kv_tokens"]
            for context, rate in figures["decode_tok_s"].items():
                best[dtype][int(context)] = max(rate, best[dtype].get(int(context), 0.0))
            shown = ", ".join(f"{c}: {r:.1f}" for c, r in figures["decode_tok_s"].items())
            print(f"round {round_index + 1}: {dtype:8s} decode tok/s by context {shown}", flush=True)
    for context in args.contexts:
        base = best["float32"][context]
        shown = ", ".join(f"{d} {best[d][context]:.1f} ({best[d][context] / base:.2f}x)" for d in DTYPES)
        print(f"context {context}: {shown}")
    print("KV cache tokens in 4 GiB: " + ", ".join(f"{d} {tokens[d]}" for d in DTYPES))
    print(json.dumps({"gguf": Path(args.gguf).name, "cpu": cpu, "decode_tok_s": best, "kv_tokens": tokens}))


if __name__ == "__main__":
    main()
