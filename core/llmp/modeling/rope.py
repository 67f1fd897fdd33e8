"""Rotary-embedding tables (``cos | sin`` rows by position), Llama-3 scaling included."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["cos_sin_table", "inverse_frequencies"]


def inverse_frequencies(rotary_dim: int, base: float, scaling: Mapping[str, Any] | None = None) -> torch.Tensor:
    """Per-pair inverse frequencies [rotary_dim / 2], with ``rope_scaling`` applied."""
    # float32 throughout, as Hugging Face computes it, so positions rotate by the same angles
    inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim))
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if kind in (None, "default"):
        return inv_freq
    if kind == "linear":
        return inv_freq / scaling["factor"]
    if kind == "llama3":
        return _llama3(inv_freq, scaling)
    raise ValueError(f"rope_scaling type {kind!r} is not supported; supported: default, linear, llama3")


def _llama3(inv_freq: torch.Tensor, scaling: Mapping[str, Any]) -> torch.Tensor:
    # Long wavelengths are slowed by `factor`, short ones kept, the band between interpolated.
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_context = scaling["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_context / low, old_context / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low) / (high - low)
    interpolated = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(is_medium, interpolated, scaled)


def cos_sin_table(
    rotary_dim: int, max_positions: int, base: float, scaling: Mapping[str, Any] | None = None
) -> torch.Tensor:
    """``[max_positions, rotary_dim]`` float32: cos of each pair's angle, then sin."""
    inv_freq = inverse_frequencies(rotary_dim, base, scaling)
    angles = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
    return torch.cat((angles.cos(), angles.sin()), dim=-1)
