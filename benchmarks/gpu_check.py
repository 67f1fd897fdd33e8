"""The GPU check (issue 25): kernels, greedy parity, bandwidth, throughput and start-up on one CUDA device.

    python benchmarks/gpu_check.py --quick          # a first run on the GPU machine, about 3 minutes
    python benchmarks/gpu_check.py                  # the full check, at most 8 minutes
    python benchmarks/gpu_check.py --device cpu     # smoke: every section on tiny shapes, no GPU

It runs on the GPU machine's own torch, triton and transformers, with llmp installed from the working
tree without its dependencies (`pip install --no-deps --no-build-isolation -e . -e plugins/kernels/torch
-e plugins/kernels/triton -e plugins/models/llama -e plugins/models/qwen -e plugins/frontends/openai`),
and uses no network: the models are random, written to disk in Hugging Face format with a tiny tokenizer.

(1) kernels   every triton kernel against the torch set on the device, on Llama-3-8B's attention shapes
              (32/8 heads x 128, blocks of 16) in bf16, fp16 and fp32 (--quick: bf16): RMSNorm (+ residual, per head),
              rotary (whole and partial), SiLU/GELU-and-mul, write_kv with -1 slots, paged attention on a
              mixed batch (prefills, cached prefixes, decodes; plain, sliding window, softcap) against the
              float32 torch result (unwritten cache slots hold NaN), the GGML quantised matmuls against
              llmp.quantization.matmul_reference (within the float32-accumulation bound), LoRA shrink/expand.
(2) parity    a tiny random Llama and Qwen2 (float32): llmp `LLM(dir, device, kernels="triton")` greedy
              tokens equal transformers' `generate(do_sample=False)` on the same device, token for token
              (blocks of 4, chunked prefill, prefix-cache hits).
(3) bandwidth decode paged attention on Llama-3-8B's heads (32/8 x 128, blocks of 16, bf16): K/V bytes read
              per second as a share of the copy bandwidth (clone of 1 GiB: bytes read + written / time)
              measured in the same run. Goal: at least 70%.
(4) offline   random bf16 models shaped like Qwen2.5-0.5B and Llama-3-8B, the engine benchmark's mixed
              workload (64 requests, prompts 64-512 tokens, outputs 64-256, random ids, EOS ignored): llmp
              `LLM(device=...)` against transformers' `generate` in static batches of 16 (left-padded, each
              batch to its longest output), same requests. Goal: at least 5x. Batch-1 decode (128-token
              prompt; (N - N/8) / (time of N tokens - time of N/8)) against the roofline: the copy bandwidth of
              (3) over the weight bytes a decode step reads. Goal for the 8B shape: at least 60%.
(5) serve     `llmp serve DIR --device cuda` of the 8B shape, from the process start to /health
              answering 200. Goal: at most 30 s.

Prints a table per section (goal, measured, verdict) and writes every figure to one JSON file
(--json; default gpu_check.json in $OUT when set, else in the current directory). A section that
would pass the time budget (8 minutes from the start) is skipped, and one still running at the
budget is cut; the script says which. Exits 1 when a correctness check fails or a section fails
with an error. With --device cpu the Triton kernels run under Triton's interpreter, the models are
tiny and the goals read "n/a (cpu smoke)".
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import math
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STARTED = time.perf_counter()
for _var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ.setdefault(_var, "1")  # no network, no Hugging Face hub
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

SECTIONS = ("kernels", "parity", "bandwidth", "offline", "serve")
SMOKE = "n/a (cpu smoke)"
GOAL_ATTENTION, GOAL_OFFLINE, GOAL_ROOFLINE, GOAL_SERVE_S = 0.70, 5.0, 0.60, 30.0

# The random-weight models of (4) and (5); the smoke run gives them TINY's sizes
SHAPES: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b": dict(
        architectures="Qwen2ForCausalLM",
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=4096,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=1,
    ),
    "llama-3-8b": dict(
        architectures="LlamaForCausalLM",
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=8192,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=1,
    ),
}
TINY = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=512,
)

# Seconds a section needs at least, by mode: one that would not fit in what is left is skipped
ESTIMATES = {
    "cuda": dict(kernels=30, parity=10, bandwidth=10, offline=60, serve=25),
    "cpu": dict(kernels=10, parity=15, bandwidth=3, offline=20, serve=8),
}
SHAPE_ESTIMATES = {"cuda": {"qwen2.5-0.5b": 20, "llama-3-8b": 60}, "cpu": {"qwen2.5-0.5b": 8, "llama-3-8b": 8}}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default=None,
        help="cuda (the default when torch sees one), or cpu: the smoke run on tiny shapes under TRITON_INTERPRET=1",
    )
    parser.add_argument("--quick", action="store_true", help="smaller counts: a first GPU run in about 3 minutes")
    parser.add_argument(
        "--json", type=Path, default=None, help="where the figures go (default: gpu_check.json in $OUT or here)"
    )
    parser.add_argument(
        "--sections", default=",".join(SECTIONS), help=f"comma-separated, of {', '.join(SECTIONS)} (default: all)"
    )
    parser.add_argument("--skip-serve", action="store_true", help="no `llmp serve` start-up (section 5)")
    parser.add_argument("--budget-s", type=float, default=480.0, help="time budget of the whole run (default 480)")
    parser.add_argument("--kv-gib", type=float, default=16.0, help="KV-cache memory of each engine in (4), GiB")
    parser.add_argument(
        "--models-dir",
        type=Path,
        default=None,
        help="where the random models are written and reused (default ~/.cache/llmp/bench/gpu_check; "
        "a temporary directory with --device cpu)",
    )
    parser.add_argument("--verbose", action="store_true", help="llmp's and transformers' own log lines too")
    args = parser.parse_args()
    wanted = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = sorted(set(wanted) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown sections {unknown}; choose from {', '.join(SECTIONS)}")
    args.sections = [s for s in SECTIONS if s in wanted and not (s == "serve" and args.skip_serve)]
    return args


# -- the report ---------------------------------------------------------------------------------


@dataclass
class Row:
    check: str
    goal: str
    measured: str
    verdict: str  # ok / FAIL (correctness), met / missed / n/a (cpu smoke) (goals), "-" (for information)
    value: float | None = None


@dataclass
class Section:
    key: str
    title: str
    rows: list[Row] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    status: str = "not run"  # done, skipped: ..., cut at the budget, error: ...
    seconds: float = 0.0

    def add(self, check: str, goal: str, measured: str, verdict: str, value: float | None = None) -> None:
        self.rows.append(Row(check, goal, measured, verdict, value))

    @property
    def failed(self) -> bool:
        return any(r.verdict == "FAIL" for r in self.rows) or self.status.startswith("error")


def gbps(value: float) -> str:
    return f"{value:,.0f} GB/s" if value >= 10 else f"{value:.3g} GB/s"


def size(nbytes: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes:.0f} B"


def log(message: str) -> None:
    print(message, flush=True)


def table(headers: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(str(c)) for c in column) for column in zip(headers, *rows)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(line, widths)).rstrip() for line in (headers, *rows)]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def print_section(section: Section) -> None:
    log(f"\n== {section.title} [{section.status}, {section.seconds:.1f} s]")
    if section.rows:
        log(
            table(
                ("check", "goal", "measured", "verdict"),
                [(r.check, r.goal, r.measured, r.verdict) for r in section.rows],
            )
        )
    log("")


class BudgetExceeded(BaseException):  # not an Exception: no handler inside llmp or transformers swallows it
    pass


class Budget:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def elapsed(self) -> float:
        return time.perf_counter() - STARTED

    def left(self) -> float:
        return self.seconds - self.elapsed()

    @contextlib.contextmanager
    def alarm(self) -> Iterator[None]:
        """Raise BudgetExceeded in the block when the budget runs out (5 s kept for the report)."""

        def expired(signum, frame):
            raise BudgetExceeded

        previous = signal.signal(signal.SIGALRM, expired)
        signal.setitimer(signal.ITIMER_REAL, max(self.left() - 5.0, 0.01))
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)


@dataclass
class Context:
    args: argparse.Namespace
    device: str
    budget: Budget
    workdir: Path
    models_dir: Path
    copy_gbps: float | None = None
    model_dirs: dict[str, Path] = field(default_factory=dict)

    @property
    def smoke(self) -> bool:
        return self.device == "cpu"

    @property
    def quick(self) -> bool:
        return self.args.quick

    def goal(self, met: bool) -> str:
        return SMOKE if self.smoke else ("met" if met else "missed")

    def sync(self) -> None:
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()

    def free(self) -> None:
        import torch

        gc.collect()
        if self.device == "cuda":
            torch.cuda.empty_cache()


# -- (1) kernels --------------------------------------------------------------------------------

TOL = {"float32": 1e-4, "float16": 4e-3, "bfloat16": 3e-2}
LORA_TOL = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 2e-2}
HALF_FIELDS = {  # byte offsets of a GGML block's float16 fields (d, m, dmin)
    "Q4_0": (0,),
    "Q4_1": (0, 2),
    "Q5_0": (0,),
    "Q5_1": (0, 2),
    "Q8_0": (0,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
}
UNIT_ROUNDOFF = {"float32": 2.0**-24, "bfloat16": 2.0**-8, "float16": 2.0**-11}


class Kernels:
    """The two kernel sets and the helpers the checks share."""

    def __init__(self, device: str) -> None:
        from llmp_kernels_torch.kernels import TorchKernels
        from llmp_kernels_triton.kernels import TritonKernels

        self.device, self.ref, self.tri = device, TorchKernels(), TritonKernels()

    def rand(self, *shape: int, dtype) -> Any:
        import torch

        return torch.randn(*shape, device=self.device).to(dtype)

    def mixed_batch(self, requests, heads, kv_heads, head_dim, block_size, dtype, window=None):
        """q, NaN-initialised caches holding every request's (cached + new) tokens, and the metadata."""
        import torch

        from llmp.api import AttentionMetadata

        dev = self.device
        blocks_needed = [-(-(c + n) // block_size) for c, n in requests]
        num_blocks = sum(blocks_needed) + 2
        k_cache = torch.full((num_blocks, block_size, kv_heads, head_dim), float("nan"), dtype=dtype, device=dev)
        v_cache = k_cache.clone()
        order = torch.randperm(num_blocks, device=dev)  # scattered physical blocks; order[-1] is never used
        tables = torch.full((len(requests), max(blocks_needed)), int(order[-1]), dtype=torch.int32, device=dev)
        starts, slots, used = [0], [], 0
        for r, ((cached, new), count) in enumerate(zip(requests, blocks_needed)):
            blocks = order[used : used + count]
            used += count
            tables[r, :count] = blocks
            pos = torch.arange(cached + new, device=dev)
            flat = blocks[pos // block_size] * block_size + pos % block_size
            k_new = self.rand(len(pos), kv_heads, head_dim, dtype=dtype)
            self.ref.write_kv(k_new, self.rand(len(pos), kv_heads, head_dim, dtype=dtype), k_cache, v_cache, flat)
            slots.append(flat[cached:])
            starts.append(starts[-1] + new)
        seq_lens = [c + n for c, n in requests]
        meta = AttentionMetadata(
            query_start_loc=torch.tensor(starts, dtype=torch.int32, device=dev),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
            block_tables=tables,
            slot_mapping=torch.cat(slots),
            max_query_len=max(n for _, n in requests),
            max_seq_len=max(seq_lens),
            sliding_window=window,
        )
        return self.rand(starts[-1], heads, head_dim, dtype=dtype), k_cache, v_cache, meta


def max_err(got, want) -> float:
    return (got.float() - want.float()).abs().max().item() if got.numel() else 0.0


def within(got, want, tol: float) -> tuple[float, float, bool]:
    """(max abs error, the error allowed: tol x (1 + max |want|), whether got passes)."""
    err = max_err(got, want)
    allowed = tol * (1 + (want.float().abs().max().item() if want.numel() else 0.0))
    ok = got.shape == want.shape and not got.isnan().any().item() and err <= allowed
    return err, allowed, ok


def kernel_rows(ctx: Context, section: Section, name: str, dtype: str, cases: list[tuple[str, float, float, bool]]):
    """One row for a kernel in one dtype: its worst case (errors relative to what each case allows)."""
    for label, err, allowed, ok in cases:
        section.figures[f"{name} {label} {dtype}"] = {"max_abs_err": err, "allowed": allowed, "ok": ok}
    worst = max(cases, key=lambda c: (not c[3], c[1] / c[2] if c[2] else (math.inf if c[1] else 0.0)))
    ok = all(c[3] for c in cases)
    tol = TOL[dtype]
    measured = f"max err {worst[1]:.2e}" + (f" (worst: {worst[0]}; {len(cases)} cases)" if len(cases) > 1 else "")
    section.add(f"{name} {dtype}", f"err <= {tol:g} x (1+max|ref|)", measured, "ok" if ok else "FAIL", worst[1])


def check_kernels(ctx: Context, section: Section) -> None:
    import torch

    from llmp.modeling.rope import cos_sin_table

    ks = Kernels(ctx.device)
    ref, tri = ks.ref, ks.tri
    torch.manual_seed(0)
    if ctx.smoke:  # the interpreter runs every program in Python: tiny shapes
        heads, kv_heads, head_dim, hidden, inter, block_size, tokens = 4, 2, 32, 64, 96, 4, 12
        requests = [(0, 9), (6, 5), (13, 1), (2, 1), (30, 1)]
        dtypes, window = ["float32", "bfloat16"], 5
    else:  # Llama-3-8B's attention shapes, Qwen2.5-0.5B-sized elementwise ops
        heads, kv_heads, head_dim, hidden, inter, block_size, tokens = 32, 8, 128, 1024, 3072, 16, 512
        rng = random.Random(0)
        requests = (
            [(0, rng.randint(100, 900)) for _ in range(3)]
            + [(rng.randint(50, 900), rng.randint(20, 400)) for _ in range(3)]
            + [(rng.randint(1, 2000), 1) for _ in range(58)]
        )
        dtypes, window = (["bfloat16"] if ctx.quick else ["bfloat16", "float16", "float32"]), 256
    section.figures["shapes"] = dict(heads=heads, kv_heads=kv_heads, head_dim=head_dim, block_size=block_size)
    for tag in dtypes:
        log(f"  {tag}")
        dtype, tol = getattr(torch, tag), TOL[tag]
        x, res, w = (
            ks.rand(tokens, hidden, dtype=dtype),
            ks.rand(tokens, hidden, dtype=dtype),
            ks.rand(hidden, dtype=dtype),
        )
        out, summed = tri.rms_norm(x, w, 1e-6, residual=res)
        ref_out, ref_summed = ref.rms_norm(x, w, 1e-6, residual=res)
        heads_x, head_w = ks.rand(tokens * heads, head_dim, dtype=dtype), ks.rand(head_dim, dtype=dtype)
        cases = [
            ("+residual", *within(out, ref_out, tol)),
            ("residual sum", *within(summed, ref_summed, 0.0)),
            ("per head", *within(tri.rms_norm(heads_x, head_w, 1e-6), ref.rms_norm(heads_x, head_w, 1e-6), tol)),
        ]
        kernel_rows(ctx, section, "rms_norm", tag, cases)

        qkv = ks.rand(tokens, (heads + 2 * kv_heads) * head_dim, dtype=dtype)
        q = qkv[:, : heads * head_dim].view(tokens, heads, head_dim)
        k = qkv[:, heads * head_dim : (heads + kv_heads) * head_dim].view(tokens, kv_heads, head_dim)
        positions = torch.randint(0, 4096, (tokens,), device=ctx.device)
        cases = []
        for rot in (head_dim, head_dim // 2):
            table_ = cos_sin_table(rot, 4096, 1000000.0).to(ctx.device)
            (q_out, k_out), (q_ref, k_ref) = tri.rotary(positions, q, k, table_), ref.rotary(positions, q, k, table_)
            cases += [(f"q R={rot}", *within(q_out, q_ref, tol)), (f"k R={rot}", *within(k_out, k_ref, tol))]
        kernel_rows(ctx, section, "rotary", tag, cases)

        gate_up = ks.rand(tokens, 2 * inter, dtype=dtype) * 3
        kernel_rows(
            ctx,
            section,
            "silu_and_mul",
            tag,
            [("", *within(tri.silu_and_mul(gate_up), ref.silu_and_mul(gate_up), tol))],
        )
        gelu = within(tri.gelu_tanh_and_mul(gate_up), ref.gelu_tanh_and_mul(gate_up), tol)
        kernel_rows(ctx, section, "gelu_tanh_and_mul", tag, [("", *gelu)])

        shape = (tokens // block_size + 4, block_size, kv_heads, head_dim)
        caches = [torch.full(shape, float("nan"), dtype=dtype, device=ctx.device) for _ in range(4)]
        slots = torch.randperm(caches[0].shape[0] * block_size, device=ctx.device)[:tokens]
        slots[::3] = -1
        kk, vv = ks.rand(tokens, kv_heads, head_dim, dtype=dtype), ks.rand(tokens, kv_heads, head_dim, dtype=dtype)
        tri.write_kv(kk, vv, caches[0], caches[1], slots)
        ref.write_kv(kk, vv, caches[2], caches[3], slots)
        same = all(
            torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())
            for a, b in zip(caches[:2], caches[2:])
        )
        section.figures[f"write_kv {tag}"] = {"identical": same}
        section.add(
            f"write_kv {tag}",
            "identical (-1 slots untouched)",
            "identical" if same else "DIFFERENT",
            "ok" if same else "FAIL",
        )

        cases = []
        for win, softcap in ((None, None), (window, None), (None, 30.0)):
            q_att, k_cache, v_cache, meta = ks.mixed_batch(requests, heads, kv_heads, head_dim, block_size, dtype, win)
            scale = 1 / math.sqrt(head_dim)
            got = tri.paged_attention(q_att, k_cache, v_cache, meta, scale, softcap=softcap)
            want = ref.paged_attention(q_att.float(), k_cache.float(), v_cache.float(), meta, scale, softcap=softcap)
            cases.append((f"window {win} softcap {softcap}", *within(got, want, tol)))
            del q_att, k_cache, v_cache
        kernel_rows(ctx, section, "paged_attention", tag, cases)
    check_quant_matmul(ctx, section, tri)
    check_lora(ctx, section, ks)


def check_quant_matmul(ctx: Context, section: Section, tri) -> None:
    """Every GGML format of the set: x @ W.T from random blocks (every bit pattern) against the reference."""
    log("  quantised matmuls")
    import torch
    from llmp_kernels_triton import quant_matmul

    from llmp.quantization import GGML_FORMATS, QuantizedWeight, matmul_reference

    rows_out = 40 if ctx.smoke else 200  # not a multiple of the column tiles (16, 64): edge tiles run
    if ctx.smoke or ctx.quick:
        launches = [("float32", 1), ("bfloat16", 17)]  # the decode tile and the prefill tile
    else:
        launches = [("float32", 1), ("float32", 17), ("bfloat16", 3)]
    for name in quant_matmul.FORMATS:
        fmt = GGML_FORMATS[name]
        k = (2 if ctx.smoke else 4) * 256  # two (four) super-blocks, or 16 (32) blocks of 32
        n_blocks = k // fmt.block_size
        gen = torch.Generator().manual_seed(0)
        raw = torch.randint(0, 256, (rows_out, n_blocks, fmt.type_size), generator=gen, dtype=torch.uint8)
        for offset in HALF_FIELDS[name]:
            halves = ((torch.rand(rows_out, n_blocks, generator=gen) * 2 - 1) * 2.0**-6).to(torch.float16)
            raw[:, :, offset : offset + 2] = halves.view(torch.uint8).reshape(rows_out, n_blocks, 2)
        weight = QuantizedWeight(raw.reshape(rows_out, -1).to(ctx.device), fmt, k)
        packed = tri.pack_quantized(weight)
        if packed is None:
            section.add(f"quant_matmul {name}", "computed by the set", "not packed", "FAIL")
            continue
        dequantised = weight.dequantize().abs()
        worst, ok = 0.0, True
        for tag, tokens in launches:
            x = torch.randn(tokens, k, generator=gen).to(ctx.device, getattr(torch, tag))
            out = packed(x)
            expected = matmul_reference(x.float(), weight.blocks, weight.format)
            bound = 2 * k * 2.0**-24 * (x.float().abs() @ dequantised.T)
            if tag != "float32":  # one more rounding (and subnormals)
                bound = bound * 1.5 + UNIT_ROUNDOFF[tag] * expected.abs() + 2.0**-24
            ratio = ((out.float() - expected).abs() / bound).max().item()
            case_ok = out.dtype == x.dtype and out.shape == expected.shape and ratio <= 1.0
            section.figures[f"quant_matmul {name} {tag} T={tokens}"] = {"err_over_bound": ratio, "ok": case_ok}
            worst, ok = max(worst, ratio), ok and case_ok
        cases = ", ".join(f"{t} T={n}" for t, n in launches)
        section.add(
            f"quant_matmul {name}",
            "err <= fp32 accumulation bound",
            f"{worst:.2f} of the bound ({cases})",
            "ok" if ok else "FAIL",
            worst,
        )


def check_lora(ctx: Context, section: Section, ks: Kernels) -> None:
    import torch

    from llmp.modeling.lora import lora_mapping

    log("  LoRA")
    if not (hasattr(ks.tri, "lora_shrink") and hasattr(ks.tri, "lora_expand")):
        section.add("lora_shrink/expand", "if the set has them", "not in the set", "-")
        return
    slots_n = 3
    shapes = [(1, 8, 80, 72), (9, 16, 80, 72), (40, 24, 80, 72)]  # tokens, rank, in, out: masks exercised
    if not ctx.smoke:
        shapes.append((256, 16, 4096, 1024))
    dtypes = ["float32", "bfloat16"] if ctx.smoke or ctx.quick else ["float32", "float16", "bfloat16"]

    def run(kernels, x, y, a, b, mapping):
        s = kernels.lora_shrink(x, a, mapping)
        out = y.clone()
        kernels.lora_expand(out, s, b, mapping)
        return s, out

    for tag in dtypes:
        dtype, tol = getattr(torch, tag), LORA_TOL[tag]
        worst, ok, label = 0.0, True, ""
        for tokens, rank, n_in, n_out in shapes:
            gen = torch.Generator().manual_seed(tokens)
            slots = torch.randint(-1, slots_n, (tokens,), generator=gen).tolist()
            slots[0] = max(slots[0], 0)  # at least one row with an adapter
            x = torch.randn(tokens, n_in, generator=gen)
            y = torch.randn(tokens, n_out, generator=gen)
            a = torch.randn(slots_n, rank, n_in, generator=gen) / n_in**0.5
            b = torch.randn(slots_n, n_out, rank, generator=gen) / rank**0.5
            x, y, a, b = (t.to(ctx.device, dtype) for t in (x, y, a, b))
            mapping = lora_mapping(slots, ctx.device)
            s, out = run(ks.tri, x, y, a, b, mapping)
            s_ref, out_ref = run(ks.ref, x, y, a, b, mapping)
            base = [r for r, slot in enumerate(slots) if slot < 0]
            case_ok = (
                s.shape == s_ref.shape
                and torch.allclose(s.float(), s_ref.float(), atol=tol, rtol=tol)
                and torch.allclose(out.float(), out_ref.float(), atol=tol, rtol=tol)
                and torch.equal(out[base], y[base])  # rows of the base model are left alone
            )
            err = max(max_err(s, s_ref), max_err(out, out_ref))
            section.figures[f"lora T={tokens} r={rank} {n_in}->{n_out} {tag}"] = {"max_abs_err": err, "ok": case_ok}
            if err >= worst:
                worst, label = err, f"T={tokens} r={rank}"
            ok = ok and case_ok
        section.add(
            f"lora_shrink+expand {tag}",
            f"allclose atol=rtol={tol:g}",
            f"max err {worst:.2e} (worst: {label}; {len(shapes)} cases)",
            "ok" if ok else "FAIL",
            worst,
        )


# -- (2) greedy parity --------------------------------------------------------------------------


def check_parity(ctx: Context, section: Section) -> None:
    import torch

    from llmp import LLM, SamplingParams
    from llmp.testing import mixed_prompts, save_tiny_model

    if ctx.smoke:  # the interpreter runs a program per row: few, short prompts
        rng = random.Random(1)
        prefix = [rng.randrange(3, 512) for _ in range(8)]
        prompts = [[rng.randrange(3, 512) for _ in range(n)] for n in (5, 19)]
        prompts += [prefix + [rng.randrange(3, 512) for _ in range(n)] for n in (4, 7)]
        max_tokens, step_tokens = 8, 16
    else:
        prompts = mixed_prompts(4, seed=1) + mixed_prompts(4, shared_prefix=24, seed=2)
        max_tokens, step_tokens = 24, 64
    for arch in ("LlamaForCausalLM", "Qwen2ForCausalLM"):
        log(f"  {arch}")
        path = ctx.workdir / f"parity-{arch}"
        hf = save_tiny_model(path, arch, seed=0).to(ctx.device)
        llm = LLM(
            str(path),
            device=ctx.device,
            kernels="triton",
            dtype="float32",
            block_size=4,
            max_num_batched_tokens=step_tokens,  # longer prompts are prefilled in chunks; shared prefixes hit the cache
        )
        try:
            params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
            outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
            kernels = llm.engine.info.kernels
        finally:
            llm.shutdown()
            del llm
        got = [list(o.outputs[0].token_ids) for o in outputs]
        mismatches = []
        for i, (prompt, tokens) in enumerate(zip(prompts, got)):
            with torch.no_grad():
                ids = torch.tensor([prompt], device=ctx.device)
                want = hf.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=max_tokens,
                    min_new_tokens=max_tokens,
                    do_sample=False,
                    eos_token_id=None,
                    pad_token_id=0,
                )[0, len(prompt) :].tolist()
            if tokens != want:
                first = next((j for j, (a, b) in enumerate(zip(tokens, want)) if a != b), min(len(tokens), len(want)))
                mismatches.append({"prompt": i, "first_different_token": first, "llmp": tokens, "transformers": want})
        del hf
        ctx.free()
        equal = len(prompts) - len(mismatches)
        section.figures[arch] = {"kernels": kernels, "prompts": len(prompts), "equal": equal, "mismatches": mismatches}
        measured = f"{equal}/{len(prompts)} prompts x {max_tokens} tokens equal"
        if mismatches:
            measured += f" (prompt {mismatches[0]['prompt']} differs at token {mismatches[0]['first_different_token']})"
        section.add(
            f"{arch} fp32, kernels {kernels}", "token for token", measured, "ok" if not mismatches else "FAIL", equal
        )


# -- (3) bandwidth ------------------------------------------------------------------------------


def bench_ms(ctx: Context, fn: Callable[[], Any]) -> float:
    """Median milliseconds of fn: triton's do_bench on a GPU (caches flushed), a few timed calls on the CPU."""
    if ctx.device == "cuda":
        import triton.testing

        return triton.testing.do_bench(fn, warmup=25, rep=100 if ctx.quick else 200, return_mode="median")
    fn()
    times = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def copy_bandwidth(ctx: Context) -> float:
    """GB/s of a device-to-device copy: clone of 1 GiB (64 MiB on the CPU), bytes read + written / time."""
    import torch

    big = torch.empty((1 << 29) if not ctx.smoke else (1 << 25), dtype=torch.bfloat16, device=ctx.device)
    big.fill_(1.0)
    gbps = 2 * big.numel() * 2 / bench_ms(ctx, big.clone) / 1e6
    del big
    ctx.free()
    ctx.copy_gbps = gbps
    return gbps


def check_bandwidth(ctx: Context, section: Section) -> None:

    ks = Kernels(ctx.device)
    copy_gbps = copy_bandwidth(ctx)
    section.figures["copy_GBps"] = copy_gbps
    section.add("clone, device to device", "-", f"{gbps(copy_gbps)} (read + written)", "-", copy_gbps)
    if ctx.smoke:
        heads, kv_heads, head_dim, block_size, configs = 4, 2, 32, 4, [(2, 100), (4, 200)]
        from llmp_kernels_triton import attention

        attention.SEGMENT = 64  # several segments on the smoke run's short contexts
    else:
        heads, kv_heads, head_dim, block_size = 32, 8, 128, 16
        configs = [(32, 1024), (128, 1024), (256, 2048), (8, 8192)]
    section.figures["shape"] = dict(heads=heads, kv_heads=kv_heads, head_dim=head_dim, block_size=block_size)
    for batch, context in configs:
        decode_attention(ctx, section, ks, batch, context, (heads, kv_heads, head_dim, block_size), copy_gbps)
    ctx.free()


def decode_attention(ctx: Context, section: Section, ks: Kernels, batch: int, context: int, shape, copy_gbps) -> None:
    """One decode step's paged attention over ``batch`` sequences of ``context`` tokens: the triton set as the
    engine runs it (long decodes split by key segment when the grid is small), unsplit and always split, each
    checked against the float32 torch result and for the same bits as unsplit; the torch set timed beside."""
    import torch
    from llmp_kernels_triton import attention

    heads, kv_heads, head_dim, block_size = shape
    q, k_cache, v_cache, meta = ks.mixed_batch(
        [(context - 1, 1)] * batch, heads, kv_heads, head_dim, block_size, torch.bfloat16
    )
    kv_bytes = batch * context * kv_heads * head_dim * 2 * 2  # K and V, bf16
    scale = head_dim**-0.5
    want = ks.ref.paged_attention(q.float(), k_cache.float(), v_cache.float(), meta, scale)
    times, outs = {}, {}
    for mode, split in (("triton", None), ("unsplit", False), ("split", True)):
        attention.SPLIT_DECODES = split
        try:
            outs[mode] = ks.tri.paged_attention(q, k_cache, v_cache, meta, scale)
            times[mode] = bench_ms(ctx, lambda: ks.tri.paged_attention(q, k_cache, v_cache, meta, scale))
        finally:
            attention.SPLIT_DECODES = None
    times["torch"] = bench_ms(ctx, lambda: ks.ref.paged_attention(q, k_cache, v_cache, meta, scale))
    rates = {mode: kv_bytes / ms / 1e6 for mode, ms in times.items()}
    share = rates["triton"] / copy_gbps
    err, allowed, ok = within(outs["triton"], want, TOL["bfloat16"])
    same = all(torch.equal(out, outs["unsplit"]) for out in outs.values())
    section.figures[f"decode_b{batch}_ctx{context}"] = {
        "kv_bytes": kv_bytes,
        "segments": -(-context // attention.SEGMENT),
        **{f"{mode}_ms": ms for mode, ms in times.items()},
        **{f"{mode}_GBps": rate for mode, rate in rates.items()},
        "triton_of_copy": share,
        "max_abs_err": err,
        "allowed": allowed,
        "split_same_bits": same,
    }
    section.add(
        f"decode attention {batch} x {context}",
        f">= {GOAL_ATTENTION:.0%} of copy",
        f"{share:.1%} ({gbps(rates['triton'])}; unsplit {rates['unsplit'] / copy_gbps:.0%}, "
        f"split {rates['split'] / copy_gbps:.0%}; torch set {gbps(rates['torch'])})",
        ctx.goal(share >= GOAL_ATTENTION),
        share,
    )
    section.add(
        f"  split and unsplit, {batch} x {context}",
        "same bits, err <= 0.03 x (1+max|ref|)",
        f"{'same bits' if same else 'DIFFERENT BITS'}, max err {err:.2e}",
        "ok" if same and ok else "FAIL",
        err,
    )


# -- (4) offline throughput ---------------------------------------------------------------------


def label(ctx: Context, name: str) -> str:
    return f"{name} (tiny)" if ctx.smoke else name


def shape_settings(ctx: Context, name: str) -> dict[str, Any]:
    settings = dict(SHAPES[name])
    if ctx.smoke:
        settings.update(TINY, max_position_embeddings=512)
    return settings


def build_model(ctx: Context, name: str) -> Path:
    """A random bf16 model of the shape in Hugging Face format (config, safetensors, a tiny tokenizer)."""
    import torch
    import transformers

    from llmp.testing import tiny_tokenizer

    if name in ctx.model_dirs:
        return ctx.model_dirs[name]
    settings = shape_settings(ctx, name)
    path = ctx.models_dir / (name + ("-tiny" if ctx.smoke else ""))
    marker = path / "gpu_check_shape.json"
    if marker.is_file() and json.loads(marker.read_text()) == settings:
        ctx.model_dirs[name] = path
        return path
    shutil.rmtree(path, ignore_errors=True)
    started = time.perf_counter()
    config_settings = dict(settings)
    architecture = config_settings.pop("architectures")
    config_cls = getattr(transformers, architecture).config_class
    config = config_cls(**config_settings, architectures=[architecture])
    torch.manual_seed(0)
    with torch.device(ctx.device):  # initialised where it runs: seconds for 8B on a GPU
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)  # ids past its vocabulary decode to nothing: fine for speed
    marker.write_text(json.dumps(settings))
    del model
    ctx.free()
    log(f"  built {name} in {path} ({time.perf_counter() - started:.1f} s)")
    ctx.model_dirs[name] = path
    return path


def weight_bytes_per_token(path: Path) -> tuple[int, int]:
    """(bytes a decode step reads, checkpoint bytes): every weight but the input embedding table, of which
    a step reads one row per token; a tied head reads that table in full, so it counts then."""
    from safetensors import safe_open

    tied = json.loads((path / "config.json").read_text()).get("tie_word_embeddings", False)
    total = embedding = 0
    for file in path.glob("*.safetensors"):
        with safe_open(file, "pt") as f:
            for name in f.keys():
                piece = f.get_slice(name)
                size = math.prod(piece.get_shape()) * {"BF16": 2, "F16": 2, "F32": 4}[piece.get_dtype()]
                total += size
                if name.endswith("embed_tokens.weight"):
                    embedding = size
    return (total if tied else total - embedding), total


def workload(ctx: Context, rng: random.Random, vocab: int) -> dict[str, Any]:
    """The engine benchmark's mixed workload (quick: a quarter; smoke: a few tiny requests)."""
    if ctx.smoke:
        count, prompt_range, output_range = 4, (8, 16), (2, 6)
    elif ctx.quick:
        count, prompt_range, output_range = 16, (64, 128), (16, 64)
    else:
        count, prompt_range, output_range = 64, (64, 512), (64, 256)
    low, high = (3, vocab) if ctx.smoke else (1000, 100000)
    lengths = [rng.randint(*prompt_range) for _ in range(count)]

    def ids(n: int) -> list[int]:
        return [rng.randrange(low, high) for _ in range(n)]

    return {
        "prompts": [ids(n) for n in lengths],
        "new_tokens": [rng.randint(*output_range) for _ in range(count)],
        # other ids (no prefix-cache hit later), the same lengths; the interpreter compiles nothing: two
        "warmup": [ids(n) for n in lengths[: 2 if ctx.smoke else None]],
        "ids": ids,
        "prompt_range": prompt_range,
        "output_range": output_range,
    }


def llmp_offline(ctx: Context, path: Path, work: dict[str, Any], figures: dict[str, Any]) -> None:
    from llmp import LLM, SamplingParams

    if ctx.smoke:
        options = dict(max_model_len=256, max_num_seqs=16, max_num_batched_tokens=128, kv_cache_memory_bytes=64 << 20)
        prompt_len, n_decode, rounds = 8, 4, 1
    else:
        options = dict(
            max_model_len=2048,
            max_num_seqs=256,
            max_num_batched_tokens=8192,
            kv_cache_memory_bytes=int(ctx.args.kv_gib * (1 << 30)),
        )
        prompt_len, n_decode, rounds = 128, (64 if ctx.quick else 256), (1 if ctx.quick else 2)
    started = time.perf_counter()
    llm = LLM(str(path), device=ctx.device, kernels="triton", dtype="bfloat16", **options)
    figures["llmp_load_s"] = time.perf_counter() - started
    figures["llmp_kernels"] = llm.engine.info.kernels
    try:

        def generate(prompts: list[list[int]], new_tokens: list[int]) -> float:
            params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in new_tokens]
            ctx.sync()
            start = time.perf_counter()
            outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
            ctx.sync()
            elapsed = time.perf_counter() - start
            assert [len(o.outputs[0].token_ids) for o in outputs] == new_tokens, "llmp generated other counts"
            return elapsed

        # warm-up: the workload's prompt lengths (prefills, chunks beside decodes) with other ids, 2 tokens each
        started = time.perf_counter()
        generate(work["warmup"], [2] * len(work["warmup"]))
        figures["llmp_warmup_s"] = time.perf_counter() - started
        seconds = generate(work["prompts"], work["new_tokens"])
        figures["llmp_offline_s"] = seconds
        figures["llmp_offline_tok_s"] = sum(work["new_tokens"]) / seconds
        # batch 1: decode tok/s = (N - N/8) / (best time for N tokens - best time for N/8), fresh prompts
        # each time (no prefix-cache hit). Both runs hold the prompt's prefill and the request's fixed costs,
        # which a 1-token run does not measure alike (on the H200, 2026-12-04, (N - 1) / (t(N) - t(1))
        # read above the roofline); the times of 1, N/8 and N tokens are all kept.
        short = max(2, n_decode // 8)
        times: dict[int, list[float]] = {1: [], short: [], n_decode: []}
        for _ in range(rounds):
            for n in times:
                times[n].append(generate([work["ids"](prompt_len)], [n]))
        best = {n: min(t) for n, t in times.items()}
        figures["llmp_decode_b1_tok_s"] = (n_decode - short) / max(best[n_decode] - best[short], 1e-9)
        figures["llmp_decode_b1_times_s"] = {str(n): t for n, t in times.items()}
        figures["decode_b1_tokens"] = n_decode
    finally:
        llm.shutdown()


def hf_offline(ctx: Context, path: Path, work: dict[str, Any], figures: dict[str, Any]) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    started = time.perf_counter()
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, device_map=ctx.device)
    except (ImportError, ValueError):  # device_map wants accelerate in some versions
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).to(ctx.device)
    model.eval()
    figures["hf_load_s"] = time.perf_counter() - started
    batch_size = 4 if ctx.smoke else 16

    def generate(prompts: list[list[int]], new_tokens: list[int]) -> float:
        """Static batches: left-padded, each batch runs to its longest requested output."""
        ctx.sync()
        start = time.perf_counter()
        for i in range(0, len(prompts), batch_size):
            batch, wanted = prompts[i : i + batch_size], new_tokens[i : i + batch_size]
            width = max(map(len, batch))
            ids = torch.tensor([[0] * (width - len(p)) + p for p in batch], device=ctx.device)
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=ctx.device)
            with torch.inference_mode():
                model.generate(
                    input_ids=ids,
                    attention_mask=mask,
                    max_new_tokens=max(wanted),
                    min_new_tokens=max(wanted),
                    do_sample=False,
                    eos_token_id=None,
                    pad_token_id=0,
                )
        ctx.sync()
        return time.perf_counter() - start

    generate(work["warmup"][:2], [4, 4])
    seconds = generate(work["prompts"], work["new_tokens"])
    figures["hf_offline_s"] = seconds
    figures["hf_offline_tok_s"] = sum(work["new_tokens"]) / seconds  # requested tokens only
    figures["hf_batch_size"] = batch_size


