"""Multi-LoRA shrink and expand (vLLM's punica kernels), segmented by adapter slot.

``mapping.rows`` lists the rows with a slot grouped by slot, so each program works on one group: a
tile of its rows against its slot's A (shrink) or B (expand), with float32 accumulators. The grid is
(group, row block, column block). Tile shapes depend only on the weights' shapes, never on the batch,
so a row's products are summed in the same order alone or beside other rows and adapters.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from llmp.api import LoRAMapping
from llmp_kernels_triton._common import check_float, check_shape, check_tensors, round_to

BLOCK_M = 32  # rows of a group per program
BLOCK_K = 64  # shrink: input columns per step of the reduction
BLOCK_N = 64  # expand: output columns per program


@triton.jit
def _lora_shrink_kernel(
    x_ptr,
    a_ptr,
    s_ptr,
    rows_ptr,
    starts_ptr,
    slots_ptr,
    n_in,
    rank,
    x_stride,
    a_stride_l,
    a_stride_r,
    BLOCK_M: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
    F32: tl.constexpr,
):
    group, block = tl.program_id(0), tl.program_id(1)
    start, end = tl.load(starts_ptr + group), tl.load(starts_ptr + group + 1)
    first = start + block * BLOCK_M
    if first < end:
        slot = tl.load(slots_ptr + group).to(tl.int64)
        j = first + tl.arange(0, BLOCK_M)  # positions in mapping.rows (and rows of s)
        row_ok = j < end
        rows = tl.load(rows_ptr + j, mask=row_ok, other=0).to(tl.int64)
        r = tl.arange(0, BLOCK_R)
        acc = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
        for k0 in range(0, n_in, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            x = tl.load(
                x_ptr + rows[:, None] * x_stride + k[None, :], mask=row_ok[:, None] & (k[None, :] < n_in), other=0.0
            )
            a = tl.load(
                a_ptr + slot * a_stride_l + r[None, :] * a_stride_r + k[:, None],
                mask=(r[None, :] < rank) & (k[:, None] < n_in),
                other=0.0,
            )  # [BLOCK_K, BLOCK_R]: A[slot].T
            if F32:  # the interpreter cannot do bf16 arithmetic, and float32 models want exact (not tf32) products
                x, a = x.to(tl.float32), a.to(tl.float32)
            acc += tl.dot(x, a, input_precision="ieee" if F32 else None)
        tl.store(
            s_ptr + j[:, None].to(tl.int64) * rank + r[None, :],
            round_to(acc, s_ptr.dtype.element_ty),
            mask=row_ok[:, None] & (r[None, :] < rank),
        )


@triton.jit
def _lora_expand_kernel(
    y_ptr,
    s_ptr,
    b_ptr,
    rows_ptr,
    starts_ptr,
    slots_ptr,
    n_out,
    rank,
    y_stride,
    b_stride_l,
    b_stride_o,
    BLOCK_M: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    F32: tl.constexpr,
):
    group, block, col_block = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    start, end = tl.load(starts_ptr + group), tl.load(starts_ptr + group + 1)
    first = start + block * BLOCK_M
    if first < end:
        slot = tl.load(slots_ptr + group).to(tl.int64)
        j = first + tl.arange(0, BLOCK_M)
        row_ok = j < end
        rows = tl.load(rows_ptr + j, mask=row_ok, other=0).to(tl.int64)
        r = tl.arange(0, BLOCK_R)
        n = col_block * BLOCK_N + tl.arange(0, BLOCK_N)
        s = tl.load(
            s_ptr + j[:, None].to(tl.int64) * rank + r[None, :], mask=row_ok[:, None] & (r[None, :] < rank), other=0.0
        )
        b = tl.load(
            b_ptr + slot * b_stride_l + n[None, :] * b_stride_o + r[:, None],
            mask=(n[None, :] < n_out) & (r[:, None] < rank),
            other=0.0,
        )  # [BLOCK_R, BLOCK_N]: B[slot].T
        if F32:
            s, b = s.to(tl.float32), b.to(tl.float32)
        delta = tl.dot(s, b, input_precision="ieee" if F32 else None)
        # as the reference: the product rounded to y's dtype, then added to y and rounded again
        delta = round_to(delta, y_ptr.dtype.element_ty).to(tl.float32)
        mask = row_ok[:, None] & (n[None, :] < n_out)
        y_at = y_ptr + rows[:, None] * y_stride + n[None, :]
        y = tl.load(y_at, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_at, round_to(y + delta, y_ptr.dtype.element_ty), mask=mask)


class _Groups:
    """Group start offsets [G + 1] and slots [G] on the device, and the largest group, for the mapping
    seen last: every adapted layer of a forward call shares it, so they are copied to the device once."""

    def __init__(self) -> None:
        self.mapping: LoRAMapping | None = None
        self.value: tuple[torch.Tensor, torch.Tensor, int] | None = None

    def get(self, mapping: LoRAMapping, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, int]:
        if mapping is not self.mapping or self.value is None or self.value[0].device != device:
            starts = [0]
            for size in mapping.group_sizes:
                starts.append(starts[-1] + size)
            self.mapping = mapping
            self.value = (
                torch.tensor(starts, dtype=torch.int32, device=device),
                torch.tensor(mapping.group_slots, dtype=torch.int32, device=device),
                max(mapping.group_sizes, default=0),
            )
        return self.value


_groups = _Groups()


def _block_r(rank: int) -> int:
    return max(16, triton.next_power_of_2(rank))  # tl.dot needs 16 or more


def lora_shrink(x: torch.Tensor, a: torch.Tensor, mapping: LoRAMapping) -> torch.Tensor:
    """``s[j] = x[rows[j]] @ a[slot(j)].T``: x [T, in], a [L, R, in] -> s [N, R] in x's dtype."""
    op = "lora_shrink"
    check_shape(op, "a", a, (None, None, x.shape[-1]))
    check_float(op, x=x, a=a)
    device = check_tensors(op, x=x, a=a, rows=mapping.rows)
    rank = a.shape[1]
    s = torch.empty(mapping.rows.shape[0], rank, dtype=x.dtype, device=device)
    starts, slots, largest = _groups.get(mapping, device)
    if largest:
        _lora_shrink_kernel[(len(mapping.group_slots), triton.cdiv(largest, BLOCK_M))](
            x,
            a,
            s,
            mapping.rows,
            starts,
            slots,
            x.shape[1],
            rank,
            x.stride(0),
            a.stride(0),
            a.stride(1),
            BLOCK_M=BLOCK_M,
            BLOCK_R=_block_r(rank),
            BLOCK_K=BLOCK_K,
            F32=device.type == "cpu" or x.dtype == torch.float32,
        )
    return s


