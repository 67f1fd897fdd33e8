"""Rotary embeddings (neox layout) for q and k in one launch, one token per program."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from llmp_kernels_triton._common import check_float, check_shape, check_tensors, round_to


@triton.jit
def _rotate_heads(
    x_ptr,
    out_ptr,
    t,
    n_heads,
    stride_t,
    stride_h,
    cos,
    sin,
    HEAD_DIM: tl.constexpr,
    HALF: tl.constexpr,
    HALF_PAD: tl.constexpr,
    H_PAD: tl.constexpr,
    PASS_PAD: tl.constexpr,
):
    # all heads of token t: [H_PAD, HALF_PAD] tiles of the two halves of the rotated dims
    h = tl.arange(0, H_PAD)
    j = tl.arange(0, HALF_PAD)
    mask = (h[:, None] < n_heads) & (j[None, :] < HALF)
    src = x_ptr + t * stride_t + h[:, None] * stride_h
    dst = out_ptr + (t * n_heads + h[:, None]) * HEAD_DIM
    x1 = tl.load(src + j[None, :], mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF + j[None, :], mask=mask, other=0.0).to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    tl.store(dst + j[None, :], round_to(x1 * cos[None, :] - x2 * sin[None, :], dtype), mask=mask)
    tl.store(dst + HALF + j[None, :], round_to(x2 * cos[None, :] + x1 * sin[None, :], dtype), mask=mask)
    if PASS_PAD > 0:  # partial rotary: dims past 2 * HALF are copied unchanged
        p = 2 * HALF + tl.arange(0, PASS_PAD)
        pmask = (h[:, None] < n_heads) & (p[None, :] < HEAD_DIM)
        tl.store(dst + p[None, :], tl.load(src + p[None, :], mask=pmask), mask=pmask)


@triton.jit
def _rotary_kernel(
    pos_ptr,
    q_ptr,
    k_ptr,
    q_out_ptr,
    k_out_ptr,
    cs_ptr,
    n_q_heads,
    n_k_heads,
    q_stride_t,
    q_stride_h,
    k_stride_t,
    k_stride_h,
    cs_stride,
    HEAD_DIM: tl.constexpr,
    HALF: tl.constexpr,
    HALF_PAD: tl.constexpr,
    HQ_PAD: tl.constexpr,
    HK_PAD: tl.constexpr,
    PASS_PAD: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    j = tl.arange(0, HALF_PAD)
    cos = tl.load(cs_ptr + pos * cs_stride + j, mask=j < HALF, other=0.0)
    sin = tl.load(cs_ptr + pos * cs_stride + HALF + j, mask=j < HALF, other=0.0)
    _rotate_heads(
        q_ptr, q_out_ptr, t, n_q_heads, q_stride_t, q_stride_h, cos, sin, HEAD_DIM, HALF, HALF_PAD, HQ_PAD, PASS_PAD
    )
    _rotate_heads(
        k_ptr, k_out_ptr, t, n_k_heads, k_stride_t, k_stride_h, cos, sin, HEAD_DIM, HALF, HALF_PAD, HK_PAD, PASS_PAD
    )


def rotary(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [T, H, D], k [T, Hkv, D] rotated by the ``cos_sin`` [max_pos, R] float32 rows at ``positions`` [T]."""
    op = "rotary"
    if q.dim() != 3:
        raise ValueError(f"{op}: q must have shape [T, H, D], got {list(q.shape)}")
    tokens, _, head_dim = q.shape
    check_shape(op, "k", k, (tokens, None, head_dim))
    check_shape(op, "positions", positions, (tokens,))
    rot = cos_sin.shape[-1] if cos_sin.dim() == 2 else -1
    if cos_sin.dtype != torch.float32 or rot % 2 or not 0 < rot <= head_dim:
        raise ValueError(
            f"{op}: cos_sin must be float32 [max_pos, R] with even R <= head_dim {head_dim}, "
            f"got {cos_sin.dtype} {list(cos_sin.shape)}"
        )
    if positions.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{op}: positions must be int32 or int64, got {positions.dtype}")
    check_float(op, q=q, k=k)
    check_tensors(op, positions=positions, q=q, k=k, cos_sin=cos_sin)
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    if tokens:
        half, passed = rot // 2, head_dim - rot
        _rotary_kernel[(tokens,)](
            positions,
            q,
            k,
            q_out,
            k_out,
            cos_sin,
            q.shape[1],
            k.shape[1],
            q.stride(0),
            q.stride(1),
            k.stride(0),
            k.stride(1),
            cos_sin.stride(0),
            HEAD_DIM=head_dim,
            HALF=half,
            HALF_PAD=triton.next_power_of_2(half),
            HQ_PAD=triton.next_power_of_2(q.shape[1]),
            HK_PAD=triton.next_power_of_2(k.shape[1]),
            PASS_PAD=triton.next_power_of_2(passed) if passed else 0,
        )
    return q_out, k_out
