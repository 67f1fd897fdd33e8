"""Paged attention for a mixed batch of prefill chunks and decodes.

Grid: (query blocks, KV heads). A program takes ``BLOCK_Q`` consecutive query
rows of one request and the ``GROUP`` query heads sharing one KV head, packed
as ``BLOCK_M = BLOCK_Q * GROUP`` rows (GQA: each K/V tile is loaded once for
the whole group). It walks the request's keys in tiles of ``TILE_N`` positions,
looking each position's physical block up in the block table, with an online
softmax. Keys outside [window start, causal end) are never loaded, so slots that
were never written (garbage, NaN) cannot reach the output.

The keys are summed in segments of ``SEGMENT`` positions (fixed, from key 0):
each segment's softmax state is computed alone and merged into the row's total
in segment order. A decode (one query row) over a long context then splits
across programs, one per segment (``_decode_segment_kernel``), with the merge
done by ``_decode_merge_kernel``: the same arithmetic in the same order, so a
position's output is bit for bit the same whichever path computed it, and the
host may choose the split per batch (few programs for the GPU's
multiprocessors: a handful of long decodes) without changing any token.
"""

from __future__ import annotations

import functools

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


# keys per segment (a multiple of every TILE_N); tests lower it to reach several segments on tiny shapes
SEGMENT = 512
# None: split long decodes when the main grid leaves the multiprocessors idle; True / False force it
SPLIT_DECODES: bool | None = None
# Triton launch options of the attention kernels (num_warps, num_stages); empty: Triton's defaults
LAUNCH: dict[str, int] = {}
# Integers that follow the batch are not specialised on (do_not_specialize): Triton would compile a
# variant for a value of 1 and for multiples of 16 at the first batch of each kind, mid-serving (on an
# H200, 2026-12-04, the first lone request after a batched run took 0.5-0.9 s more than the next).
NO_SCORE = tl.constexpr(-1.0e30)  # finite: a fully masked row never computes inf - inf


@triton.jit
def _attend_segment(
    q,
    k_cache_ptr,
    v_cache_ptr,
    table,
    seg_lo,
    lo,
    hi,
    pos,
    row_ok,
    kv_head,
    n_kv_heads,
    scale,
    softcap,
    window,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    TILE_N: tl.constexpr,
    SEG: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    USE_SOFTCAP: tl.constexpr,
    F32: tl.constexpr,
):
    """Online-softmax state (max, sum, weighted values) of the rows over keys [seg_lo, seg_lo + SEG) & [lo, hi)."""
    d = tl.arange(0, D_PAD)
    d_ok = d < HEAD_DIM
    m_i = tl.full([BLOCK_M], NO_SCORE, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D_PAD], tl.float32)
    for start in range(tl.maximum(seg_lo, lo - lo % TILE_N), tl.minimum(seg_lo + SEG, hi), TILE_N):
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
    return m_i, l_i, acc


@triton.jit
def _merge(m_t, l_t, acc_t, m_s, l_s, acc_s):
    """A segment's state merged into the running total (a first segment is taken exactly as it is)."""
    m_new = tl.maximum(m_t, m_s)
    a = tl.exp(m_t - m_new)
    b = tl.exp(m_s - m_new)
    return m_new, l_t * a + l_s * b, acc_t * a[:, None] + acc_s * b[:, None]


