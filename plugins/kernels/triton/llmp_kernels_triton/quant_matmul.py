"""``x @ W.T`` straight from a GGUF file's GGML blocks (``pack_quantized``, :class:`llmp.api.PacksQuantized`).

``W`` stays in its blocks (uint8 ``[out, row bytes]``, one row of W a run of whole blocks); each program
dequantises a tile of ``BLOCK_N`` weight rows in registers, 16 weights of each row at a time, to float32 bit
for bit as :func:`llmp.quantization.dequantize` does (same float32 operations in the same order), and
multiplies them with ``BLOCK_T`` rows of ``x`` (float32, as loaded). The grid tiles output columns and
rows of ``x`` only: each program runs over the whole of ``K`` (no split-K).

The summation order is written out elementwise, so it is the same whatever the tile shapes, the number
of warps or the backend: lane ``j`` (0..15) of output ``[t, n]`` sums ``x[t, k] * W[n, k]`` for the
``k = 16 c + j`` in order of ``c`` with fused multiply-adds, and the 16 lanes are then added pairwise
(``(l0 + l1) + (l2 + l3)``, ...). No ``tl.dot`` and no ``tl.sum``, whose order follows the layout (and
tile shape) on a GPU, and BLAS's under the interpreter. So a row's result depends only on that row: the
decode launch (``BLOCK_T`` of 1 to 8, narrow column tiles: many programs for a GEMV) and the prefill launch
(16 rows by 64 columns: the weights dequantised once per 16 rows) give the same bits. The cost: no tensor
cores, prefill runs on the CUDA cores' FMAs.

Formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (blocks of 32) and Q4_K, Q5_K, Q6_K (super-blocks of 256); others
(Q2_K, Q3_K, F16 ...) are left to the layer, which dequantises them once at load.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl

from llmp.quantization import QuantizedWeight
from llmp_kernels_triton._common import INTERPRET, check_float, check_tensors, round_to

# name -> (GGML type id, weights per block, bytes per block); the kernel's FMT is the type id
FORMATS: dict[str, tuple[int, int, int]] = {
    "Q4_0": (2, 32, 18),
    "Q4_1": (3, 32, 20),
    "Q5_0": (6, 32, 22),
    "Q5_1": (7, 32, 24),
    "Q8_0": (8, 32, 34),
    "Q4_K": (12, 256, 144),
    "Q5_K": (13, 256, 176),
    "Q6_K": (14, 256, 210),
}
LANES = 16  # weights of a row per step; the lanes of the fixed summation order (module docstring)

# (BLOCK_T, BLOCK_N, num_warps): up to DECODE_ROWS rows, BLOCK_T is the next power of two and the
# column tiles narrow (a GEMV needs many programs); more rows take the prefill tile
DECODE_ROWS = 8
DECODE_BLOCK_N, DECODE_WARPS = 16, 2
PREFILL_BLOCK_T, PREFILL_BLOCK_N, PREFILL_WARPS = 16, 64, 8


@triton.jit
def _f16(ptr):
    """The little-endian float16 at ``ptr`` (uint8 pointers, any alignment), as float32 (exact)."""
    low = tl.load(ptr).to(tl.uint16)
    high = tl.load(ptr + 1).to(tl.uint16)
    return (low | (high << 8)).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _bytes(ptr):
    return tl.load(ptr).to(tl.int32)


@triton.jit
def _fma(acc, x_at, w):
    """acc [T, N, LANES] += x [T, LANES] (loaded at ``x_at``, as float32) times w [N, LANES], lane by lane."""
    x = tl.load(x_at).to(tl.float32)
    x, w = tl.broadcast(x[:, None, :], w[None, :, :])
    return tl.fma(x, w, acc)


@triton.jit
def _halve(acc, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, WIDTH: tl.constexpr):
    """[T, N, WIDTH] -> [T, N, WIDTH / 2]: neighbouring lanes added (a fixed pairwise tree, level by level)."""
    even, odd = tl.split(tl.reshape(acc, (BLOCK_T, BLOCK_N, WIDTH // 2, 2)))
    return even + odd


@triton.jit
def _legacy_block(acc, blk, x_at, j, FMT: tl.constexpr):
    """One block of 32 (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0): two steps of 16 weights, in the block's order."""
    d = _f16(blk)
    if FMT == 2:  # Q4_0: d, 16 bytes of nibbles (low: weights 0-15, high: 16-31); w = (q - 8) * d
        qs = _bytes(blk + 2 + j[None, :])
        for c in tl.static_range(2):
            q = ((qs >> (4 * c)) & 15).to(tl.float32)
            acc = _fma(acc, x_at + 16 * c, (q - 8.0) * d)
    elif FMT == 3:  # Q4_1: d, m, nibbles; w = q * d + m
        m = _f16(blk + 2)
        qs = _bytes(blk + 4 + j[None, :])
        for c in tl.static_range(2):
            q = ((qs >> (4 * c)) & 15).to(tl.float32)
            acc = _fma(acc, x_at + 16 * c, q * d + m)
    elif FMT == 6:  # Q5_0: d, 32 high bits (bit i of the 4 bytes is weight i's), nibbles; w = (q - 16) * d
        qs = _bytes(blk + 6 + j[None, :])
        for c in tl.static_range(2):
            high = (_bytes(blk + 2 + 2 * c + j[None, :] // 8) >> (j[None, :] % 8)) & 1
            q = (((qs >> (4 * c)) & 15) | (high << 4)).to(tl.float32)
            acc = _fma(acc, x_at + 16 * c, (q - 16.0) * d)
    elif FMT == 7:  # Q5_1: d, m, high bits, nibbles; w = q * d + m
        m = _f16(blk + 2)
        qs = _bytes(blk + 8 + j[None, :])
        for c in tl.static_range(2):
            high = (_bytes(blk + 4 + 2 * c + j[None, :] // 8) >> (j[None, :] % 8)) & 1
            q = (((qs >> (4 * c)) & 15) | (high << 4)).to(tl.float32)
            acc = _fma(acc, x_at + 16 * c, q * d + m)
    else:  # Q8_0: d, 32 signed bytes; w = q * d
        for c in tl.static_range(2):
            q = tl.load(blk + 2 + 16 * c + j[None, :]).to(tl.int8, bitcast=True).to(tl.float32)
            acc = _fma(acc, x_at + 16 * c, q * d)
    return acc


@triton.jit
def _k4_scale_min(blk, s: tl.constexpr):
    """Q4_K/Q5_K sub-block ``s``'s 6-bit scale and minimum from the 12 bytes at 4: the first four of each whole
    in bytes 0-3 (scales) and 4-7 (mins); the last four's low nibbles in 8-11, high 2 bits atop bytes 0-7."""
    if s < 4:
        scale = _bytes(blk + 4 + s) & 63
        minimum = _bytes(blk + 8 + s) & 63
    else:
        low = _bytes(blk + 8 + s)
        scale = (low & 15) | ((_bytes(blk + s) >> 6) << 4)
        minimum = (low >> 4) | ((_bytes(blk + 4 + s) >> 6) << 4)
    return scale.to(tl.float32), minimum.to(tl.float32)


@triton.jit
def _k_block(acc, blk, x_at, j, FMT: tl.constexpr):
    """One super-block of 256 (Q4_K, Q5_K, Q6_K): sixteen steps of 16 weights, in the block's order."""
    if FMT == 14:  # Q6_K: ql[128], qh[64], 16 int8 scales, d; w = (q - 32) * (d * scale), one scale per 16
        d = _f16(blk + 208)
        for c in tl.static_range(16):  # weights 16c..16c+15: 128 per half (g); nibbles of ql, bit pairs of qh
            g = c // 8
            low = (_bytes(blk + 64 * g + 16 * (c % 4) + j[None, :]) >> (4 * ((c % 8) // 4))) & 15
            high = (_bytes(blk + 128 + 32 * g + 16 * (c % 2) + j[None, :]) >> (2 * ((c % 8) // 2))) & 3
            q = (low | (high << 4)).to(tl.float32) - 32.0
            scale = tl.load(blk + 192 + c).to(tl.int8, bitcast=True).to(tl.float32)
            acc = _fma(acc, x_at + 16 * c, q * (d * scale))
    else:  # Q4_K (d, dmin, scales, qs[128] at 16) or Q5_K (also qh[32] at 16, qs at 48); w = q * sc - mn
        d, dmin = _f16(blk), _f16(blk + 2)
        for s in tl.static_range(8):  # sub-blocks of 32: nibbles of qs' 32-byte group s // 2, low ones first
            scale, minimum = _k4_scale_min(blk, s)
            sc, mn = d * scale, dmin * minimum
            for h in tl.static_range(2):
                if FMT == 12:
                    q = (_bytes(blk + 16 + 32 * (s // 2) + 16 * h + j[None, :]) >> (4 * (s % 2))) & 15
                else:  # weight 32s + i's fifth bit: bit s of qh[i]
                    low = (_bytes(blk + 48 + 32 * (s // 2) + 16 * h + j[None, :]) >> (4 * (s % 2))) & 15
                    q = low | (((_bytes(blk + 16 + 16 * h + j[None, :]) >> s) & 1) << 4)
                acc = _fma(acc, x_at + 32 * s + 16 * h, q.to(tl.float32) * sc - mn)
    return acc


@triton.jit(do_not_specialize=["n_tokens"])
def _quant_matmul_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    n_tokens,
    n_out,
    n_blocks,
    x_stride,
    w_stride,
    FMT: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TYPE_SIZE: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    col_block, row_block = tl.program_id(0), tl.program_id(1)
    t = row_block * BLOCK_T + tl.arange(0, BLOCK_T)
    n = col_block * BLOCK_N + tl.arange(0, BLOCK_N)
    j = tl.arange(0, 16)
    # rows and columns past the end compute a copy of the last one (never stored): no masks on the loads
    x_rows = x_ptr + tl.minimum(t, n_tokens - 1).to(tl.int64)[:, None] * x_stride + j[None, :]  # [T, 16]
    w_rows = w_ptr + tl.minimum(n, n_out - 1).to(tl.int64)[:, None] * w_stride  # [N, 1]
    acc = tl.zeros((BLOCK_T, BLOCK_N, 16), dtype=tl.float32)
    for b in range(n_blocks):
        blk = w_rows + b * TYPE_SIZE
        x_at = x_rows + b * BLOCK_SIZE
        if BLOCK_SIZE == 32:
            acc = _legacy_block(acc, blk, x_at, j, FMT)
        else:
            acc = _k_block(acc, blk, x_at, j, FMT)
    acc = _halve(acc, BLOCK_T, BLOCK_N, 16)
    acc = _halve(acc, BLOCK_T, BLOCK_N, 8)
    acc = _halve(acc, BLOCK_T, BLOCK_N, 4)
    acc = tl.reshape(_halve(acc, BLOCK_T, BLOCK_N, 2), (BLOCK_T, BLOCK_N))
    mask = (t[:, None] < n_tokens) & (n[None, :] < n_out)
    tl.store(out_ptr + t.to(tl.int64)[:, None] * n_out + n[None, :], round_to(acc, out_ptr.dtype.element_ty), mask=mask)


def launch_config(tokens: int) -> tuple[int, int, int]:
    """``(BLOCK_T, BLOCK_N, num_warps)`` for ``tokens`` rows of x: the decode (GEMV) tile or the prefill one."""
    if tokens <= DECODE_ROWS:
        return triton.next_power_of_2(max(tokens, 1)), DECODE_BLOCK_N, DECODE_WARPS
    return PREFILL_BLOCK_T, PREFILL_BLOCK_N, PREFILL_WARPS


def quant_matmul(x: torch.Tensor, blocks: torch.Tensor, fmt: str, in_features: int) -> torch.Tensor:
    """``x @ W.T``: x ``[T, in_features]`` float, blocks uint8 ``[out, in_features / block * type_size]``
    (``fmt`` one of :data:`FORMATS`) -> ``[T, out]`` in x's dtype."""
    op = "quant_matmul"
    ggml_type, block_size, type_size = FORMATS[fmt]
    n_blocks = in_features // block_size
    if x.dim() != 2 or x.shape[1] != in_features:
        raise ValueError(f"{op}: x must have shape [*, {in_features}], got {list(x.shape)}")
    if blocks.dtype != torch.uint8 or blocks.dim() != 2 or blocks.shape[1] != n_blocks * type_size:
        raise ValueError(
            f"{op}: {fmt} blocks for {in_features} inputs must be uint8 [*, {n_blocks * type_size}], "
            f"got {blocks.dtype} {list(blocks.shape)}"
        )
    check_float(op, x=x)
    device = check_tensors(op, x=x, blocks=blocks)
    tokens, n_out = x.shape[0], blocks.shape[0]
    out = torch.empty(tokens, n_out, dtype=x.dtype, device=device)
    if tokens == 0 or n_out == 0:
        return out
    block_t, block_n, warps = launch_config(tokens)
    grid = (triton.cdiv(n_out, block_n), triton.cdiv(tokens, block_t))
    _quant_matmul_kernel[grid](
        x,
        blocks,
        out,
        tokens,
        n_out,
        n_blocks,
        x.stride(0),
        blocks.stride(0),
        FMT=ggml_type,
        BLOCK_SIZE=block_size,
        TYPE_SIZE=type_size,
        BLOCK_T=block_t,
        BLOCK_N=block_n,
        num_warps=warps,
    )
    return out


class QuantizedLinear:
    """``x @ W.T`` for x ``[..., in_features]``, ``W`` kept as its GGML blocks."""

    def __init__(self, weight: QuantizedWeight) -> None:
        self.blocks = weight.blocks.contiguous()  # a view of the blocks when they already are
        self.format = weight.format.name
        self.in_features = weight.in_features

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        if rows.stride(-1) != 1:
            rows = rows.contiguous()
        out = quant_matmul(rows, self.blocks, self.format, self.in_features)
        return out.reshape(*x.shape[:-1], out.shape[-1])


def pack_quantized(weight: QuantizedWeight) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """The matmul of ``weight`` from its blocks, or ``None`` for a format not in :data:`FORMATS` or blocks
    not on a CUDA device (on the CPU only under Triton's interpreter, for tests)."""
    device = weight.blocks.device.type
    if weight.format.name not in FORMATS or (device != "cuda" and not (INTERPRET and device == "cpu")):
        return None
    return QuantizedLinear(weight)
