"""Gated activations: ``act(x[..., :d]) * x[..., d:]`` for SiLU and tanh-GELU."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from llmp_kernels_triton._common import check_float, check_tensors, round_to


@triton.jit
def tanh(x):
    # 2 * sigmoid(2x) - 1: exp-only (no libdevice call, so the interpreter runs it); the clamp keeps exp
    # finite (tanh is +-1 in float32 well before |x| = 40)
    return 2.0 / (1.0 + tl.exp(tl.minimum(-2.0 * x, 80.0))) - 1.0


@triton.jit
def _gated_kernel(x_ptr, out_ptr, d, x_stride, GELU: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < d
    gate = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * x_stride + d + cols, mask=mask, other=0.0)
    if GELU:
        act = 0.5 * gate * (1.0 + tanh(0.7978845608028654 * (gate + 0.044715 * gate * gate * gate)))
    else:
        act = gate / (1.0 + tl.exp(tl.minimum(-gate, 80.0)))  # clamped: silu(x < -80) is 0 either way
    # rounded to the input dtype before the multiply, as torch's `act(gate) * up` is
    dtype = out_ptr.dtype.element_ty
    tl.store(
        out_ptr + row * d + cols, round_to(round_to(act, dtype).to(tl.float32) * up.to(tl.float32), dtype), mask=mask
    )


def _gated(op: str, x: torch.Tensor, gelu: bool) -> torch.Tensor:
    if x.shape[-1] % 2:
        raise ValueError(f"{op}: the last dimension of x must be even (gate | up), got {list(x.shape)}")
    check_float(op, x=x)
    d = x.shape[-1] // 2
    x2 = x.reshape(-1, 2 * d)
    check_tensors(op, x=x2)
    out = torch.empty((*x.shape[:-1], d), dtype=x.dtype, device=x.device)
    block = min(1024, triton.next_power_of_2(d))
    if x2.shape[0] and d:
        _gated_kernel[(x2.shape[0], triton.cdiv(d, block))](x2, out, d, x2.stride(0), GELU=gelu, BLOCK=block)
    return out


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [..., 2d] -> [..., d]."""
    return _gated("silu_and_mul", x, gelu=False)


def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [..., 2d] -> [..., d] (Gemma's gated MLP)."""
    return _gated("gelu_tanh_and_mul", x, gelu=True)
