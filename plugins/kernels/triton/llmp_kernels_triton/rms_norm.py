"""RMSNorm with an optional fused residual add, several rows per program."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from llmp_kernels_triton._common import check_float, check_tensors, round_to


@triton.jit(do_not_specialize=["n_rows"])
def _rms_norm_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    out_ptr,
    sum_ptr,
    n_rows,
    n_cols,
    x_stride,
    res_stride,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    rows = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    x = tl.load(x_ptr + rows[:, None] * x_stride + cols[None, :], mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + rows[:, None] * res_stride + cols[None, :], mask=mask, other=0.0)
        # rounded to x's dtype like torch's `x + residual`; added in float32 (bf16 arithmetic breaks the interpreter)
        x = round_to(x.to(tl.float32) + r.to(tl.float32), x_ptr.dtype.element_ty)
        tl.store(sum_ptr + rows[:, None] * n_cols + cols[None, :], x, mask=mask)
    x32 = x.to(tl.float32)
    inv_rms = 1.0 / tl.sqrt_rn(tl.sum(x32 * x32, axis=1) / n_cols + eps)
    # the reference rounds the normalised value to x's dtype before the weight multiplies it
    normed = round_to(x32 * inv_rms[:, None], x_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
    tl.store(
        out_ptr + rows[:, None] * n_cols + cols[None, :],
        round_to(normed * w[None, :], out_ptr.dtype.element_ty),
        mask=mask,
    )


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """x [..., N] (leading dims flattened); with ``residual`` returns ``(norm(x + residual), x + residual)``."""
    op = "rms_norm"
    n = x.shape[-1]
    if weight.shape != (n,):
        raise ValueError(f"{op}: weight must have shape [{n}], got {list(weight.shape)}")
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(
            f"{op}: residual must match x (shape {list(x.shape)}, {x.dtype}), "
            f"got {list(residual.shape)}, {residual.dtype}"
        )
    check_float(op, x=x, weight=weight)
    x2, weight = x.reshape(-1, n), weight.contiguous()
    r2 = x2 if residual is None else residual.reshape(-1, n)  # without a residual: an unused stand-in
    check_tensors(op, x=x2, weight=weight, residual=r2)
    out = torch.empty(x.shape, dtype=torch.promote_types(weight.dtype, x.dtype), device=x.device)
    summed = torch.empty(x.shape, dtype=x.dtype, device=x.device) if residual is not None else out
    rows = x2.shape[0]
    block = triton.next_power_of_2(n)
    per_program = max(1, min(16, 2048 // block))  # small rows (q/k norms) share a program
    grid = (triton.cdiv(rows, per_program),)
    if rows:
        _rms_norm_kernel[grid](
            x2,
            r2,
            weight,
            out,
            summed,
            rows,
            n,
            x2.stride(0),
            r2.stride(0),
            eps,
            HAS_RESIDUAL=residual is not None,
            ROWS=per_program,
            BLOCK=block,
            num_warps=min(16, max(1, block * per_program // 256)),
        )
    return out if residual is None else (out, summed)
