"""Engine throughput on a Qwen2.5-0.5B-shaped random model, beside transformers in the same run.

    .venv/bin/python benchmarks/engine_throughput.py [--quick] [--skip-hf] [--threads 2]

Workloads (bfloat16, random prompt ids, EOS ignored, seeded):
  offline   64 requests, prompts 64-512 tokens, outputs 64-256 tokens; transformers runs
            the same requests through `generate` in static batches of 16 (left-padded,
            each batch generating to its longest request; only requested tokens count).
  decode    batch 1, 8 and 32, 128-token prompts, 256 new tokens:
            decode tok/s = B * (N - 1) / (time for N tokens - time for 1 token);
            batch 1 beside the roofline: weight bytes read per token / memory bandwidth
            measured in this run.
  prefix    32 requests sharing a 512-token prefix plus 32 own tokens, 1 new token each:
            mean time to first token with prefix caching on and off.

The model is Llama-architecture with Qwen2.5-0.5B's shapes (hidden 896, 24 layers,
14 heads, 2 KV heads, intermediate 4864, vocab 151936, tied embeddings); it is built
once under ~/.cache/llmp/bench. Prints one table and a JSON line of every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

SHAPE = dict(
    vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
    num_key_value_heads=2, max_position_embeddings=4096, rope_theta=1000000.0, rms_norm_eps=1e-6,
    tie_word_embeddings=True, bos_token_id=0, eos_token_id=1,
)


def build_model(path: Path) -> Path:
    if (path / "config.json").is_file():
        return path
    from transformers import LlamaConfig, LlamaForCausalLM

    from llmp.testing import tiny_tokenizer

    torch.manual_seed(0)
    config = LlamaConfig(**SHAPE)
    config.dtype = "bfloat16"
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)  # ids past its vocabulary decode to nothing: fine for speed
    return path


def memory_bandwidth() -> float:
    """GB/s of a streaming read (sum of 1 GiB), best of 5."""
    data = torch.ones(1 << 28, dtype=torch.float32)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        data.sum()
        best = min(best, time.perf_counter() - start)
    return data.numel() * 4 / best / 1e9


def report(results: dict[str, float], *keys: str) -> None:
    for key in keys:
        print(f"{key:32s} {results[key]:10.3f}", flush=True)


def random_prompts(rng: random.Random, lengths: list[int]) -> list[list[int]]:
    return [[rng.randrange(1000, 100000) for _ in range(n)] for n in lengths]


# -- llmp ---------------------------------------------------------------------


def llmp_generate(llm, prompts: list[list[int]], new_tokens: list[int]) -> float:
    from llmp import SamplingParams

    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in new_tokens]
    start = time.perf_counter()
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    assert [len(o.outputs[0].token_ids) for o in outputs] == new_tokens
    return elapsed


def llmp_mean_ttft(llm, prompts: list[list[int]]) -> float:
    from llmp import SamplingParams

    engine = llm.engine
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    start = time.perf_counter()
    for i, prompt in enumerate(prompts):
        engine.add_request(f"ttft-{time.monotonic_ns()}-{i}", {"prompt_token_ids": prompt}, params)
    first: list[float] = []
    while engine.has_unfinished_requests():
        first += [time.perf_counter() - start for o in engine.step() if o.outputs[0].token_ids]
    return statistics.mean(first)


# -- transformers ---------------------------------------------------------------


def hf_generate(model, prompts: list[list[int]], new_tokens: list[int], batch_size: int) -> float:
    """Static batches: left-padded, each batch runs to its longest requested output."""
    start = time.perf_counter()
    for i in range(0, len(prompts), batch_size):
        batch, wanted = prompts[i : i + batch_size], new_tokens[i : i + batch_size]
        width = max(map(len, batch))
        ids = torch.tensor([[0] * (width - len(p)) + p for p in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        with torch.inference_mode():
            model.generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=max(wanted), min_new_tokens=max(wanted),
                do_sample=False, eos_token_id=None, pad_token_id=0,
            )
    return time.perf_counter() - start


# -- main -----------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller workloads (a smoke run)")
    parser.add_argument("--skip-hf", action="store_true", help="llmp figures only")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model-dir", type=Path, default=Path.home() / ".cache" / "llmp" / "bench" / "qwen05b-shape")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from llmp import LLM

    scale = 4 if args.quick else 1
    model_dir = build_model(args.model_dir)
    results: dict[str, float] = {"threads": args.threads, "bandwidth_gb_s": memory_bandwidth()}
    rng = random.Random(0)
    llm = LLM(str(model_dir), dtype="bfloat16", max_model_len=1024, max_num_seqs=64, max_num_batched_tokens=2048)
    hf = None
    if not args.skip_hf:
        from transformers import AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).eval()

    # warm-up: first calls pay for allocations and oneDNN primitive creation
    llmp_generate(llm, random_prompts(rng, [64, 32]), [4, 4])
    if hf is not None:
        hf_generate(hf, random_prompts(rng, [64]), [4], 1)

    # offline mixed workload
    count = 64 // scale
    prompt_lengths = [rng.randint(64, 512 // scale) for _ in range(count)]
    output_lengths = [rng.randint(64 // scale, 256 // scale) for _ in range(count)]
    prompts = random_prompts(rng, prompt_lengths)
    total_out = sum(output_lengths)
    results["offline_llmp_tok_s"] = total_out / llmp_generate(llm, prompts, output_lengths)
    if hf is not None:
        results["offline_hf_tok_s"] = total_out / hf_generate(hf, prompts, output_lengths, 16)
        results["offline_ratio"] = results["offline_llmp_tok_s"] / results["offline_hf_tok_s"]
    report(results, *[k for k in results if k.startswith("offline")])

    # decode at fixed batch sizes
    new = 256 // scale
    for batch in (1, 8, 32):
        prompts = random_prompts(rng, [128] * batch)
        one = llmp_generate(llm, prompts, [1] * batch)
        full = llmp_generate(llm, random_prompts(rng, [128] * batch), [new] * batch)
        results[f"decode_b{batch}_llmp_tok_s"] = batch * (new - 1) / (full - one)
        if hf is not None:
            one = hf_generate(hf, prompts, [1] * batch, batch)
            full = hf_generate(hf, prompts, [new] * batch, batch)
            results[f"decode_b{batch}_hf_tok_s"] = batch * (new - 1) / (full - one)
            results[f"decode_b{batch}_ratio"] = results[f"decode_b{batch}_llmp_tok_s"] / results[f"decode_b{batch}_hf_tok_s"]
        report(results, *[k for k in results if k.startswith(f"decode_b{batch}")])
    weight_bytes = sum(p.numel() for p in llm.engine.executor.runner.model.parameters()) * 2
    results["weights_gb_per_token"] = weight_bytes / 1e9
    results["roofline_b1_tok_s"] = results["bandwidth_gb_s"] / results["weights_gb_per_token"]
    results["decode_b1_roofline_fraction"] = results["decode_b1_llmp_tok_s"] / results["roofline_b1_tok_s"]

    # prefix-heavy time to first token, cache on vs off
    prefix = random_prompts(rng, [512 // scale])[0]
    shared = [prefix + p for p in random_prompts(rng, [32] * (32 // scale))]
    for label, caching in (("on", True), ("off", False)):
        engine_llm = LLM(str(model_dir), dtype="bfloat16", max_model_len=1024, max_num_seqs=64,
                         max_num_batched_tokens=2048, enable_prefix_caching=caching)
        llmp_mean_ttft(engine_llm, random_prompts(rng, [16]))  # warm-up
        results[f"prefix_ttft_cache_{label}_s"] = llmp_mean_ttft(engine_llm, shared)
        del engine_llm
    results["prefix_ttft_speedup"] = results["prefix_ttft_cache_off_s"] / results["prefix_ttft_cache_on_s"]

    print("-- all figures", flush=True)
    report(results, *results)
    print(json.dumps({k: round(v, 4) for k, v in results.items()}))


if __name__ == "__main__":
    main()
