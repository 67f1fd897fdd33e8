"""GGML's block formats (the tensor types of GGUF files) in torch: the reference every fast kernel is checked against.

A quantised row is a run of blocks; each block holds ``block_size`` weights in ``type_size`` bytes: small
integers and the float16 scales (and minimums) that turn them back into numbers. :func:`dequantize` reproduces
``gguf.quants.dequantize`` bit for bit in float32 (same layouts, same float32 operations in the same order);
:func:`quantize` reproduces ``gguf.quants.quantize`` byte for byte for the legacy formats and has a simple
min/max quantiser of its own for the k-quants (which ``gguf`` cannot write), good enough for test files.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["GGML_FORMATS", "BlockFormat", "dequantize", "format_of", "matmul_reference", "pack_levels", "quantize"]

QK_K = 256  # weights per k-quant super-block


@dataclass(frozen=True)
class BlockFormat:
    """One GGML tensor type: ``block_size`` weights are stored in ``type_size`` bytes."""

    name: str
    ggml_type: int  # GGML's type id, as ``gguf.GGMLQuantizationType``
    block_size: int
    type_size: int


GGML_FORMATS: dict[str, BlockFormat] = {
    f.name: f
    for f in (
        BlockFormat("F32", 0, 1, 4),
        BlockFormat("F16", 1, 1, 2),
        BlockFormat("BF16", 30, 1, 2),
        BlockFormat("Q4_0", 2, 32, 18),
        BlockFormat("Q4_1", 3, 32, 20),
        BlockFormat("Q5_0", 6, 32, 22),
        BlockFormat("Q5_1", 7, 32, 24),
        BlockFormat("Q8_0", 8, 32, 34),
        BlockFormat("Q2_K", 10, QK_K, 84),
        BlockFormat("Q3_K", 11, QK_K, 110),
        BlockFormat("Q4_K", 12, QK_K, 144),
        BlockFormat("Q5_K", 13, QK_K, 176),
        BlockFormat("Q6_K", 14, QK_K, 210),
    )
}

# GGML's other type ids, only to name them in the error (gguf is not imported at run time)
_UNSUPPORTED_TYPES = {
    9: "Q8_1",
    15: "Q8_K",
    16: "IQ2_XXS",
    17: "IQ2_XS",
    18: "IQ3_XXS",
    19: "IQ1_S",
    20: "IQ4_NL",
    21: "IQ3_S",
    22: "IQ2_S",
    23: "IQ4_XS",
    24: "I8",
    25: "I16",
    26: "I32",
    27: "I64",
    28: "F64",
    29: "IQ1_M",
    34: "TQ1_0",
    35: "TQ2_0",
    39: "MXFP4",
    40: "NVFP4",
    41: "Q1_0",
}
_BY_TYPE = {f.ggml_type: f for f in GGML_FORMATS.values()}


def _unsupported(name: str) -> ValueError:
    return ValueError(f"GGUF tensor type {name} is not supported; supported: {', '.join(GGML_FORMATS)}")


def format_of(ggml_type: int) -> BlockFormat:
    """The format of GGML type id ``ggml_type`` (``ValueError`` naming the type when it is not supported)."""
    fmt = _BY_TYPE.get(int(ggml_type))
    if fmt is None:
        raise _unsupported(_UNSUPPORTED_TYPES.get(int(ggml_type), str(int(ggml_type))))
    return fmt


def _resolve(fmt: BlockFormat | str) -> BlockFormat:
    if isinstance(fmt, BlockFormat):
        return fmt
    if fmt not in GGML_FORMATS:
        raise _unsupported(fmt)
    return GGML_FORMATS[fmt]


# -- dequantising ------------------------------------------------------------------------------
# Each ``_dequantize_*`` takes uint8 blocks ``[n_blocks, type_size]`` and returns float32 ``[n_blocks, block_size]``.
# The products and sums are those of gguf/quants.py in the same order (``d * sc`` first, then ``* q``, then
# ``- dmin * m``), so float32 rounding agrees to the bit. (A float16 scale has 11 significant bits and the
# integers at most 8, so the products are exact and only the final add or subtract rounds.) The arithmetic is
# in place on the freshly converted integers: on a large matrix, allocating another output costs more than
# the arithmetic. Nibbles and bit planes are unpacked with broadcast shifts, so the element order is the layout's.


_SHIFTS: dict[tuple[torch.device, tuple[int, ...]], torch.Tensor] = {}


def _shifts(like: torch.Tensor, *values: int) -> torch.Tensor:
    """The shift amounts as a uint8 tensor on ``like``'s device (CUDA refuses a CPU operand), made once per
    device: a copy from the host in every forward pass would block, and could not be captured in a CUDA graph."""
    key = (like.device, values)
    if key not in _SHIFTS:
        _SHIFTS[key] = torch.tensor(values, dtype=torch.uint8, device=like.device)
    return _SHIFTS[key]


def _f16(blocks: torch.Tensor, offset: int) -> torch.Tensor:
    """The float16 at byte ``offset`` of each block, as float32 ``[n_blocks, 1]`` (exact, subnormals too)."""
    return blocks[:, offset : offset + 2].contiguous().view(torch.float16).float()


def _nibbles(qs: torch.Tensor, groups: int, width: int) -> torch.Tensor:
    """``qs`` ``[n, groups * width]``: each group's ``width`` low nibbles, then its high nibbles."""
    low_high = (qs.reshape(-1, groups, 1, width) >> _shifts(qs, 0, 4).reshape(1, 1, 2, 1)) & 0x0F
    return low_high.reshape(-1, groups * 2, width)