def check_offline(ctx: Context, section: Section) -> None:
    copy_gbps = ctx.copy_gbps or copy_bandwidth(ctx)
    section.figures["copy_GBps"] = copy_gbps
    for name in SHAPES:
        needed = SHAPE_ESTIMATES[ctx.device][name]
        if ctx.budget.left() < needed:
            section.figures[name] = {"skipped": f"would pass the budget ({ctx.budget.left():.0f} s left)"}
            section.add(label(ctx, name), "-", f"skipped: would pass the budget ({ctx.budget.left():.0f} s left)", "-")
            continue
        figures: dict[str, Any] = {}
        section.figures[name] = figures
        path = build_model(ctx, name)
        read_bytes, checkpoint = weight_bytes_per_token(path)
        figures.update(path=str(path), weight_bytes_per_token=read_bytes, checkpoint_bytes=checkpoint)
        work = workload(ctx, random.Random(0), shape_settings(ctx, name)["vocab_size"])
        figures.update(
            requests=len(work["prompts"]),
            prompt_tokens=sum(map(len, work["prompts"])),
            output_tokens=sum(work["new_tokens"]),
            prompt_range=work["prompt_range"],
            output_range=work["output_range"],
        )
        log(f"  {label(ctx, name)}: llmp, {len(work['prompts'])} requests, then batch 1")
        llmp_offline(ctx, path, work, figures)
        ctx.free()  # the engine's weights and KV cache, before transformers loads the model
        log(f"  {label(ctx, name)}: transformers, the same requests")
        hf_offline(ctx, path, work, figures)
        ctx.free()
        ratio = figures["llmp_offline_tok_s"] / figures["hf_offline_tok_s"]
        figures["offline_ratio"] = ratio
        section.add(
            f"{label(ctx, name)} offline vs transformers",
            f">= {GOAL_OFFLINE:g}x",
            f"{ratio:.2f}x ({figures['llmp_offline_tok_s']:,.0f} vs {figures['hf_offline_tok_s']:,.0f} output tok/s)",
            ctx.goal(ratio >= GOAL_OFFLINE),
            ratio,
        )
        roofline = copy_gbps * 1e9 / read_bytes
        share = figures["llmp_decode_b1_tok_s"] / roofline
        figures.update(roofline_b1_tok_s=roofline, decode_b1_of_roofline=share)
        is_8b = name == "llama-3-8b"
        section.add(
            f"{label(ctx, name)} batch-1 decode",
            f">= {GOAL_ROOFLINE:.0%} of roofline" if is_8b else "-",
            f"{share:.1%} ({figures['llmp_decode_b1_tok_s']:,.1f} of {roofline:,.1f} tok/s; {size(read_bytes)}/token)",
            ctx.goal(share >= GOAL_ROOFLINE) if is_8b else "-",
            share,
        )