@triton.jit
def _load_rows(
    q_ptr,
    q_start_ptr,
    seq_lens_ptr,
    r,
    q_block,
    kv_head,
    q_stride_t,
    q_stride_h,
    window,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    F32: tl.constexpr,
):
    """The rows of query block ``q_block`` of request ``r``: q, their positions and the keys they see, [lo, hi)."""
    q_begin = tl.load(q_start_ptr + r)
    q_len = tl.load(q_start_ptr + r + 1) - q_begin
    seq_len = tl.load(seq_lens_ptr + r)
    first_pos = seq_len - q_len + q_block * BLOCK_Q  # the queries are the last q_len positions
    m = tl.arange(0, BLOCK_M)
    q_idx = q_block * BLOCK_Q + m // GROUP
    head = kv_head * GROUP + m % GROUP
    row_ok = (m // GROUP < BLOCK_Q) & (q_idx < q_len)
    pos = seq_len - q_len + q_idx
    d = tl.arange(0, D_PAD)
    tok = (q_begin + q_idx).to(tl.int64)
    q_mask = row_ok[:, None] & (d < HEAD_DIM)[None, :]
    q = tl.load(q_ptr + tok[:, None] * q_stride_t + head[:, None] * q_stride_h + d[None, :], mask=q_mask, other=0.0)
    # the interpreter cannot do bf16 arithmetic, and float32 models want exact (not tf32) products
    if F32:
        q = q.to(tl.float32)
    hi = tl.minimum(seq_len, first_pos + BLOCK_Q)  # keys any row of this block sees: [lo, hi)
    lo = 0
    if USE_WINDOW:
        lo = tl.maximum(first_pos - window + 1, 0)
    return q, tok, head, row_ok, pos, q_mask, lo, hi


@triton.jit(do_not_specialize=["n_requests", "bt_stride"])
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
    SEG: tl.constexpr,
    SKIP_DECODES: tl.constexpr,
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
    if SKIP_DECODES and q_len == 1:  # the split decode kernels compute it
        return
    q, tok, head, row_ok, pos, q_mask, lo, hi = _load_rows(
        q_ptr, q_start_ptr, seq_lens_ptr, r, q_block, kv_head, q_stride_t, q_stride_h, window,
        GROUP, HEAD_DIM, D_PAD, BLOCK_M, BLOCK_Q, USE_WINDOW, F32,
    )  # fmt: skip
    table = block_tables_ptr + r.to(tl.int64) * bt_stride
    m_t = tl.full([BLOCK_M], NO_SCORE, tl.float32)
    l_t = tl.zeros([BLOCK_M], tl.float32)
    acc_t = tl.zeros([BLOCK_M, D_PAD], tl.float32)
    for seg_lo in range(lo - lo % SEG, hi, SEG):
        m_s, l_s, acc_s = _attend_segment(
            q, k_cache_ptr, v_cache_ptr, table, seg_lo, lo, hi, pos, row_ok, kv_head, n_kv_heads,
            scale, softcap, window, HEAD_DIM, D_PAD, BLOCK_SIZE, BLOCK_M, TILE_N, SEG, USE_WINDOW, USE_SOFTCAP, F32,
        )  # fmt: skip
        m_t, l_t, acc_t = _merge(m_t, l_t, acc_t, m_s, l_s, acc_s)
    out = acc_t / tl.where(l_t == 0.0, 1.0, l_t)[:, None]
    d = tl.arange(0, D_PAD)
    out_off = (tok[:, None] * (n_kv_heads * GROUP) + head[:, None]) * HEAD_DIM + d[None, :]
    tl.store(out_ptr + out_off, round_to(out, out_ptr.dtype.element_ty), mask=q_mask)


@triton.jit(do_not_specialize=["n_segments", "bt_stride"])
def _decode_segment_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    part_m_ptr,
    part_l_ptr,
    part_acc_ptr,
    q_start_ptr,
    seq_lens_ptr,
    block_tables_ptr,
    n_kv_heads,
    n_segments,
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
    SEG: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    USE_SOFTCAP: tl.constexpr,
    F32: tl.constexpr,
):
    """Grid (requests, KV heads, segments): one segment's state of one decode's rows, into the partials."""
    r = tl.program_id(0)
    kv_head = tl.program_id(1)
    seg = tl.program_id(2)
    if tl.load(q_start_ptr + r + 1) - tl.load(q_start_ptr + r) != 1:
        return
    q, tok, head, row_ok, pos, q_mask, lo, hi = _load_rows(
        q_ptr, q_start_ptr, seq_lens_ptr, r, 0, kv_head, q_stride_t, q_stride_h, window,
        GROUP, HEAD_DIM, D_PAD, BLOCK_M, BLOCK_Q, USE_WINDOW, F32,
    )  # fmt: skip
    seg_lo = seg * SEG
    if seg_lo < lo - lo % SEG or seg_lo >= hi:  # the merge reads only the segments holding keys
        return
    table = block_tables_ptr + r.to(tl.int64) * bt_stride
    m_s, l_s, acc_s = _attend_segment(
        q, k_cache_ptr, v_cache_ptr, table, seg_lo, lo, hi, pos, row_ok, kv_head, n_kv_heads,
        scale, softcap, window, HEAD_DIM, D_PAD, BLOCK_SIZE, BLOCK_M, TILE_N, SEG, USE_WINDOW, USE_SOFTCAP, F32,
    )  # fmt: skip
    row = (r.to(tl.int64) * n_segments + seg) * (n_kv_heads * GROUP) + head  # [R, segments, H]
    d = tl.arange(0, D_PAD)
    tl.store(part_m_ptr + row, m_s, mask=row_ok)
    tl.store(part_l_ptr + row, l_s, mask=row_ok)
    tl.store(part_acc_ptr + row[:, None] * HEAD_DIM + d[None, :], acc_s, mask=q_mask)


