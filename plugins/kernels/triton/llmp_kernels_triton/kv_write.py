"""Scatter this step's k and v into the paged caches at flat slots (-1 = skip)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from llmp_kernels_triton._common import check_float, check_shape, check_tensors, round_to


@triton.jit
def _write_kv_kernel(
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    n_heads,
    k_stride_t,
    k_stride_h,
    v_stride_t,
    v_stride_h,
    HEAD_DIM: tl.constexpr,
    H_PAD: tl.constexpr,
    D_PAD: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    h = tl.arange(0, H_PAD)
    d = tl.arange(0, D_PAD)
    # a -1 slot masks every head (a scalar bool in the mask breaks triton 3.9's interpreter, so no `& (slot >= 0)`)
    heads = tl.where(slot >= 0, n_heads, 0)
    mask = (h[:, None] < heads) & (d[None, :] < HEAD_DIM)
    dst = slot * n_heads * HEAD_DIM + h[:, None] * HEAD_DIM + d[None, :]  # caches are contiguous
    k = tl.load(k_ptr + t * k_stride_t + h[:, None] * k_stride_h + d[None, :], mask=mask)
    v = tl.load(v_ptr + t * v_stride_t + h[:, None] * v_stride_h + d[None, :], mask=mask)
    tl.store(k_cache_ptr + dst, round_to(k.to(tl.float32), k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + dst, round_to(v.to(tl.float32), v_cache_ptr.dtype.element_ty), mask=mask)


def write_kv(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """k, v [T, Hkv, D] into caches [B, S, Hkv, D] at ``slot_mapping`` [T] (block * S + offset)."""
    op = "write_kv"
    if k_cache.dim() != 4:
        raise ValueError(f"{op}: k_cache must have shape [B, S, Hkv, D], got {list(k_cache.shape)}")
    _, _, kv_heads, head_dim = k_cache.shape
    check_shape(op, "v_cache", v_cache, tuple(k_cache.shape))
    check_shape(op, "k", k, (None, kv_heads, head_dim))
    check_shape(op, "v", v, tuple(k.shape))
    check_shape(op, "slot_mapping", slot_mapping, (k.shape[0],))
    if slot_mapping.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{op}: slot_mapping must be int32 or int64, got {slot_mapping.dtype}")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError(f"{op}: k_cache and v_cache must be contiguous")
    check_float(op, k=k, v=v, k_cache=k_cache, v_cache=v_cache)
    check_tensors(op, k=k, v=v, k_cache=k_cache, v_cache=v_cache, slot_mapping=slot_mapping)
    if k.shape[0]:
        _write_kv_kernel[(k.shape[0],)](
            k,
            v,
            k_cache,
            v_cache,
            slot_mapping,
            kv_heads,
            k.stride(0),
            k.stride(1),
            v.stride(0),
            v.stride(1),
            HEAD_DIM=head_dim,
            H_PAD=triton.next_power_of_2(kv_heads),
            D_PAD=triton.next_power_of_2(head_dim),
        )