# -- (5) serve ----------------------------------------------------------------------------------


def check_serve(ctx: Context, section: Section) -> None:
    from llmp.testing import child_environment, free_port

    path = build_model(ctx, "llama-3-8b")
    port = free_port()
    exe = Path(sys.executable).with_name("llmp")
    command = [str(exe)] if exe.exists() else [sys.executable, "-m", "llmp"]
    command += ["serve", str(path), "--device", ctx.device, "--kernels", "triton", "--dtype", "bfloat16"]
    command += ["--host", "127.0.0.1", "--port", str(port)]
    if ctx.smoke:
        command += ["--kv-cache-memory-gib", "1"]
    section.figures["command"] = " ".join(command)
    log(f"  {' '.join(command[command.index('serve') - 1 :])}")
    log_path = ctx.workdir / "serve.log"
    url = f"http://127.0.0.1:{port}"
    timeout = 180.0  # and the budget's alarm
    with open(log_path, "wb") as log_file:
        started = time.perf_counter()
        process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, env=child_environment())
    try:
        ready = None
        while time.perf_counter() - started < timeout:
            if process.poll() is not None:
                break
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                    if response.status == 200:
                        ready = time.perf_counter() - started
                        break
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.05)
        if ready is None:
            tail = log_path.read_text(errors="replace")[-3000:]
            why = f"exited with {process.returncode}" if process.poll() is not None else f"not ready in {timeout:.0f} s"
            raise RuntimeError(f"llmp serve {why}:\n{tail}")
        section.figures["ready_s"] = ready
        section.add(
            f"{label(ctx, 'llama-3-8b')}: start to /health 200",
            f"<= {GOAL_SERVE_S:g} s",
            f"{ready:.1f} s",
            ctx.goal(ready <= GOAL_SERVE_S),
            ready,
        )
        # and it answers: one completion through the OpenAI front-end
        with urllib.request.urlopen(f"{url}/v1/models", timeout=30) as response:
            model_id = json.load(response)["data"][0]["id"]
        body = json.dumps({"model": model_id, "prompt": "Hello", "max_tokens": 4, "temperature": 0}).encode()
        request = urllib.request.Request(
            f"{url}/v1/completions", data=body, headers={"Content-Type": "application/json"}
        )
        start = time.perf_counter()
        with urllib.request.urlopen(request, timeout=120) as response:
            answer = json.load(response)
        first = time.perf_counter() - start
        tokens = answer["usage"]["completion_tokens"]
        section.figures["first_completion_s"] = first
        ok = tokens == 4
        section.add(
            "first completion (4 tokens)", "answers", f"{tokens} tokens in {first:.2f} s", "ok" if ok else "FAIL"
        )
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        section.figures["log_tail"] = log_path.read_text(errors="replace")[-2000:]