def lora_expand(y: torch.Tensor, s: torch.Tensor, b: torch.Tensor, mapping: LoRAMapping) -> None:
    """``y[rows[j]] += s[j] @ b[slot(j)].T`` in place: y [T, out], s [N, R], b [L, out, R]."""
    op = "lora_expand"
    rank = s.shape[1]
    check_shape(op, "s", s, (mapping.rows.shape[0], None))
    check_shape(op, "b", b, (None, y.shape[-1], rank))
    check_float(op, y=y, s=s, b=b)
    device = check_tensors(op, y=y, s=s, b=b, rows=mapping.rows)
    s = s.contiguous()
    starts, slots, largest = _groups.get(mapping, device)
    if largest:
        grid = (len(mapping.group_slots), triton.cdiv(largest, BLOCK_M), triton.cdiv(y.shape[1], BLOCK_N))
        _lora_expand_kernel[grid](
            y,
            s,
            b,
            mapping.rows,
            starts,
            slots,
            y.shape[1],
            rank,
            y.stride(0),
            b.stride(0),
            b.stride(1),
            BLOCK_M=BLOCK_M,
            BLOCK_R=_block_r(rank),
            BLOCK_N=BLOCK_N,
            F32=device.type == "cpu" or y.dtype == torch.float32,
        )
