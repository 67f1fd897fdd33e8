"""Paged attention for a mixed batch of prefill chunks and decodes, in one launch.

Grid: (query blocks, KV heads). A program takes ``BLOCK_Q`` consecutive query
rows of one request and the ``GROUP`` query heads sharing one KV head, packed
as ``BLOCK_M = BLOCK_Q * GROUP`` rows (GQA: each K/V tile is loaded once for
the whole group). It walks the request's keys in tiles of ``TILE_N`` positions,
looking each position's physical block up in the block table, with an online
softmax. Keys outside [window start, causal end) are never loaded, so slots that
were never written (garbage, NaN) cannot reach the output.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from llmp.api import AttentionMetadata
from llmp_kernels_triton._common import check_float, check_shape, check_tensors, round_to
from llmp_kernels_triton.activation import tanh


@triton.jit
def _find_request(q_start_ptr, pid, n_requests, BLOCK_Q: tl.constexpr):
    # request r owns query blocks from q_start[r] // BLOCK_Q + r on (at least ceil(q_len / BLOCK_Q) of them,
    # so no host-side table is needed); binary search for the last r whose first block is <= pid
    lo = 0
    hi = n_requests
    while lo < hi:
        mid = (lo + hi) // 2
        if tl.load(q_start_ptr + mid) // BLOCK_Q + mid <= pid:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _paged_attention_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    out_ptr,
    q_start_ptr,
    seq_lens_ptr,
    block_tables_ptr,
    n_requests,
    n_kv_heads,
    q_stride_t,
    q_stride_h,
    bt_stride,
    scale,
    softcap,
    window,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    TILE_N: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    USE_SOFTCAP: tl.constexpr,
    F32: tl.constexpr,
):
    pid = tl.program_id(0)
    kv_head = tl.program_id(1)
    r = _find_request(q_start_ptr, pid, n_requests, BLOCK_Q)
    q_begin = tl.load(q_start_ptr + r)
    q_len = tl.load(q_start_ptr + r + 1) - q_begin
    q_block = pid - (q_begin // BLOCK_Q + r)
    if q_block * BLOCK_Q >= q_len:  # a spare block of the upper-bound grid
        return
    seq_len = tl.load(seq_lens_ptr + r)
    first_pos = seq_len - q_len + q_block * BLOCK_Q  # the queries are the last q_len positions

    m = tl.arange(0, BLOCK_M)
    q_idx = q_block * BLOCK_Q + m // GROUP
    head = kv_head * GROUP + m % GROUP
    row_ok = (m // GROUP < BLOCK_Q) & (q_idx < q_len)
    pos = seq_len - q_len + q_idx
    d = tl.arange(0, D_PAD)
    d_ok = d < HEAD_DIM
    tok = (q_begin + q_idx).to(tl.int64)
    q_mask = row_ok[:, None] & d_ok[None, :]
    q = tl.load(q_ptr + tok[:, None] * q_stride_t + head[:, None] * q_stride_h + d[None, :], mask=q_mask, other=0.0)
    # the interpreter cannot do bf16 arithmetic, and float32 models want exact (not tf32) products
    if F32:
        q = q.to(tl.float32)

    # keys any row of this block sees: [lo, hi)
    hi = tl.minimum(seq_len, first_pos + BLOCK_Q)
    lo = 0
    if USE_WINDOW:
        lo = tl.maximum(first_pos - window + 1, 0)

    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)  # finite: a fully masked row never computes inf - inf
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D_PAD], tl.float32)
    table = block_tables_ptr + r.to(tl.int64) * bt_stride
    for start in range(lo - lo % TILE_N, hi, TILE_N):
        j = start + tl.arange(0, TILE_N)
        j_ok = (j >= lo) & (j < hi)
        block = tl.load(table + j // BLOCK_SIZE, mask=j_ok, other=0).to(tl.int64)
        slot = ((block * BLOCK_SIZE + j % BLOCK_SIZE) * n_kv_heads + kv_head) * HEAD_DIM
        kv_mask = j_ok[None, :] & d_ok[:, None]
        k = tl.load(k_cache_ptr + slot[None, :] + d[:, None], mask=kv_mask, other=0.0)  # [D_PAD, TILE_N]
        v = tl.load(v_cache_ptr + slot[:, None] + d[None, :], mask=j_ok[:, None] & d_ok[None, :], other=0.0)
        if F32:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        else:
            k = k.to(q.dtype)
            v = v.to(q.dtype)
        s = tl.dot(q, k, input_precision="ieee" if F32 else None) * scale  # [BLOCK_M, TILE_N]
        if USE_SOFTCAP:
            s = softcap * tanh(s / softcap)
        see = row_ok[:, None] & j_ok[None, :] & (j[None, :] <= pos[:, None])
        if USE_WINDOW:
            see = see & (j[None, :] > pos[:, None] - window)
        s = tl.where(see, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee" if F32 else None)
        m_i = m_new
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    out_off = (tok[:, None] * (n_kv_heads * GROUP) + head[:, None]) * HEAD_DIM + d[None, :]
    tl.store(out_ptr + out_off, round_to(out, out_ptr.dtype.element_ty), mask=q_mask)


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    metadata: AttentionMetadata,
    scale: float,
    softcap: float | None = None,
) -> torch.Tensor:
    """Causal attention of q [T, H, D] over caches [B, S, Hkv, D] for the batch in ``metadata``; [T, H, D]."""
    op = "paged_attention"
    if q.dim() != 3 or k_cache.dim() != 4:
        raise ValueError(
            f"{op}: q must be [T, H, D] and k_cache [B, S, Hkv, D], got {list(q.shape)} and {list(k_cache.shape)}"
        )
    tokens, heads, head_dim = q.shape
    _, block_size, kv_heads, _ = k_cache.shape
    check_shape(op, "k_cache", k_cache, (None, None, kv_heads, head_dim))
    check_shape(op, "v_cache", v_cache, tuple(k_cache.shape))
    if heads % kv_heads:
        raise ValueError(f"{op}: query heads ({heads}) must be a multiple of KV heads ({kv_heads})")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError(f"{op}: k_cache and v_cache must be contiguous")
    requests = metadata.seq_lens.shape[0]
    check_shape(op, "query_start_loc", metadata.query_start_loc, (requests + 1,))
    check_shape(op, "block_tables", metadata.block_tables, (requests, None))
    for name in ("query_start_loc", "seq_lens", "block_tables"):
        if getattr(metadata, name).dtype not in (torch.int32, torch.int64):
            raise ValueError(f"{op}: metadata.{name} must be int32 or int64")
    if metadata.sliding_window is not None and metadata.sliding_window < 1:
        raise ValueError(f"{op}: sliding_window must be >= 1, got {metadata.sliding_window}")
    check_float(op, q=q, k_cache=k_cache, v_cache=v_cache)
    device = check_tensors(
        op,
        q=q,
        k_cache=k_cache,
        v_cache=v_cache,
        query_start_loc=metadata.query_start_loc,
        seq_lens=metadata.seq_lens,
        block_tables=metadata.block_tables,
    )
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if not tokens or not requests:
        return out
    group = heads // kv_heads
    group_pad = triton.next_power_of_2(group)
    # One tile shape for every batch: a row's products are then summed in the same order whether it
    # is a decode or in a prefill chunk, alone or batched (16 rows would suit decodes better, 64
    # amortise each K/V tile over a prefill chunk's rows; a shape chosen per batch changed tokens).
    block_m = max(64, group_pad)
    block_q = block_m // group
    d_pad = max(16, triton.next_power_of_2(head_dim))
    tile_n = 64 if d_pad <= 128 else 32
    grid = (tokens // block_q + requests, kv_heads)
    _paged_attention_kernel[grid](
        q,
        k_cache,
        v_cache,
        out,
        metadata.query_start_loc,
        metadata.seq_lens,
        metadata.block_tables,
        requests,
        kv_heads,
        q.stride(0),
        q.stride(1),
        metadata.block_tables.stride(0),
        scale,
        softcap or 0.0,
        metadata.sliding_window or 0,
        GROUP=group,
        HEAD_DIM=head_dim,
        D_PAD=d_pad,
        BLOCK_SIZE=block_size,
        BLOCK_M=block_m,
        BLOCK_Q=block_q,
        TILE_N=tile_n,
        USE_WINDOW=metadata.sliding_window is not None,
        USE_SOFTCAP=softcap is not None,
        F32=device.type == "cpu" or q.dtype == torch.float32,
    )
    return out