# -- main -----------------------------------------------------------------------------------------


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def environment(ctx: Context) -> dict[str, Any]:
    import torch
    import transformers
    import triton

    import llmp

    info: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "device": ctx.device,
        "mode": "cpu smoke" if ctx.smoke else ("quick" if ctx.quick else "full"),
        "gpu": torch.cuda.get_device_name() if ctx.device == "cuda" else None,
        "gpu_memory_gib": (
            round(torch.cuda.get_device_properties(0).total_memory / (1 << 30), 1) if ctx.device == "cuda" else None
        ),
        "cpu": cpu_model(),
        "cpu_cores": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton.__version__,
        "transformers": transformers.__version__,
        "llmp": str(Path(llmp.__file__).parent),
        "triton_interpret": os.environ.get("TRITON_INTERPRET", ""),
        "budget_s": ctx.budget.seconds,
    }
    return info


def main() -> int:
    args = parse_args()
    device = args.device
    if device is None:
        import torch  # does not import triton

        if not torch.cuda.is_available():
            sys.exit("gpu_check.py: torch sees no CUDA device; `--device cpu` runs the smoke check on tiny shapes")
        device = "cuda"
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (transformers imports it too)
    elif os.environ.get("TRITON_INTERPRET"):
        sys.exit("gpu_check.py: unset TRITON_INTERPRET for --device cuda (it would time Triton's interpreter)")
    import logging

    import llmp  # noqa: F401  (before torch: llmp sets the OpenMP threads' spinning)

    if not args.verbose:
        logging.getLogger("llmp").setLevel(logging.WARNING)
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_check.py: --device cuda, but torch sees no CUDA device")
    if args.json is None:
        args.json = Path(os.environ["OUT"]) / "gpu_check.json" if os.environ.get("OUT") else Path("gpu_check.json")
    scratch = tempfile.TemporaryDirectory(prefix="gpu-check-")
    workdir = Path(scratch.name)
    if args.models_dir is not None:
        models_dir = args.models_dir
    elif device == "cpu":
        models_dir = workdir / "models"
    else:
        models_dir = Path.home() / ".cache" / "llmp" / "bench" / "gpu_check"
    ctx = Context(args=args, device=device, budget=Budget(args.budget_s), workdir=workdir, models_dir=models_dir)
    report: dict[str, Any] = {"environment": environment(ctx), "sections": {}}
    env = report["environment"]
    log(
        f"gpu_check on {env['gpu'] or 'cpu (no GPU: smoke run, Triton interpreter)'}; {env['mode']}; "
        f"torch {env['torch']}, triton {env['triton']}, transformers {env['transformers']}; llmp from {env['llmp']}"
    )
    titles = {
        "kernels": f"(1) kernels: triton against the torch set on {device}"
        + (" (TRITON_INTERPRET=1)" if device == "cpu" else ""),
        "parity": f"(2) greedy parity against transformers on {device}",
        "bandwidth": "(3) decode attention bandwidth, share of the copy bandwidth",
        "offline": "(4) offline throughput against transformers; batch-1 decode against the roofline",
        "serve": "(5) llmp serve: start to ready",
    }
    checks = {
        "kernels": check_kernels,
        "parity": check_parity,
        "bandwidth": check_bandwidth,
        "offline": check_offline,
        "serve": check_serve,
    }
    sections: list[Section] = []
    cut = False
    try:
        for key in SECTIONS:
            section = Section(key, titles[key])
            sections.append(section)
            if key not in args.sections:
                section.status = "skipped: not asked for"
                continue
            if cut:
                section.status = "skipped: the budget was spent"
                print_section(section)
                continue
            needed = ESTIMATES[device][key]
            if ctx.budget.left() < needed:
                section.status = (
                    f"skipped: would pass the {args.budget_s:g} s budget "
                    f"({ctx.budget.left():.0f} s left, needs about {needed} s)"
                )
                print_section(section)
                continue
            log(f"\n{section.title} ...")
            started = time.perf_counter()
            try:
                with ctx.budget.alarm():
                    checks[key](ctx, section)
                section.status = "done"
            except BudgetExceeded:
                section.status = f"cut at the {args.budget_s:g} s budget"
                cut = True
            except Exception as error:  # noqa: BLE001  (reported, and the run goes on)
                traceback.print_exc()
                section.status = f"error: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
                section.figures["traceback"] = traceback.format_exc()
            section.seconds = time.perf_counter() - started
            print_section(section)
    finally:
        total = time.perf_counter() - STARTED
        correct = not any(s.failed for s in sections)
        for section in sections:
            report["sections"][section.key] = {
                "title": section.title,
                "status": section.status,
                "seconds": round(section.seconds, 2),
                "rows": [vars(r) for r in section.rows],
                "figures": section.figures,
            }
        report["goals"] = [
            {"section": s.key, "check": r.check, "goal": r.goal, "value": r.value, "verdict": r.verdict}
            for s in sections
            for r in s.rows
            if r.verdict in ("met", "missed", SMOKE)
        ]
        report.update(correct=correct, seconds=round(total, 1))
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1, default=str) + "\n")
        summary = []
        for section in sections:
            verdicts = [r.verdict for r in section.rows if r.verdict != "-"]
            tally = ", ".join(f"{verdicts.count(v)} {v}" for v in dict.fromkeys(verdicts)) or "-"
            summary.append(
                (
                    section.title.split(":")[0].split(" ", 1)[0] + " " + section.key,
                    section.status,
                    f"{section.seconds:.1f}",
                    tally,
                )
            )
        log(table(("section", "status", "seconds", "verdicts"), summary))
        note = "" if device == "cuda" else "; no GPU: goals n/a (cpu smoke)"
        unchecked = [
            s.key
            for s in sections
            if s.key in ("kernels", "parity") and s.status not in ("done", "skipped: not asked for")
        ]
        failed = [s.key for s in sections if s.failed]
        verdict = f"FAILED: {', '.join(failed)}" if failed else "all correctness checks that ran passed"
        if unchecked:
            verdict += f" (not run to the end: {', '.join(unchecked)})"
        log(f"{verdict}; {total:.0f} s in all{note}")
        log(f"figures in {args.json.resolve()}")
        with contextlib.suppress(OSError):
            scratch.cleanup()
    return 0 if correct else 1


if __name__ == "__main__":
    sys.exit(main())