def _bit_planes(bits: torch.Tensor, planes: int, width: int, bits_per_plane: int) -> torch.Tensor:
    """Plane ``p`` of byte ``j`` (``bits_per_plane`` bits at ``p * bits_per_plane``) is element ``p * width + j``."""
    shifts = _shifts(bits, *range(0, planes * bits_per_plane, bits_per_plane)).reshape(1, 1, planes, 1)
    planes_of = (bits.reshape(-1, bits.shape[-1] // width, 1, width) >> shifts) & ((1 << bits_per_plane) - 1)
    return planes_of.reshape(bits.shape[0], -1)


def _dequantize_q4_0(blocks: torch.Tensor) -> torch.Tensor:
    q = _nibbles(blocks[:, 2:], 1, 16).reshape(-1, 32).float().sub_(8)
    return q.mul_(_f16(blocks, 0))


def _dequantize_q4_1(blocks: torch.Tensor) -> torch.Tensor:
    q = _nibbles(blocks[:, 4:], 1, 16).reshape(-1, 32).float()
    return q.mul_(_f16(blocks, 0)).add_(_f16(blocks, 2))


def _q5_values(qh: torch.Tensor, qs: torch.Tensor) -> torch.Tensor:
    """5-bit values 0..31: nibbles from ``qs``, the fifth bit of element ``j`` is bit ``j`` of the 32-bit ``qh``."""
    high = _bit_planes(qh, 8, 1, 1)  # byte b, bit k: element 8b + k
    return _nibbles(qs, 1, 16).reshape(-1, 32) | (high << 4)


def _dequantize_q5_0(blocks: torch.Tensor) -> torch.Tensor:
    q = _q5_values(blocks[:, 2:6], blocks[:, 6:]).float().sub_(16)
    return q.mul_(_f16(blocks, 0))


def _dequantize_q5_1(blocks: torch.Tensor) -> torch.Tensor:
    q = _q5_values(blocks[:, 4:8], blocks[:, 8:]).float()
    return q.mul_(_f16(blocks, 0)).add_(_f16(blocks, 2))


def _dequantize_q8_0(blocks: torch.Tensor) -> torch.Tensor:
    return blocks[:, 2:].view(torch.int8).float().mul_(_f16(blocks, 0))


def _dequantize_q2_k(blocks: torch.Tensor) -> torch.Tensor:
    scales, qs = blocks[:, :16], blocks[:, 16:80]
    dl = (_f16(blocks, 80) * (scales & 0x0F).float()).unsqueeze(-1)
    ml = (_f16(blocks, 82) * (scales >> 4).float()).unsqueeze(-1)
    q = _bit_planes(qs, 4, 32, 2).reshape(-1, 16, 16).float()
    return q.mul_(dl).sub_(ml).reshape(-1, QK_K)


def _dequantize_q3_k(blocks: torch.Tensor) -> torch.Tensor:
    hmask, qs, packed = blocks[:, :32], blocks[:, 32:96], blocks[:, 96:108]
    # 16 signed 6-bit scales: low 4 bits in nibbles of bytes 0-7, high 2 bits in bit pairs of bytes 8-11
    low = _nibbles(packed[:, :8], 1, 8).reshape(-1, 16)
    high = _bit_planes(packed[:, 8:], 4, 4, 2)
    scales = (low | (high << 4)).float() - 32
    dl = (_f16(blocks, 108) * scales).unsqueeze(-1)
    low_bits = _bit_planes(qs, 4, 32, 2).reshape(-1, 16, 16)
    # a clear hmask bit subtracts 4 (values -4..3)
    high_bit = _bit_planes(hmask, 8, 32, 1).reshape(-1, 16, 16) ^ 1
    q = (low_bits.to(torch.int8) - (high_bit << 2).to(torch.int8)).float()
    return q.mul_(dl).reshape(-1, QK_K)


def _scale_min_k4(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K's 12 bytes -> 8 scales and 8 mins of 6 bits: the first four of each whole in bytes 0-3 (scales)
    and 4-7 (mins); the last four's low nibbles in bytes 8-11 and high 2 bits in the top of bytes 0-7."""
    d, m, m_d = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    scales = torch.cat([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mins = torch.cat([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return scales, mins


def _k4_scales(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scales, mins = _scale_min_k4(blocks[:, 4:16])
    d = (_f16(blocks, 0) * scales.float()).unsqueeze(-1)
    dm = (_f16(blocks, 2) * mins.float()).unsqueeze(-1)
    return d, dm


def _dequantize_q4_k(blocks: torch.Tensor) -> torch.Tensor:
    d, dm = _k4_scales(blocks)
    q = _nibbles(blocks[:, 16:], 4, 32).float()
    return q.mul_(d).sub_(dm).reshape(-1, QK_K)


def _dequantize_q5_k(blocks: torch.Tensor) -> torch.Tensor:
    d, dm = _k4_scales(blocks)
    high = _bit_planes(blocks[:, 16:48], 8, 32, 1).reshape(-1, 8, 32)
    q = (_nibbles(blocks[:, 48:], 4, 32) | (high << 4)).float()
    return q.mul_(d).sub_(dm).reshape(-1, QK_K)


def _dequantize_q6_k(blocks: torch.Tensor) -> torch.Tensor:
    ql, qh, scales = blocks[:, :128], blocks[:, 128:192], blocks[:, 192:208]
    d = (_f16(blocks, 208) * scales.view(torch.int8).float()).unsqueeze(-1)
    low = _nibbles(ql, 2, 64).reshape(-1, QK_K)
    high = _bit_planes(qh, 4, 32, 2)
    q = (low | (high << 4)).float().reshape(-1, 16, 16).sub_(32)
    return q.mul_(d).reshape(-1, QK_K)


def _dequantize_f32(blocks: torch.Tensor) -> torch.Tensor:
    return blocks.contiguous().view(torch.float32)  # a view of contiguous bytes (no copy), as gguf's


def _dequantize_f16(blocks: torch.Tensor) -> torch.Tensor:
    return blocks.contiguous().view(torch.float16).float()


def _dequantize_bf16(blocks: torch.Tensor) -> torch.Tensor:
    return blocks.contiguous().view(torch.bfloat16).float()


_DEQUANTIZERS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "F32": _dequantize_f32,
    "F16": _dequantize_f16,
    "BF16": _dequantize_bf16,
    "Q4_0": _dequantize_q4_0,
    "Q4_1": _dequantize_q4_1,
    "Q5_0": _dequantize_q5_0,
    "Q5_1": _dequantize_q5_1,
    "Q8_0": _dequantize_q8_0,
    "Q2_K": _dequantize_q2_k,
    "Q3_K": _dequantize_q3_k,
    "Q4_K": _dequantize_q4_k,
    "Q5_K": _dequantize_q5_k,
    "Q6_K": _dequantize_q6_k,
}


def dequantize(blocks: torch.Tensor, fmt: BlockFormat | str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """uint8 ``[..., n_bytes]`` (rows of whole blocks) -> ``[..., n_bytes // type_size * block_size]`` in ``dtype``.

    Computed in float32 (equal to ``gguf.quants.dequantize`` bit for bit), then cast to ``dtype``. F32 in float32
    is a view of the bytes when they are contiguous, as in ``gguf``."""
    fmt = _resolve(fmt)
    if blocks.dtype != torch.uint8 or blocks.dim() == 0:
        raise ValueError(f"{fmt.name} blocks must be a uint8 tensor of at least one dimension, not {blocks.dtype}")
    n_bytes = blocks.shape[-1]
    if n_bytes % fmt.type_size:
        raise ValueError(f"{n_bytes} bytes per row is not a whole number of {fmt.name} blocks ({fmt.type_size} bytes)")
    values = _DEQUANTIZERS[fmt.name](blocks.reshape(-1, fmt.type_size))
    return values.reshape(*blocks.shape[:-1], n_bytes // fmt.type_size * fmt.block_size).to(dtype)


def matmul_reference(
    x: torch.Tensor, blocks: torch.Tensor, fmt: BlockFormat | str, out_features: int | None = None
) -> torch.Tensor:
    """``x @ W.T`` in ``x``'s dtype, ``W`` the dequantised ``blocks`` (``[out_features, n_bytes]``; or any shape
    of the same bytes when ``out_features`` is given): what a kernel's quantised matmul must compute."""
    weight = dequantize(blocks, fmt, dtype=x.dtype)
    if out_features is not None:
        if weight.numel() % out_features:
            raise ValueError(f"{weight.numel()} weights are not {out_features} rows")
        weight = weight.reshape(out_features, -1)
    return x @ weight.T


# -- quantising --------------------------------------------------------------------------------
# Each ``_quantize_*`` takes float32 ``[n_blocks, block_size]`` and returns uint8 ``[n_blocks, type_size]``.
# The legacy ones repeat gguf/quants.py's float32 steps (truncation after ``+ 8.5``, round half away from
# zero for Q8_0, scales rounded to float16 after use), so the bytes are gguf's.


# the signed integer levels each format stores in a block, decoded as ``d * level``
LEVEL_RANGES = {"Q4_0": (-8, 7), "Q5_0": (-16, 15), "Q8_0": (-128, 127)}


def pack_levels(levels: torch.Tensor, d: torch.Tensor, fmt: str) -> torch.Tensor:
    """Blocks of ``fmt`` (``Q4_0``, ``Q5_0`` or ``Q8_0``) holding given integer levels and scales, with no
    rounding: ``levels`` integers ``[n, 32]`` within the format's range (``LEVEL_RANGES``), ``d`` float16 ``[n]``;
    block ``i`` decodes to ``d[i] * levels[i]``. How an integer checkpoint (GPTQ, AWQ) stays exact in blocks."""
    low, high = LEVEL_RANGES[fmt]
    if levels.numel() and (int(levels.min()) < low or int(levels.max()) > high):
        raise ValueError(f"levels outside {fmt}'s range {low}..{high}")
    scale = d.to(torch.float16).view(torch.uint8).reshape(-1, 2)
    if fmt == "Q8_0":
        return torch.cat([scale, levels.to(torch.int8).view(torch.uint8)], dim=-1)
    stored = (levels - low).to(torch.uint8)  # Q4_0: level + 8; Q5_0: level + 16
    if fmt == "Q4_0":
        return torch.cat([scale, _pack_nibbles(stored)], dim=-1)
    return torch.cat([scale, _pack_bits(stored >> 4), _pack_nibbles(stored)], dim=-1)


def _f16_bytes(values: torch.Tensor) -> torch.Tensor:
    """float32 ``[n, 1]`` -> the little-endian bytes of its float16 rounding, ``[n, 2]``."""
    return values.to(torch.float16).view(torch.uint8).reshape(-1, 2)


def _inverse(d: torch.Tensor) -> torch.Tensor:
    return torch.where(d == 0, torch.zeros_like(d), 1 / d)


def _pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """uint8 ``[n, 2 * k]`` -> ``[n, k]``: the first half in the low nibbles, the second half in the high ones."""
    half = q.shape[-1] // 2
    return (q[:, :half] & 0x0F) | (q[:, half:] << 4)


def _pack_bits(bits: torch.Tensor) -> torch.Tensor:
    """``[n, 8 * k]`` of 0/1 -> ``[n, k]`` bytes, bit ``i`` of byte ``b`` being element ``8b + i`` (little order)."""
    weights = (1 << torch.arange(8, dtype=torch.int32, device=bits.device)).reshape(1, 1, 8)
    return (bits.reshape(bits.shape[0], -1, 8).to(torch.int32) * weights).sum(-1).to(torch.uint8)


def _signed_absmax(blocks: torch.Tensor) -> torch.Tensor:
    """Each row's value of largest magnitude, with its sign (the first of equals, as numpy's argmax)."""
    return torch.gather(blocks, -1, blocks.abs().argmax(dim=-1, keepdim=True))


def _quantize_symmetric(blocks: torch.Tensor, levels: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_0/Q5_0: the extreme maps to ``-levels / 2``; values 0..levels-1 as uint8, and the float32 scale."""
    half = levels // 2
    d = _signed_absmax(blocks) / -half
    q = torch.trunc(blocks * _inverse(d) + (half + 0.5)).clamp(0, levels - 1).to(torch.uint8)
    return q, d


def _quantize_min_max(blocks: torch.Tensor, levels: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q4_1/Q5_1: the range min..max in ``levels`` steps; values, float32 scale and minimum."""
    high, low = blocks.max(dim=-1, keepdim=True).values, blocks.min(dim=-1, keepdim=True).values
    d = (high - low) / (levels - 1)
    q = torch.trunc((blocks - low) * _inverse(d) + 0.5).clamp(0, levels - 1).to(torch.uint8)
    return q, d, low


def _quantize_q4_0(blocks: torch.Tensor) -> torch.Tensor:
    q, d = _quantize_symmetric(blocks, 16)
    return torch.cat([_f16_bytes(d), _pack_nibbles(q)], dim=-1)


def _quantize_q4_1(blocks: torch.Tensor) -> torch.Tensor:
    q, d, low = _quantize_min_max(blocks, 16)
    return torch.cat([_f16_bytes(d), _f16_bytes(low), _pack_nibbles(q)], dim=-1)


def _quantize_q5_0(blocks: torch.Tensor) -> torch.Tensor:
    q, d = _quantize_symmetric(blocks, 32)
    return torch.cat([_f16_bytes(d), _pack_bits(q >> 4), _pack_nibbles(q)], dim=-1)


def _quantize_q5_1(blocks: torch.Tensor) -> torch.Tensor:
    q, d, low = _quantize_min_max(blocks, 32)
    return torch.cat([_f16_bytes(d), _f16_bytes(low), _pack_bits(q >> 4), _pack_nibbles(q)], dim=-1)


def _round_half_away(values: torch.Tensor) -> torch.Tensor:
    """C's ``roundf``, as gguf's ``np_roundf`` computes it (torch.round rounds half to even)."""
    magnitude = values.abs()
    floored = torch.floor(magnitude)
    return magnitude.sub_(floored).mul_(2).floor_().add_(floored).mul_(torch.sign(values))


def _quantize_q8_0(blocks: torch.Tensor) -> torch.Tensor:
    d = blocks.abs().max(dim=-1, keepdim=True).values / 127
    q = _round_half_away(blocks * _inverse(d)).to(torch.int8).view(torch.uint8)
    return torch.cat([_f16_bytes(d), q], dim=-1)


# The k-quants: one super-block of 256 in sub-blocks, each with its own scale (and minimum) stored as a small
# integer times the super-block's float16 ``d`` (and ``dmin``). This quantiser takes each sub-block's scale from
# its min/max (no search, unlike llama.cpp's), then the integers against the scales as stored, so that the
# rounding of ``d`` and of the sub-block scales is accounted for.


def _super_scale(values: torch.Tensor, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Non-negative sub-block ``values`` ``[n, subs]`` -> their ``steps``-level integers and the float16-rounded
    super-block scale they multiply."""
    d = (values.max(dim=-1, keepdim=True).values / steps).to(torch.float16).float()
    integers = torch.round(values * _inverse(d)).clamp(0, steps)
    return integers, d


def _asymmetric_k(blocks: torch.Tensor, subs: int, levels: int, scale_steps: int) -> tuple[torch.Tensor, ...]:
    """Q2_K/Q4_K/Q5_K: x ≈ d * sc * q - dmin * m with q in 0..levels-1, sc and m in 0..scale_steps."""
    x = blocks.reshape(-1, subs, QK_K // subs)
    low = x.min(dim=-1).values.clamp(max=0)  # stored as a subtracted minimum, so never above 0
    scale = (x.max(dim=-1).values - low) / (levels - 1)
    sc, d = _super_scale(scale, scale_steps)
    m, dmin = _super_scale(-low, scale_steps)
    step = (d * sc).unsqueeze(-1)
    offset = (dmin * m).unsqueeze(-1)
    q = torch.round((x + offset) * _inverse(step)).clamp(0, levels - 1).to(torch.uint8).reshape(-1, QK_K)
    return q, sc.to(torch.uint8), m.to(torch.uint8), d, dmin


def _symmetric_k(blocks: torch.Tensor, subs: int, levels: int, scale_levels: int) -> tuple[torch.Tensor, ...]:
    """Q3_K/Q6_K: x ≈ d * sc * q, q in -levels/2..levels/2-1 and sc signed in -scale_levels/2..scale_levels/2-1;
    each extreme maps to the negative end, which has one more level."""
    x = blocks.reshape(-1, subs, QK_K // subs)
    scale = _signed_absmax(x).squeeze(-1) / -(levels // 2)
    d = (_signed_absmax(scale) / -(scale_levels // 2)).to(torch.float16).float()
    sc = torch.round(scale * _inverse(d)).clamp(-(scale_levels // 2), scale_levels // 2 - 1)
    step = (d * sc).unsqueeze(-1)
    q = torch.round(x * _inverse(step)).clamp(-(levels // 2), levels // 2 - 1).reshape(-1, QK_K)
    return q.to(torch.int16), sc.to(torch.int16), d


def _pack_bit_planes(values: torch.Tensor, width: int, bits_per_plane: int) -> torch.Tensor:
    """The inverse of ``_bit_planes``: element ``p * width + j`` goes to byte ``j`` of its group at ``p * bits``."""
    n = values.shape[0]
    planes = 8 // bits_per_plane
    grouped = values.to(torch.int32).reshape(n, -1, planes, width)
    shifts = torch.arange(0, 8, bits_per_plane, dtype=torch.int32, device=values.device).reshape(1, 1, planes, 1)
    return (grouped << shifts).sum(dim=2).to(torch.uint8).reshape(n, -1)


def _pack_nibble_groups(q: torch.Tensor, groups: int) -> torch.Tensor:
    """The inverse of ``_nibbles``: in each group, the first half low nibbles and the second half high ones."""
    grouped = q.reshape(q.shape[0] * groups, -1)
    return _pack_nibbles(grouped).reshape(q.shape[0], -1)


def _quantize_q2_k(blocks: torch.Tensor) -> torch.Tensor:
    q, sc, m, d, dmin = _asymmetric_k(blocks, 16, 4, 15)
    return torch.cat([sc | (m << 4), _pack_bit_planes(q, 32, 2), _f16_bytes(d), _f16_bytes(dmin)], dim=-1)


def _quantize_q3_k(blocks: torch.Tensor) -> torch.Tensor:
    q, sc, d = _symmetric_k(blocks, 16, 8, 64)
    biased = (q + 4).to(torch.uint8)  # 0..7: low 2 bits in qs, the third in hmask
    stored = (sc + 32).to(torch.uint8)  # 0..63: low nibbles in bytes 0-7, high bit pairs in bytes 8-11
    packed = torch.cat([_pack_nibbles(stored & 0x0F), _pack_bit_planes(stored >> 4, 4, 2)], dim=-1)
    hmask = _pack_bit_planes(biased >> 2, 32, 1)
    return torch.cat([hmask, _pack_bit_planes(biased & 3, 32, 2), packed, _f16_bytes(d)], dim=-1)


def _pack_scale_min_k4(scales: torch.Tensor, mins: torch.Tensor) -> torch.Tensor:
    """The inverse of ``_scale_min_k4``."""
    first_sc, last_sc = scales[:, :4], scales[:, 4:]
    first_m, last_m = mins[:, :4], mins[:, 4:]
    return torch.cat(
        [first_sc | ((last_sc >> 4) << 6), first_m | ((last_m >> 4) << 6), (last_sc & 0x0F) | ((last_m & 0x0F) << 4)],
        dim=-1,
    )


def _quantize_q4_k(blocks: torch.Tensor) -> torch.Tensor:
    q, sc, m, d, dmin = _asymmetric_k(blocks, 8, 16, 63)
    header = [_f16_bytes(d), _f16_bytes(dmin), _pack_scale_min_k4(sc, m)]
    return torch.cat([*header, _pack_nibble_groups(q, 4)], dim=-1)


def _quantize_q5_k(blocks: torch.Tensor) -> torch.Tensor:
    q, sc, m, d, dmin = _asymmetric_k(blocks, 8, 32, 63)
    header = [_f16_bytes(d), _f16_bytes(dmin), _pack_scale_min_k4(sc, m)]
    return torch.cat([*header, _pack_bit_planes(q >> 4, 32, 1), _pack_nibble_groups(q & 0x0F, 4)], dim=-1)


def _quantize_q6_k(blocks: torch.Tensor) -> torch.Tensor:
    q, sc, d = _symmetric_k(blocks, 16, 64, 256)
    biased = (q + 32).to(torch.uint8)
    ql = _pack_nibble_groups(biased & 0x0F, 2)
    qh = _pack_bit_planes(biased >> 4, 32, 2)
    return torch.cat([ql, qh, sc.to(torch.int8).view(torch.uint8), _f16_bytes(d)], dim=-1)


def _quantize_f32(blocks: torch.Tensor) -> torch.Tensor:
    return blocks.view(torch.uint8).clone()  # not the caller's weights: writing the bytes must not change them


def _quantize_f16(blocks: torch.Tensor) -> torch.Tensor:
    return blocks.to(torch.float16).view(torch.uint8)


def _quantize_bf16(blocks: torch.Tensor) -> torch.Tensor:
    return blocks.to(torch.bfloat16).view(torch.uint8)


_QUANTIZERS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "F32": _quantize_f32,
    "F16": _quantize_f16,
    "BF16": _quantize_bf16,
    "Q4_0": _quantize_q4_0,
    "Q4_1": _quantize_q4_1,
    "Q5_0": _quantize_q5_0,
    "Q5_1": _quantize_q5_1,
    "Q8_0": _quantize_q8_0,
    "Q2_K": _quantize_q2_k,
    "Q3_K": _quantize_q3_k,
    "Q4_K": _quantize_q4_k,
    "Q5_K": _quantize_q5_k,
    "Q6_K": _quantize_q6_k,
}


def quantize(weights: torch.Tensor, fmt: BlockFormat | str) -> torch.Tensor:
    """float ``[rows, cols]`` (``cols`` a multiple of the block size) -> uint8 ``[rows, cols // block_size *
    type_size]``. Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 are ``gguf.quants.quantize``'s bytes; the k-quants come from a
    simple min/max quantiser (for test files); F32, F16 and BF16 are casts."""
    fmt = _resolve(fmt)
    if weights.dim() != 2:
        raise ValueError(f"quantize takes a [rows, cols] matrix, not shape {tuple(weights.shape)}")
    rows, cols = weights.shape
    if cols % fmt.block_size:
        raise ValueError(f"{cols} columns is not a whole number of {fmt.name} blocks ({fmt.block_size} weights)")
    blocks = weights.to(torch.float32).contiguous().reshape(-1, fmt.block_size)
    return _QUANTIZERS[fmt.name](blocks).reshape(rows, cols // fmt.block_size * fmt.type_size)
