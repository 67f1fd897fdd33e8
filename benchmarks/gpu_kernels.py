"""The triton kernel set on a CUDA device: correctness, decode-attention bandwidth, engine throughput.

    python benchmarks/gpu_kernels.py [--requests 256] [--skip-e2e] [--kv-gib 40]
    python benchmarks/gpu_kernels.py --cpu-smoke    # part (a) only: tiny shapes, Triton's interpreter, no GPU

(a) correctness  every triton kernel against the torch set on Qwen3-0.6B shapes (16 heads, 8 KV
                 heads, head_dim 128, block 16, bfloat16): RMSNorm (+ residual, and per-head q/k
                 norm), rotary, SiLU/GELU-and-mul, write_kv with -1 slots, and paged attention on a
                 mixed batch (prefills, cached prefixes, decodes; plain, sliding window, softcap)
                 against the float32 torch result. Unwritten cache slots hold NaN.
(b) bandwidth    decode paged attention: K/V bytes read / kernel time, as a fraction of the device's
                 copy bandwidth (clone of 1 GiB: bytes read + written / time); the torch set beside it.
(c) throughput   offline generation, Qwen3-0.6B-shaped random model (hidden 1024, 28 layers, 16/8
                 heads x 128, intermediate 3072, vocab 151936, tied embeddings), N requests with input
                 and output lengths uniform in 100-1024, `LLM(device="cuda", kernels=...)` triton vs torch.

Prints a table per part and one JSON line of every figure; exits 1 when a correctness check fails.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

QWEN3 = dict(
    vocab_size=151936,
    hidden_size=1024,
    intermediate_size=3072,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    max_position_embeddings=4096,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    bos_token_id=0,
    eos_token_id=1,
)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cpu-smoke", action="store_true", help="part (a) on CPU under TRITON_INTERPRET=1")
    parser.add_argument("--requests", type=int, default=256, help="requests in part (c)")
    parser.add_argument("--skip-e2e", action="store_true", help="skip part (c)")
    parser.add_argument("--kv-gib", type=float, default=40.0, help="KV-cache memory per engine in part (c)")
    return parser.parse_args()


ARGS = parse_args()
if ARGS.cpu_smoke:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported, or @triton.jit compiles for a GPU

import torch

if not ARGS.cpu_smoke and not torch.cuda.is_available():
    sys.exit(
        "gpu_kernels.py needs a CUDA device and found none; "
        "`--cpu-smoke` runs the correctness part under Triton's interpreter instead"
    )

from llmp_kernels_torch.kernels import TorchKernels
from llmp_kernels_triton.kernels import TritonKernels

from llmp.api import AttentionMetadata
from llmp.modeling.rope import cos_sin_table

DEVICE = "cpu" if ARGS.cpu_smoke else "cuda"
REF, TRI = TorchKernels(), TritonKernels()
RESULTS: dict[str, Any] = {"device": "cpu (interpreter)" if ARGS.cpu_smoke else torch.cuda.get_device_name()}


# -- (a) correctness ---------------------------------------------------------------


def rand(*shape: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(*shape, device=DEVICE).to(dtype)


def compare(name: str, got: torch.Tensor, want: torch.Tensor, tol: float) -> bool:
    err = (got.float() - want.float()).abs().max().item() if got.numel() else 0.0
    ok = got.shape == want.shape and not got.isnan().any().item() and err <= tol * (1 + want.float().abs().max().item())
    RESULTS[f"err_{name}"] = err
    print(f"  {name:34s} max abs err {err:10.2e}  {'ok' if ok else 'FAIL'}", flush=True)
    return ok


def mixed_batch(
    requests: list[tuple[int, int]],
    heads: int,
    kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    window: int | None = None,
):
    """q, NaN-initialised caches holding every request's (cached + new) tokens, and the metadata."""
    blocks_needed = [-(-(c + n) // block_size) for c, n in requests]
    num_blocks = sum(blocks_needed) + 2
    k_cache = torch.full((num_blocks, block_size, kv_heads, head_dim), float("nan"), dtype=dtype, device=DEVICE)
    v_cache = k_cache.clone()
    order = torch.randperm(num_blocks, device=DEVICE)  # scattered physical blocks; order[-1] is never used
    tables = torch.full((len(requests), max(blocks_needed)), int(order[-1]), dtype=torch.int32, device=DEVICE)
    starts, slots, used = [0], [], 0
    for r, ((cached, new), count) in enumerate(zip(requests, blocks_needed)):
        blocks = order[used : used + count]
        used += count
        tables[r, :count] = blocks
        pos = torch.arange(cached + new, device=DEVICE)
        flat = blocks[pos // block_size] * block_size + pos % block_size
        REF.write_kv(
            rand(len(pos), kv_heads, head_dim, dtype=dtype),
            rand(len(pos), kv_heads, head_dim, dtype=dtype),
            k_cache,
            v_cache,
            flat,
        )
        slots.append(flat[cached:])
        starts.append(starts[-1] + new)
    seq_lens = [c + n for c, n in requests]
    meta = AttentionMetadata(
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=DEVICE),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE),
        block_tables=tables,
        slot_mapping=torch.cat(slots),
        max_query_len=max(n for _, n in requests),
        max_seq_len=max(seq_lens),
        sliding_window=window,
    )
    return rand(starts[-1], heads, head_dim, dtype=dtype), k_cache, v_cache, meta


def correctness() -> bool:
    torch.manual_seed(0)
    if ARGS.cpu_smoke:  # interpreter: every program runs in Python, so tiny shapes
        heads, kv_heads, head_dim, hidden, inter, block_size, tokens = 4, 2, 32, 64, 96, 4, 12
        requests = [(0, 9), (6, 5), (13, 1), (2, 1), (30, 1)]
        dtypes = [torch.float32, torch.bfloat16]
    else:
        heads, kv_heads, head_dim, hidden, inter, block_size, tokens = 16, 8, 128, 1024, 3072, 16, 512
        rng = random.Random(0)
        requests = (
            [(0, rng.randint(100, 900)) for _ in range(3)]
            + [(rng.randint(50, 900), rng.randint(20, 400)) for _ in range(3)]
            + [(rng.randint(1, 2000), 1) for _ in range(58)]
        )
        dtypes = [torch.bfloat16, torch.float16, torch.float32]
    print(f"(a) correctness against the torch set, on {DEVICE}")
    ok = True
    for dtype in dtypes:
        tag = str(dtype).removeprefix("torch.")
        tol = {torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 3e-2}[dtype]
        x, res, w = rand(tokens, hidden, dtype=dtype), rand(tokens, hidden, dtype=dtype), rand(hidden, dtype=dtype)
        out, summed = TRI.rms_norm(x, w, 1e-6, residual=res)
        ref_out, ref_summed = REF.rms_norm(x, w, 1e-6, residual=res)
        ok &= compare(f"rms_norm+residual {tag}", out, ref_out, tol)
        ok &= compare(f"rms_norm residual sum {tag}", summed, ref_summed, 0.0)
        heads_x, head_w = rand(tokens * heads, head_dim, dtype=dtype), rand(head_dim, dtype=dtype)
        ok &= compare(
            f"rms_norm per head {tag}", TRI.rms_norm(heads_x, head_w, 1e-6), REF.rms_norm(heads_x, head_w, 1e-6), tol
        )
        qkv = rand(tokens, (heads + 2 * kv_heads) * head_dim, dtype=dtype)
        q = qkv[:, : heads * head_dim].view(tokens, heads, head_dim)
        k = qkv[:, heads * head_dim : (heads + kv_heads) * head_dim].view(tokens, kv_heads, head_dim)
        positions = torch.randint(0, 4096, (tokens,), device=DEVICE)
        for rot in (head_dim, head_dim // 2):
            table = cos_sin_table(rot, 4096, 1000000.0).to(DEVICE)
            (q_out, k_out), (q_ref, k_ref) = TRI.rotary(positions, q, k, table), REF.rotary(positions, q, k, table)
            ok &= compare(f"rotary q R={rot} {tag}", q_out, q_ref, tol)
            ok &= compare(f"rotary k R={rot} {tag}", k_out, k_ref, tol)
        gate_up = rand(tokens, 2 * inter, dtype=dtype) * 3
        ok &= compare(f"silu_and_mul {tag}", TRI.silu_and_mul(gate_up), REF.silu_and_mul(gate_up), tol)
        ok &= compare(f"gelu_tanh_and_mul {tag}", TRI.gelu_tanh_and_mul(gate_up), REF.gelu_tanh_and_mul(gate_up), tol)
        caches = [
            torch.full(
                (tokens // block_size + 4, block_size, kv_heads, head_dim), float("nan"), dtype=dtype, device=DEVICE
            )
            for _ in range(4)
        ]
        slots = torch.randperm(caches[0].shape[0] * block_size, device=DEVICE)[:tokens]
        slots[::3] = -1
        kk, vv = rand(tokens, kv_heads, head_dim, dtype=dtype), rand(tokens, kv_heads, head_dim, dtype=dtype)
        TRI.write_kv(kk, vv, caches[0], caches[1], slots)
        REF.write_kv(kk, vv, caches[2], caches[3], slots)
        same = all(
            torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())
            for a, b in zip(caches[:2], caches[2:])
        )
        print(
            f"  {'write_kv (-1 slots) ' + tag:34s} {'identical' if same else 'DIFFERENT':>24s}  "
            f"{'ok' if same else 'FAIL'}"
        )
        ok &= same
        for window, softcap in ((None, None), (256 if not ARGS.cpu_smoke else 5, None), (None, 30.0)):
            q_att, k_cache, v_cache, meta = mixed_batch(requests, heads, kv_heads, head_dim, block_size, dtype, window)
            scale = 1 / math.sqrt(head_dim)
            got = TRI.paged_attention(q_att, k_cache, v_cache, meta, scale, softcap=softcap)
            want = REF.paged_attention(q_att.float(), k_cache.float(), v_cache.float(), meta, scale, softcap=softcap)
            ok &= compare(f"paged_attention w={window} cap={softcap} {tag}", got, want, tol)
    RESULTS["correct"] = bool(ok)
    return bool(ok)


# -- (b) decode attention bandwidth ------------------------------------------------


def bench_ms(fn) -> float:
    import triton.testing

    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def bandwidth() -> None:
    big = torch.empty(1 << 29, dtype=torch.bfloat16, device=DEVICE)  # 1 GiB
    copy_gbs = 2 * big.numel() * 2 / bench_ms(big.clone) / 1e6
    del big
    RESULTS["copy_GBps"] = copy_gbs
    print(f"(b) decode paged attention (16/8 heads x 128, block 16, bf16); copy bandwidth {copy_gbs:,.0f} GB/s")
    print(f"  {'batch x context':18s} {'triton GB/s':>12s} {'of copy':>8s} {'torch GB/s':>11s}")
    for batch, context in ((32, 1024), (128, 1024), (256, 2048), (8, 8192)):
        q, k_cache, v_cache, meta = mixed_batch([(context - 1, 1)] * batch, 16, 8, 128, 16, torch.bfloat16)
        kv_bytes = batch * context * 8 * 128 * 2 * 2  # K and V, bf16
        times = {}
        for name, kernels in (("triton", TRI), ("torch", REF)):
            times[name] = bench_ms(
                lambda s=kernels, q=q, k=k_cache, v=v_cache, m=meta: s.paged_attention(q, k, v, m, 128**-0.5)
            )
        triton_gbs, torch_gbs = (kv_bytes / times[n] / 1e6 for n in ("triton", "torch"))
        key = f"decode_b{batch}_ctx{context}"
        RESULTS[key] = {
            "triton_GBps": triton_gbs,
            "triton_of_copy": triton_gbs / copy_gbs,
            "torch_GBps": torch_gbs,
            "triton_ms": times["triton"],
            "torch_ms": times["torch"],
        }
        print(
            f"  {batch:5d} x {context:<10d} {triton_gbs:12,.0f} {triton_gbs / copy_gbs:8.1%} {torch_gbs:11,.0f}",
            flush=True,
        )
        del q, k_cache, v_cache


# -- (c) engine throughput -----------------------------------------------------------


def build_model(path: Path) -> Path:
    if (path / "config.json").is_file():
        return path
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from llmp.testing import tiny_tokenizer

    torch.manual_seed(0)
    config = Qwen3Config(**QWEN3)
    config.dtype = "bfloat16"
    Qwen3ForCausalLM(config).to(torch.bfloat16).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)  # ids past its vocabulary decode to nothing: fine for speed
    return path


def throughput() -> None:
    from llmp import LLM, SamplingParams

    path = build_model(Path.home() / ".cache" / "llmp" / "bench" / "qwen3-0.6b-shaped")
    rng = random.Random(0)
    prompts = [[rng.randrange(1000, 100000) for _ in range(rng.randint(100, 1024))] for _ in range(ARGS.requests)]
    outputs = [rng.randint(100, 1024) for _ in range(ARGS.requests)]
    print(f"(c) offline throughput, {ARGS.requests} requests, Qwen3-0.6B-shaped bf16, in/out uniform 100-1024")
    for kernels in ("triton", "torch"):
        llm = LLM(
            str(path),
            device="cuda",
            kernels=kernels,
            dtype="bfloat16",
            kv_cache_memory_bytes=int(ARGS.kv_gib * (1 << 30)),
            max_num_seqs=256,
            max_num_batched_tokens=8192,
            enable_prefix_caching=False,
        )
        assert llm.engine.info.kernels == kernels
        warm = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)  # compiles the kernels' variants
        llm.generate([{"prompt_token_ids": p[:200]} for p in prompts[:4]], warm, use_tqdm=False)
        params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in outputs]
        torch.cuda.synchronize()
        start = time.perf_counter()
        done = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        elapsed = time.perf_counter() - start
        generated = sum(len(o.outputs[0].token_ids) for o in done)
        assert generated == sum(outputs)
        RESULTS[f"e2e_{kernels}"] = {
            "seconds": elapsed,
            "output_tok_s": generated / elapsed,
            "total_tok_s": (generated + sum(map(len, prompts))) / elapsed,
        }
        print(f"  {kernels:8s} {elapsed:8.1f} s  {generated / elapsed:10,.0f} output tok/s", flush=True)
        llm.shutdown()
        del llm
        torch.cuda.empty_cache()
    RESULTS["e2e_speedup_triton_over_torch"] = (
        RESULTS["e2e_triton"]["output_tok_s"] / RESULTS["e2e_torch"]["output_tok_s"]
    )


def main() -> int:
    started = time.perf_counter()
    ok = correctness()
    if not ARGS.cpu_smoke:
        bandwidth()
        if not ARGS.skip_e2e:
            throughput()
    RESULTS["seconds"] = time.perf_counter() - started
    print(json.dumps(RESULTS))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
