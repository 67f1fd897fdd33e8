"""Checks shared by the launchers: clear ``ValueError``s instead of Triton's opaque failures."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Read once, before any kernel module is decorated: @triton.jit picks the interpreter at decoration time.
INTERPRET: bool = bool(triton.knobs.runtime.interpret)
_ROUND_BF16 = tl.constexpr(INTERPRET)


@triton.jit
def round_to(x, dtype: tl.constexpr):
    """float32 ``x`` cast to ``dtype``, rounding to nearest even like torch and the GPU do.

    The interpreter truncates float32 -> bfloat16 casts, so there the rounding is done on the bits first.
    """
    if _ROUND_BF16 and dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        x = bits.to(tl.float32, bitcast=True)
    return x.to(dtype)


FLOATS = (torch.float32, torch.float16, torch.bfloat16)


def check_tensors(op: str, **tensors: torch.Tensor) -> torch.device:
    """Same device for all; CPU only under the interpreter; unit stride in the last dimension."""
    devices = {t.device for t in tensors.values()}
    if len(devices) != 1:
        raise ValueError(
            f"{op}: tensors are on different devices: " + ", ".join(f"{n}={t.device}" for n, t in tensors.items())
        )
    device = devices.pop()
    if device.type == "cpu" and not INTERPRET:
        raise ValueError(
            f"{op}: CPU tensors need Triton's interpreter (set TRITON_INTERPRET=1 before importing "
            "triton); use the torch kernel set on CPU"
        )
    for name, t in tensors.items():
        if t.dim() and t.stride(-1) != 1:
            raise ValueError(f"{op}: {name} must be contiguous in its last dimension, got strides {t.stride()}")
    return device


def check_float(op: str, **tensors: torch.Tensor) -> None:
    for name, t in tensors.items():
        if t.dtype not in FLOATS:
            raise ValueError(f"{op}: {name} must be float32, float16 or bfloat16, got {t.dtype}")


def check_shape(op: str, name: str, t: torch.Tensor, expected: tuple[int | None, ...]) -> None:
    """``expected`` holds a size or ``None`` (any) per dimension."""
    if t.dim() != len(expected) or any(e is not None and s != e for s, e in zip(t.shape, expected)):
        want = "[" + ", ".join("*" if e is None else str(e) for e in expected) + "]"
        raise ValueError(f"{op}: {name} must have shape {want}, got {list(t.shape)}")
