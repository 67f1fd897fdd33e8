"""Can ATen's weight-only int4/int8 CPU kernels run GGUF's quantised weights fast? (issue 24, a measured probe)

    .venv/bin/python benchmarks/quant_matmul_probe.py                      # everything (minutes on 2 cores)
    .venv/bin/python benchmarks/quant_matmul_probe.py --check-only         # parts (0) and (1), seconds
    .venv/bin/python benchmarks/quant_matmul_probe.py --models smollm2-135m --m 1,32 --threads 2 --json out.json

The kernels (torch 2.13, CPU; read from their schemas, pytorch's int4mm_kernel.cpp and by running them):

* ``aten._convert_weight_to_int4pack_for_cpu(q int32 [N, K] in 0..15, innerKTiles) -> uint8 [N, K/2]``
  (innerKTiles is ignored on CPU; N % 16 == 0, K even; the packed layout depends on the CPU capability, AVX2
  and AVX-512 tile N differently, so packed bytes are not portable between machines).
* ``aten._weight_int4pack_mm_for_cpu(x [M, K], packed, group, sz [K/group, N, 2]) -> [M, N]``, x 2-D and
  contiguous, group in {32, 64, 128, 256} dividing K, ``sz[..., 0]`` the scale and ``sz[..., 1]`` the zero, both in
  x's dtype (float32, bfloat16 or float16: no mixing): ``w = (q - 8) * scale + zero`` in float32, accumulated
  in float32, the output rounded to x's dtype. Only the bfloat16 kernel is vectorised on x86 (AVX2/AVX-512);
  float32 and float16 run a scalar loop.
* ``aten._weight_int8pack_mm(x [M, K], w int8 [N, K], scales [N]) -> [M, N]``: ``w * scales[n]`` per output
  channel, scales in x's dtype; vectorised for bfloat16 only, as above.
* ``aten._dyn_quant_pack_4bit_weight`` / ``_dyn_quant_matmul_4bit``: symmetric int4 (``(q - 8) * scale``, no
  zero) with the activations quantised to int8 per row; KleidiAI on Arm, a scalar reference loop on x86.
* ``aten._weight_int4pack_mm_with_scales_and_zeros`` and ``aten._weight_int4pack_mm``: no CPU kernel.

Part (0) lists what the kernels accept on this machine (dtypes, group sizes, ops) and times the dynamic-
quantisation kernel. Part (1) repacks GGUF blocks into the int4pack layout: Q4_0 (scale d, zero 0), Q4_1
(scale d, zero m + 8d), Q4_K (scale d*sc, zero 8*d*sc - dmin*m) as one int4 matmul at group 32; Q5_0, Q5_1,
Q5_K and Q8_0 as two int4 matmuls in one call (the low nibble and the high bit(s), the weight concatenated along
K and x with itself). It reads back the weights the kernel uses (``x`` = the identity matrix) and compares them
with ``dequantize`` bit for bit (float32) and with its bfloat16 rounding, then compares matmuls with
``matmul_reference``.
Part (2) measures each path's error against ``matmul_reference`` in float32 on every probed shape; part (3)
times them: dense ``F.linear`` (float32 / bfloat16 weights), ``matmul_reference`` (dequantise every call),
int4pack (Q4_0/Q4_1/Q4_K: one layout, one time), int4pack x2 (Q5_*/Q8_0) and int8pack (per-channel int8),
best of rounds, at each thread count, by default with the cache flushed before each call (the weights come
from memory, as in a model step: a whole model does not fit in the last-level cache; --flush-mb 0 for warm).
Exits 1 when a part (1) check fails.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from llmp.quantization.ggml import GGML_FORMATS, dequantize, matmul_reference, quantize

aten = torch.ops.aten
GROUP = 32  # int4pack group size used for every format (GGUF's legacy block and k-quant sub-block)
QK_K = 256

# (name, in_features K, out_features N, matrices of this shape per layer; 0 = once per step, the lm head)
MODELS: dict[str, dict] = {
    "smollm2-135m": dict(
        layers=30,
        shapes=[("q/o", 576, 576, 2), ("k/v", 576, 192, 2), ("gate/up", 576, 1536, 2), ("down", 1536, 576, 1)]
        + [("lm_head", 576, 49152, 0)],
    ),
    "qwen2.5-0.5b": dict(
        layers=24,
        shapes=[("q/o", 896, 896, 2), ("k/v", 896, 128, 2), ("gate/up", 896, 4864, 2), ("down", 4864, 896, 1)]
        + [("lm_head", 896, 151936, 0)],
    ),
}
ONE_MATMUL = ("Q4_0", "Q4_1", "Q4_K")
TWO_MATMULS = ("Q5_0", "Q5_1", "Q5_K", "Q8_0")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated: " + ", ".join(MODELS))
    parser.add_argument("--m", default="1,8,32,512", help="activation rows (batch x tokens) to time")
    parser.add_argument("--threads", default="2,1", help="torch.set_num_threads values, in order")
    parser.add_argument("--dtypes", default="float32,bfloat16", help="activation dtypes")
    parser.add_argument("--rounds", type=int, default=3, help="timing rounds per cell (best is reported)")
    parser.add_argument("--min-round-s", type=float, default=0.05, help="calls per round fill at least this")
    parser.add_argument(
        "--max-call-s", type=float, default=2.0, help="skip a cell whose call is estimated (from the last M) above"
    )
    parser.add_argument(
        "--flush-mb",
        type=int,
        default=64,
        help="read a buffer this large before each timed call (weights from memory); 0: warm cache",
    )
    parser.add_argument("--err-m", type=int, default=8, help="activation rows for the error measurements")
    parser.add_argument("--err-rows", type=int, default=4096, help="output rows (a prefix) for the error runs")
    parser.add_argument("--check-only", action="store_true", help="parts (0) and (1) only")
    parser.add_argument("--skip-check", action="store_true", help="skip parts (0) and (1)")
    parser.add_argument("--skip-errors", action="store_true", help="skip part (2)")
    parser.add_argument("--json", default="", help="write every figure to this file")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


# -- GGUF blocks -> int4 groups ------------------------------------------------------------------
# Each unpacker takes uint8 blocks [n_blocks, type_size] and returns the int4 parts of the weight: a list of
# (q uint8 [n_blocks, block_size] in 0..15, scale float32 [n_blocks, block_size / 32], zero the same) with
# dequantize(blocks) == sum over parts of (q - 8) * scale + zero, group by group. Every scale and zero is
# computed in float32 from the float16 fields; the products are exact (an 11-bit float16 times a small
# integer), so only a zero that is a sum (Q4_1's m + 8d, Q4_K's 8*d*sc - dmin*m) can round.


@dataclass
class Int4Part:
    q: torch.Tensor  # uint8 [n_blocks, block_size], 0..15
    scale: torch.Tensor  # float32 [n_blocks, block_size // GROUP]
    zero: torch.Tensor  # float32, same shape


def _f16(blocks: torch.Tensor, offset: int) -> torch.Tensor:
    return blocks[:, offset : offset + 2].contiguous().view(torch.float16).float()  # [n, 1]


def _low_then_high(qs: torch.Tensor, groups: int) -> torch.Tensor:
    """[n, groups * w] bytes -> [n, groups * 2w]: in each group, the w low nibbles then the w high ones."""
    grouped = qs.reshape(qs.shape[0], groups, -1)
    return torch.cat([grouped & 0x0F, grouped >> 4], dim=-1).reshape(qs.shape[0], -1)


def _bits(packed: torch.Tensor, planes: int) -> torch.Tensor:
    """[n, w] bytes -> [n, planes, w] bits: bit p of byte j at [p, j]."""
    shifts = torch.arange(planes, dtype=torch.uint8).reshape(1, planes, 1)
    return (packed.unsqueeze(1) >> shifts) & 1


def _scale_min_k4(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K's 12 bytes -> 8 six-bit scales and 8 mins, as float32."""
    d, m, md = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    scales = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mins = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return scales.float(), mins.float()