@triton.jit(do_not_specialize=["n_segments"])
def _decode_merge_kernel(
    out_ptr,
    part_m_ptr,
    part_l_ptr,
    part_acc_ptr,
    q_start_ptr,
    seq_lens_ptr,
    n_kv_heads,
    n_segments,
    window,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    SEG: tl.constexpr,
    USE_WINDOW: tl.constexpr,
):
    """Grid (requests, KV heads): a decode's segments merged in order, as ``_paged_attention_kernel`` does."""
    r = tl.program_id(0)
    kv_head = tl.program_id(1)
    q_begin = tl.load(q_start_ptr + r)
    if tl.load(q_start_ptr + r + 1) - q_begin != 1:
        return
    seq_len = tl.load(seq_lens_ptr + r)
    lo = 0
    if USE_WINDOW:
        lo = tl.maximum(seq_len - window, 0)
    m = tl.arange(0, BLOCK_M)
    row_ok = m < GROUP
    head = kv_head * GROUP + m % GROUP
    d = tl.arange(0, D_PAD)
    mask = row_ok[:, None] & (d < HEAD_DIM)[None, :]
    m_t = tl.full([BLOCK_M], NO_SCORE, tl.float32)
    l_t = tl.zeros([BLOCK_M], tl.float32)
    acc_t = tl.zeros([BLOCK_M, D_PAD], tl.float32)
    for seg_lo in range(lo - lo % SEG, seq_len, SEG):
        row = (r.to(tl.int64) * n_segments + seg_lo // SEG) * (n_kv_heads * GROUP) + head
        m_s = tl.load(part_m_ptr + row, mask=row_ok, other=NO_SCORE)
        l_s = tl.load(part_l_ptr + row, mask=row_ok, other=0.0)
        acc_s = tl.load(part_acc_ptr + row[:, None] * HEAD_DIM + d[None, :], mask=mask, other=0.0)
        m_t, l_t, acc_t = _merge(m_t, l_t, acc_t, m_s, l_s, acc_s)
    out = acc_t / tl.where(l_t == 0.0, 1.0, l_t)[:, None]
    out_off = (q_begin.to(tl.int64) * (n_kv_heads * GROUP) + head[:, None]) * HEAD_DIM + d[None, :]
    tl.store(out_ptr + out_off, round_to(out, out_ptr.dtype.element_ty), mask=mask)


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
    n_segments = triton.cdiv(metadata.max_seq_len, SEGMENT)
    split = _split_decodes(device, tokens // block_q + requests, requests, kv_heads, n_segments, heads, head_dim)
    shapes = dict(GROUP=group, HEAD_DIM=head_dim, D_PAD=d_pad)
    tiles = dict(BLOCK_SIZE=block_size, BLOCK_M=block_m, BLOCK_Q=block_q, TILE_N=tile_n, SEG=SEGMENT)
    flags = dict(
        USE_WINDOW=metadata.sliding_window is not None,
        USE_SOFTCAP=softcap is not None,
        F32=device.type == "cpu" or q.dtype == torch.float32,
    )
    window = metadata.sliding_window or 0
    if not (split and metadata.max_query_len == 1):  # with the split, a batch of decodes needs no main grid
        _paged_attention_kernel[(tokens // block_q + requests, kv_heads)](
            q, k_cache, v_cache, out,
            metadata.query_start_loc, metadata.seq_lens, metadata.block_tables,
            requests, kv_heads, q.stride(0), q.stride(1), metadata.block_tables.stride(0),
            scale, softcap or 0.0, window,
            SKIP_DECODES=split, **shapes, **tiles, **flags, **LAUNCH,
        )  # fmt: skip
    if split:
        part_m = torch.empty((requests, n_segments, heads), dtype=torch.float32, device=q.device)
        part_l = torch.empty_like(part_m)
        part_acc = torch.empty((requests, n_segments, heads, head_dim), dtype=torch.float32, device=q.device)
        _decode_segment_kernel[(requests, kv_heads, n_segments)](
            q, k_cache, v_cache, part_m, part_l, part_acc,
            metadata.query_start_loc, metadata.seq_lens, metadata.block_tables,
            kv_heads, n_segments, q.stride(0), q.stride(1), metadata.block_tables.stride(0),
            scale, softcap or 0.0, window,
            **shapes, **tiles, **flags, **LAUNCH,
        )  # fmt: skip
        _decode_merge_kernel[(requests, kv_heads)](
            out, part_m, part_l, part_acc, metadata.query_start_loc, metadata.seq_lens,
            kv_heads, n_segments, window,
            BLOCK_M=max(16, group_pad), SEG=SEGMENT, USE_WINDOW=flags["USE_WINDOW"], **shapes,
        )  # fmt: skip
    return out


@functools.cache
def _multiprocessors(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _split_decodes(
    device: torch.device, programs: int, requests: int, kv_heads: int, segments: int, heads: int, head_dim: int
) -> bool:
    """Split decodes by key segment when the main grid does not fill one wave of the GPU's
    multiprocessors (a few long decodes) and the partial states fit in 256 MiB. The tokens do not
    depend on it: both paths do the same arithmetic. (H200, 2026-12-04: 8 decodes of 8192 keys
    on 8 KV heads, 64 programs, 19% of the copy bandwidth unsplit, 50% split; 32 of 1024 keys,
    272 programs, 51% unsplit, 35% split.)"""
    if SPLIT_DECODES is not None:
        return SPLIT_DECODES and segments > 1
    if segments < 2 or device.type != "cuda":
        return False
    partials = requests * segments * heads * (head_dim + 2) * 4
    index = device.index if device.index is not None else torch.cuda.current_device()
    return programs * kv_heads < _multiprocessors(index) and partials <= 256 << 20