def _unpack_q4_0(b: torch.Tensor) -> list[Int4Part]:  # w = d * (q - 8)
    d = _f16(b, 0)
    return [Int4Part(_low_then_high(b[:, 2:], 1), d, torch.zeros_like(d))]


def _unpack_q4_1(b: torch.Tensor) -> list[Int4Part]:  # w = d * q + m = (q - 8) * d + (m + 8d)
    d, m = _f16(b, 0), _f16(b, 2)
    return [Int4Part(_low_then_high(b[:, 4:], 1), d, m + 8 * d)]


def _unpack_q4_k(b: torch.Tensor) -> list[Int4Part]:  # w = d*sc * q - dmin*m, per 32-weight sub-block
    sc, m = _scale_min_k4(b[:, 4:16])
    scale, offset = _f16(b, 0) * sc, _f16(b, 2) * m
    return [Int4Part(_low_then_high(b[:, 16:], 4), scale, 8 * scale - offset)]


def _five_bit(low: torch.Tensor, high: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> list[Int4Part]:
    """w = scale * (low + 16 * high) + zero - 8 * scale: the low nibble as one part (its zero absorbs the
    offset), the high bit as (q - 8) * 16 scale with q = 8 + high."""
    return [Int4Part(low, scale, zero), Int4Part(high + 8, 16 * scale, torch.zeros_like(scale))]


def _unpack_q5_0(b: torch.Tensor) -> list[Int4Part]:  # w = d * (q5 - 16)
    d = _f16(b, 0)
    high = _bits(b[:, 2:6], 8).transpose(1, 2).reshape(-1, 32)  # element 8 * byte + bit
    return _five_bit(_low_then_high(b[:, 6:], 1), high, d, -8 * d)


def _unpack_q5_1(b: torch.Tensor) -> list[Int4Part]:  # w = d * q5 + m
    d, m = _f16(b, 0), _f16(b, 2)
    high = _bits(b[:, 4:8], 8).transpose(1, 2).reshape(-1, 32)
    return _five_bit(_low_then_high(b[:, 8:], 1), high, d, m + 8 * d)


def _unpack_q5_k(b: torch.Tensor) -> list[Int4Part]:  # w = d*sc * q5 - dmin*m
    sc, m = _scale_min_k4(b[:, 4:16])
    scale, offset = _f16(b, 0) * sc, _f16(b, 2) * m
    high = _bits(b[:, 16:48], 8).reshape(-1, QK_K)  # sub-block p takes bit p of the 32 bytes
    return _five_bit(_low_then_high(b[:, 48:], 4), high, scale, 8 * scale - offset)


def _unpack_q8_0(b: torch.Tensor) -> list[Int4Part]:  # w = d * q8 = 16d * ((hi + 8) - 8) + ((lo - 8) d + 8d)
    d = _f16(b, 0)
    q8 = b[:, 2:].view(torch.int8)
    low, high = (q8 & 0x0F).view(torch.uint8), ((q8 >> 4) + 8).view(torch.uint8)
    return [Int4Part(low, d, 8 * d), Int4Part(high, 16 * d, torch.zeros_like(d))]


UNPACKERS: dict[str, Callable[[torch.Tensor], list[Int4Part]]] = {
    "Q4_0": _unpack_q4_0,
    "Q4_1": _unpack_q4_1,
    "Q4_K": _unpack_q4_k,
    "Q5_0": _unpack_q5_0,
    "Q5_1": _unpack_q5_1,
    "Q5_K": _unpack_q5_k,
    "Q8_0": _unpack_q8_0,
}


@dataclass
class Int4Packed:
    """A GGUF weight in ATen's CPU int4pack layout: ``parts`` int4 matrices side by side along K."""

    packed: torch.Tensor  # uint8 [N, parts * K / 2], CPU-capability-specific layout
    scales_zeros: torch.Tensor  # [parts * K / 32, N, 2] in the activations' dtype
    parts: int

    @property
    def nbytes(self) -> int:
        return self.packed.nbytes + self.scales_zeros.nbytes


def repack_int4(blocks: torch.Tensor, fmt: str, out_features: int, dtype: torch.dtype) -> Int4Packed:
    """GGUF ``fmt`` blocks ``[N, bytes per row]`` -> the int4pack layout and scales/zeros in ``dtype`` (that of
    the activations it will multiply: the kernel takes one dtype for both)."""
    info = GGML_FORMATS[fmt]
    parts = UNPACKERS[fmt](blocks.reshape(-1, info.type_size))
    n = out_features
    q = torch.cat([p.q.reshape(n, -1) for p in parts], dim=1).to(torch.int32)
    scale = torch.cat([p.scale.reshape(n, -1) for p in parts], dim=1)
    zero = torch.cat([p.zero.reshape(n, -1) for p in parts], dim=1)
    packed = aten._convert_weight_to_int4pack_for_cpu(q, 1)
    scales_zeros = torch.stack([scale, zero], dim=-1).transpose(0, 1).contiguous().to(dtype)
    return Int4Packed(packed, scales_zeros, len(parts))


def int4_matmul(x: torch.Tensor, weight: Int4Packed) -> torch.Tensor:
    """``x @ W.T`` with the int4pack kernel (a two-part weight sees x twice along K)."""
    if weight.parts > 1:
        x = torch.cat([x] * weight.parts, dim=1)
    return aten._weight_int4pack_mm_for_cpu(x, weight.packed, GROUP, weight.scales_zeros)


@dataclass
class Int8Packed:
    weight: torch.Tensor  # int8 [N, K]
    scales: torch.Tensor  # [N], the activations' dtype

    @property
    def nbytes(self) -> int:
        return self.weight.nbytes + self.scales.nbytes


def requantize_int8(dense: torch.Tensor, dtype: torch.dtype) -> Int8Packed:
    """Per-output-channel symmetric int8 (absmax / 127, round to nearest) of a dense float32 weight."""
    scale = dense.abs().amax(dim=1, keepdim=True) / 127
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    q = torch.round(dense / scale).clamp(-127, 127).to(torch.int8)
    return Int8Packed(q, scale.reshape(-1).to(dtype))


# -- part (0): what the kernels accept on this machine ------------------------------------------


def _accepts(fn: Callable[[], object]) -> str:
    try:
        fn()
        return "ok"
    except (RuntimeError, NotImplementedError) as error:
        return "no: " + str(error).splitlines()[0][:90]


def probe_kernels(generator: torch.Generator) -> dict:
    """Which dtypes, group sizes and ops run on this CPU, and the dynamic-quantisation kernel's speed."""
    n, k = 1536, 576
    q = torch.randint(0, 16, (n, k), dtype=torch.int32, generator=generator)
    packed = aten._convert_weight_to_int4pack_for_cpu(q, 1)
    found: dict = {}
    names = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}
    for x_dt, x_name in names.items():
        for s_dt, s_name in names.items():
            x, sz = torch.randn(2, k, dtype=x_dt), torch.rand(k // 32, n, 2, dtype=s_dt)
            found[f"int4pack x={x_name} scales={s_name}"] = _accepts(
                lambda x=x, sz=sz: aten._weight_int4pack_mm_for_cpu(x, packed, 32, sz)
            )
            w8, s8 = torch.randint(-127, 128, (n, k), dtype=torch.int8), torch.rand(n, dtype=s_dt)
            found[f"int8pack x={x_name} scales={s_name}"] = _accepts(
                lambda x=x, w8=w8, s8=s8: aten._weight_int8pack_mm(x, w8, s8)
            )
    packed_512 = aten._convert_weight_to_int4pack_for_cpu(q[:, :512].contiguous(), 1)
    for group in (16, 32, 64, 128, 256, 512):
        sz, x = torch.rand(max(1, 512 // group), n, 2), torch.randn(2, 512)
        found[f"int4pack group {group} (K=512)"] = _accepts(
            lambda sz=sz, x=x, g=group: aten._weight_int4pack_mm_for_cpu(x, packed_512, g, sz)
        )
    found["int4pack N=40 (N % 16 != 0)"] = _accepts(
        lambda: aten._convert_weight_to_int4pack_for_cpu(torch.zeros(40, 64, dtype=torch.int32), 1)
    )
    bf = torch.randn(2, k, dtype=torch.bfloat16)
    found["_weight_int4pack_mm (CUDA layout)"] = _accepts(
        lambda: aten._weight_int4pack_mm(bf, packed, 32, torch.rand(k // 32, n, 2, dtype=torch.bfloat16))
    )
    found["_weight_int4pack_mm_with_scales_and_zeros"] = _accepts(
        lambda: aten._weight_int4pack_mm_with_scales_and_zeros(
            bf, packed, 32, torch.rand(k // 32, n, dtype=torch.bfloat16), torch.rand(k // 32, n, dtype=torch.bfloat16)
        )
    )
    # dynamic quantisation: weights (q - 8) * scale, no zero; activations quantised to int8 per row
    nibbles = q.to(torch.uint8)
    scales = torch.rand(n, k // 32, generator=generator) * 0.01
    dyn = aten._dyn_quant_pack_4bit_weight(
        (nibbles[:, ::2] | (nibbles[:, 1::2] << 4)).contiguous(), scales, None, 32, k, n
    )
    x = torch.randn(1, k, generator=generator)
    dense = ((q.float() - 8) * scales.repeat_interleave(32, 1)).contiguous()
    ref = x @ dense.T
    y = aten._dyn_quant_matmul_4bit(x, dyn, 32, k, n)
    found["dyn_quant rel err (int8 activations)"] = float((y - ref).abs().max() / ref.abs().max())
    found["dyn_quant M=1 576->1536 ms"] = 1e3 * time_call(
        lambda: aten._dyn_quant_matmul_4bit(x, dyn, 32, k, n), 3, 0.05, None
    )
    found["dense f32 M=1 576->1536 ms"] = 1e3 * time_call(lambda: F.linear(x, dense), 3, 0.05, None)
    found["dyn_quant bf16 activations, groups of 32"] = _accepts(
        lambda: aten._dyn_quant_matmul_4bit(x.bfloat16(), dyn, 32, k, n)
    )
    return found


def print_kernels(found: dict) -> None:
    print("\n(0) ATen's weight-only kernels on this machine")
    for key, value in found.items():
        print(f"    {key:44} {value:.3g}" if isinstance(value, float) else f"    {key:44} {value}")


# -- part (1): is the repacked weight the GGUF weight? -------------------------------------------


def random_blocks(fmt: str, rows: int, cols: int, generator: torch.Generator) -> torch.Tensor:
    """Random bytes with finite float16 scales spread over 1e-5..1e1 (d and m of unrelated magnitudes)."""
    info = GGML_FORMATS[fmt]
    n = rows * cols // info.block_size
    blocks = torch.randint(0, 256, (n, info.type_size), dtype=torch.uint8, generator=generator)
    offsets = {"Q4_0": (0,), "Q5_0": (0,), "Q8_0": (0,)}.get(fmt, (0, 2))
    for offset in offsets:
        magnitude = 10 ** (torch.rand(n, generator=generator) * 6 - 5)
        sign = torch.randint(0, 2, (n,), generator=generator) * 2 - 1
        blocks[:, offset : offset + 2] = (magnitude * sign).to(torch.float16).view(torch.uint8).reshape(n, 2)
    return blocks.reshape(rows, -1)


def test_weights(rows: int, cols: int, generator: torch.Generator) -> torch.Tensor:
    """Normal weights whose rows and columns differ in scale (x0.1..x10), half of the rows off centre."""
    w = torch.randn(rows, cols, generator=generator) * 0.02
    w *= torch.exp(torch.randn(rows, 1, generator=generator) * 0.5)
    w *= torch.exp(torch.randn(1, cols, generator=generator) * 0.5)
    w[rows // 2 :] += 0.01
    return w


def weights_seen(weight: Int4Packed, cols: int, dtype: torch.dtype) -> torch.Tensor:
    """The [N, K] weights the kernel multiplies by: its product with the identity (every other product is a
    zero, so the float32 result is each weight as the kernel computed it; in bfloat16, its rounding)."""
    return int4_matmul(torch.eye(cols, dtype=dtype), weight).T.float()


def check_repacking(generator: torch.Generator) -> tuple[list[dict], bool]:
    rows, cols = 256, 1024
    results, ok = [], True
    for source in ("quantised weights", "random blocks"):
        for fmt in ONE_MATMUL + TWO_MATMULS:
            if source == "random blocks":
                blocks = random_blocks(fmt, rows, cols, generator)
            else:
                blocks = quantize(test_weights(rows, cols, generator), fmt)
            ref = dequantize(blocks, fmt)
            row: dict = dict(source=source, format=fmt)
            for name, dtype in DTYPES.items():
                packed = repack_int4(blocks, fmt, rows, dtype)
                seen = weights_seen(packed, cols, dtype)
                target = ref if dtype == torch.float32 else ref.to(dtype).float()
                # equal as numbers (the kernel's (q - 8) * d + 0 is +0.0 where dequantize has -0.0)
                row[f"{name}_weights_differing"] = int((seen != target).sum())
                # a weight's error relative to its group's largest |weight| (a near-zero weight that is the
                # difference of scale and zero has a large error relative to itself, not to its neighbours)
                group_max = ref.abs().reshape(rows, -1, GROUP).amax(-1, keepdim=True).clamp_min(1e-30)
                rel = ((seen - ref).abs().reshape(rows, -1, GROUP) / group_max).masked_fill(group_max == 1e-30, 0)
                row[f"{name}_max_rel_weight_err"] = float(rel.max())
                x = torch.randn(16, cols, generator=generator)
                y = int4_matmul(x.to(dtype), packed).float()
                y_ref = matmul_reference(x, blocks, fmt)
                err = float((y - y_ref).abs().max() / y_ref.abs().max())
                row[f"{name}_matmul_rel_err"] = err
                if source == "quantised weights":
                    tolerance = 1e-5 if dtype == torch.float32 else 1e-2
                    row[f"{name}_matmul_ok"] = err <= tolerance
                    ok &= err <= tolerance
            row["weights"] = rows * cols
            results.append(row)
    return results, ok


def print_check(results: list[dict]) -> None:
    print("\n(1) GGUF -> int4pack repacking: weights the kernel uses vs llmp dequantize, and matmul vs reference")
    print("    differ: weights not equal to dequantize() (float32) or to dequantize().to(bfloat16) (bfloat16);")
    print("    max rel: max |kernel weight - dequantize()| / the largest |weight| of its 32-group")
    print("    matmul: max |y - matmul_reference(x, float32)| / max |reference| (M=16); tolerance 1e-5 f32, 1e-2 bf16")
    head = f"{'source':18} {'fmt':5} {'f32 differ':>12} {'f32 max rel':>11} {'f32 matmul':>10} "
    head += f"{'bf16 differ':>12} {'bf16 max rel':>12} {'bf16 matmul':>11}"
    print(head)
    for r in results:
        print(
            f"{r['source']:18} {r['format']:5} {r['float32_weights_differing']:>6}/{r['weights']:<6}"
            f"{r['float32_max_rel_weight_err']:>11.1e} {r['float32_matmul_rel_err']:>10.1e} "
            f"{r['bfloat16_weights_differing']:>6}/{r['weights']:<6}"
            f"{r['bfloat16_max_rel_weight_err']:>12.1e} {r['bfloat16_matmul_rel_err']:>11.1e}"
        )


# -- parts (2) and (3): errors and timings on model shapes ---------------------------------------


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    diff = float((y.float() - ref).abs().max())
    return diff, diff / float(ref.abs().max())


@dataclass
class ShapeWeights:
    k: int
    n: int
    blocks: dict[str, torch.Tensor]  # format -> GGUF blocks [N, bytes]
    dense: dict[torch.dtype, torch.Tensor]  # dequantised Q4_0 weight, per dtype (llmp's current path)
    int4: dict[torch.dtype, Int4Packed]  # Q4_0 repacked (Q4_1 and Q4_K: same layout, same time)
    int4x2: dict[torch.dtype, Int4Packed]  # Q8_0 repacked as two int4 matmuls (Q5_*: same layout)
    int8: dict[torch.dtype, Int8Packed]  # per-channel int8 of the dequantised Q8_0 weight


def build_weights(k: int, n: int, dtypes: list[torch.dtype], generator: torch.Generator) -> ShapeWeights:
    w = test_weights(n, k, generator)
    formats = ["Q4_0", "Q8_0"] + (["Q4_K"] if k % QK_K == 0 else [])
    blocks = {f: quantize(w, f) for f in formats}
    del w
    q4 = dequantize(blocks["Q4_0"], "Q4_0")
    q8 = dequantize(blocks["Q8_0"], "Q8_0")
    return ShapeWeights(
        k=k,
        n=n,
        blocks=blocks,
        dense={dt: q4.to(dt) for dt in dtypes},
        int4={dt: repack_int4(blocks["Q4_0"], "Q4_0", n, dt) for dt in dtypes},
        int4x2={dt: repack_int4(blocks["Q8_0"], "Q8_0", n, dt) for dt in dtypes},
        int8={dt: requantize_int8(q8, dt) for dt in dtypes},
    )


def shape_errors(k: int, n: int, m: int, rows: int, dtypes: list[torch.dtype], generator: torch.Generator) -> dict:
    """Each path's max abs and relative error against matmul_reference in float32, on the first ``rows``
    output rows (the error is per output element, so a prefix of the lm head measures the same)."""
    n = min(n, rows)
    w = test_weights(n, k, generator)
    x = torch.randn(m, k, generator=generator)
    formats = [f for f in ONE_MATMUL + TWO_MATMULS + ("Q6_K",) if not (f.endswith("_K") and k % QK_K)]
    blocks = {f: quantize(w, f) for f in formats}
    refs = {f: matmul_reference(x, b, f) for f, b in blocks.items()}
    out: dict = {}
    for dt in dtypes:
        name = str(dt).removeprefix("torch.")
        xd = x.to(dt)
        e = out[name] = {}
        e["dense:Q4_0"] = rel_err(F.linear(xd, dequantize(blocks["Q4_0"], "Q4_0").to(dt)), refs["Q4_0"])
        e["reference:Q4_0"] = rel_err(matmul_reference(xd, blocks["Q4_0"], "Q4_0"), refs["Q4_0"])
        for f in formats:
            if f in UNPACKERS:
                label = "int4" if f in ONE_MATMUL else "int4x2"
                e[f"{label}:{f}"] = rel_err(int4_matmul(xd, repack_int4(blocks[f], f, n, dt)), refs[f])
                if dt == torch.float32:
                    packed = repack_int4(blocks[f], f, n, torch.bfloat16)
                    e[f"{label} via bf16:{f}"] = rel_err(int4_matmul(xd.bfloat16(), packed), refs[f])
        for f in ("Q8_0", "Q6_K", "Q5_0"):
            if f in blocks:
                packed = requantize_int8(dequantize(blocks[f], f), dt)
                e[f"int8/channel:{f}"] = rel_err(aten._weight_int8pack_mm(xd, packed.weight, packed.scales), refs[f])
    return out


def paths_for(weights: ShapeWeights, dt: torch.dtype) -> dict[str, Callable[[torch.Tensor], torch.Tensor] | None]:
    bf16 = torch.bfloat16
    paths: dict[str, Callable[[torch.Tensor], torch.Tensor] | None] = {
        "dense": lambda x: F.linear(x, weights.dense[dt]),
        "ref Q4_0": lambda x: matmul_reference(x, weights.blocks["Q4_0"], "Q4_0"),
        "ref Q4_K": (lambda x: matmul_reference(x, weights.blocks["Q4_K"], "Q4_K"))
        if "Q4_K" in weights.blocks
        else None,
        "int4": lambda x: int4_matmul(x, weights.int4[dt]),
    }
    if dt == torch.float32:
        if bf16 in weights.int4:
            paths["int4 via bf16"] = lambda x: int4_matmul(x.to(bf16), weights.int4[bf16]).float()
            paths["int4x2 via bf16"] = lambda x: int4_matmul(x.to(bf16), weights.int4x2[bf16]).float()
    else:
        paths["int4x2"] = lambda x: int4_matmul(x, weights.int4x2[dt])
    paths["int8"] = lambda x: aten._weight_int8pack_mm(x, weights.int8[dt].weight, weights.int8[dt].scales)
    return paths


def time_call(fn: Callable[[], object], rounds: int, min_round_s: float, flush: torch.Tensor | None) -> float:
    """The fastest single call (seconds) over ``rounds`` rounds of enough calls to last ``min_round_s`` (a
    call over a second gets at most two rounds). The minimum, not the mean: on a shared machine a call that
    loses a core to another process for a time slice is not the kernel's time. With ``flush`` (a buffer
    larger than the last-level cache), it is read before every call, outside the timing: the weights come
    from memory, as in a model step whose weights do not fit in the cache; 5 calls a round then."""
    if flush is not None:
        flush.sum()
    start = time.perf_counter()
    fn()
    best = time.perf_counter() - start
    reps = max(1, min(200 if flush is None else 5, math.ceil(min_round_s / max(best, 1e-6))))
    for _ in range(rounds if best < 1.0 else min(rounds, 2)):
        for _ in range(reps):
            if flush is not None:
                flush.sum()
            start = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - start)
    return best


def fmt_ms(value: float | None, estimate: float | None = None) -> str:
    if value is None:
        return f"(~{estimate:.0f}s)" if estimate is not None else "n/a"
    return f"{value * 1e3:.3f}" if value < 0.1 else f"{value * 1e3:.1f}"


def machine() -> dict:
    model = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return dict(
        cpu=model,
        cpus=os.cpu_count(),
        capability=torch.backends.cpu.get_cpu_capability(),
        torch=torch.__version__,
        date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    )


def load() -> str:
    return "%.2f %.2f %.2f" % os.getloadavg()


def main() -> int:
    args = parse_args()
    generator = torch.Generator().manual_seed(args.seed)
    torch.manual_seed(args.seed)
    info = machine()
    report: dict = dict(machine=info, args=vars(args))
    print(f"{info['cpu']} ({info['cpus']} CPUs, ATen {info['capability']}), torch {info['torch']}, {info['date']}")
    print(f"load average at start: {load()}")

    ok = True
    if not args.skip_check:
        torch.set_num_threads(int(args.threads.split(",")[-1]))
        report["kernels"] = probe_kernels(generator)
        print_kernels(report["kernels"])
        torch.set_num_threads(int(args.threads.split(",")[0]))
        results, ok = check_repacking(generator)
        print_check(results)
        report["check"] = results
        print("check:", "PASS" if ok else "FAIL")
    if args.check_only:
        return _finish(report, args, ok)

    dtypes = [DTYPES[d] for d in args.dtypes.split(",")]
    ms = [int(m) for m in args.m.split(",")]
    threads = [int(t) for t in args.threads.split(",")]
    report["errors"], report["timings"] = {}, []
    flush = torch.ones(args.flush_mb << 18) if args.flush_mb else None  # float32: 4 bytes a value
    for model in args.models.split(","):
        spec = MODELS[model]
        for name, k, n, _count in spec["shapes"]:
            label = f"{model} {name} {k}->{n}"
            torch.set_num_threads(threads[-1])
            if not args.skip_errors:
                report["errors"][label] = shape_errors(k, n, args.err_m, args.err_rows, dtypes, generator)
            weights = build_weights(k, n, dtypes, generator)
            sizes = {
                "Q4_0 blocks": weights.blocks["Q4_0"].nbytes,
                "int4 bf16": weights.int4[dtypes[-1]].nbytes,
                "int4x2 bf16": weights.int4x2[dtypes[-1]].nbytes,
                "int8": weights.int8[dtypes[-1]].nbytes,
                "dense bf16": k * n * 2,
            }
            started, q4_0 = time.perf_counter(), weights.blocks["Q4_0"]
            repack_int4(q4_0, "Q4_0", n, torch.bfloat16)
            repack_s = time.perf_counter() - started
            print(f"\n{label}: repack Q4_0 -> int4 bf16 {repack_s:.3f}s ({threads[-1]} threads); bytes {sizes}")
            report["repack"] = report.get("repack", []) + [dict(shape=label, seconds=repack_s, bytes=sizes)]
            for t in threads:
                torch.set_num_threads(t)
                for dt in dtypes:
                    paths = paths_for(weights, dt)
                    last: dict[str, tuple[int, float]] = {}
                    print(f"  threads={t} {str(dt).removeprefix('torch.')} load {load()}  (ms per call)")
                    print("  " + f"{'M':>5} " + " ".join(f"{p:>15}" for p in paths))
                    for m in ms:
                        x = torch.randn(m, k, dtype=dt)
                        cells = []
                        for path, fn in paths.items():
                            value = estimate = None
                            if fn is not None:
                                prev = last.get(path)
                                estimate = prev[1] * m / prev[0] if prev else None
                                if estimate is None or estimate <= args.max_call_s:
                                    value = time_call(lambda fn=fn, x=x: fn(x), args.rounds, args.min_round_s, flush)
                                    last[path] = (m, value)
                                    estimate = None
                            cells.append(fmt_ms(value, estimate))
                            report["timings"].append(
                                dict(
                                    model=model,
                                    shape=name,
                                    k=k,
                                    n=n,
                                    threads=t,
                                    dtype=str(dt),
                                    m=m,
                                    path=path,
                                    seconds=value,
                                    estimate=estimate,
                                    load=os.getloadavg()[0],
                                )
                            )
                        print("  " + f"{m:>5} " + " ".join(f"{c:>15}" for c in cells), flush=True)
            del weights
        print_errors(report["errors"], model)
        print_step_summary(report["timings"], model, spec, ms, threads)
    print(f"\nload average at end: {load()}")
    return _finish(report, args, ok)


def print_errors(errors: dict, model: str) -> None:
    labels = [label for label in errors if label.startswith(model + " ")]
    if not labels:
        return
    print(f"\n(2) {model}: error vs matmul_reference in float32 (M as --err-m): max|diff| / max|ref| per shape,")
    print("    then the largest max|diff| over the shapes; n/a: a k-quant needs K % 256 == 0")
    for dtype in errors[labels[0]]:
        keys: list[str] = []
        for label in labels:
            keys += [key for key in errors[label][dtype] if key not in keys]
        print(
            f"  {dtype:8} {'path:format':24}" + "".join(f"{label.split(' ')[1]:>10}" for label in labels) + "   max abs"
        )
        for key in keys:
            cells, worst = [], 0.0
            for label in labels:
                value = errors[label][dtype].get(key)
                cells.append(f"{value[1]:>10.1e}" if value else f"{'n/a':>10}")
                worst = max(worst, value[0]) if value else worst
            print(f"  {'':8} {key:24}" + "".join(cells) + f"{worst:>10.1e}")


def print_step_summary(timings: list[dict], model: str, spec: dict, ms: list[int], threads: list[int]) -> None:
    """One decode/prefill step's matmuls: the layers (layers x each layer shape x its count), then with the
    lm head; each with its speed relative to dense float32 / dense bfloat16 at the same M and threads."""
    layers = spec["layers"]
    print(f"\n(3) {model}: one step's matmuls, ms: {layers} layers (q, k, v, o, gate, up, down), then + lm head;")
    print("    x.xx/y.yy: speed relative to dense float32 / dense bfloat16, same M and threads (>1: faster)")
    counts = {name: count for name, _k, _n, count in spec["shapes"]}
    for t in threads:
        totals: dict[tuple[str, str, int, bool], float] = {}
        for r in timings:
            if r["model"] != model or r["threads"] != t:
                continue
            count = counts[r["shape"]]
            value = math.nan if r["seconds"] is None else r["seconds"] * (count * layers if count else 1)
            for with_head in (False, True):
                if count or with_head:
                    key = (r["dtype"].removeprefix("torch."), r["path"], r["m"], with_head)
                    totals[key] = totals.get(key, 0.0) + value
        print(f"  threads={t}: {'dtype':8} {'path':15}" + "".join(f"{'M=' + str(m):>22}" for m in ms))
        for with_head in (False, True):
            print(f"  {'+ lm head' if with_head else 'layers':>10}")
            for dtype, path in dict.fromkeys((d, p) for d, p, _m, _h in totals):
                cells = []
                for m in ms:
                    total = totals.get((dtype, path, m, with_head), math.nan)
                    f32 = totals.get(("float32", "dense", m, with_head), math.nan) / total
                    b16 = totals.get(("bfloat16", "dense", m, with_head), math.nan) / total
                    cells.append(f"{total * 1e3:>9.1f} {f32:>5.2f}/{b16:<5.2f}" if total == total else "—")
                print(f"  {'':10} {dtype:8} {path:15}" + "".join(f"{c:>22}" for c in cells))


def _finish(report: dict, args: argparse.Namespace, ok: bool) -> int:
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1, default=str)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
