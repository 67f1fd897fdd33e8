"""Building blocks of models on the paged KV cache.

Every tensor op that a kernel set may speed up goes through ``self.kernels``
(a :class:`llmp.api.KernelSet`); the rest is plain ``torch.nn``. Layers built
under ``torch.device("meta")`` allocate nothing until the runner moves them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

from llmp.api import AttentionMetadata, KernelSet
from llmp.modeling.files import ModelLoadError
from llmp.modeling.rope import cos_sin_table


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, kernels: KernelSet) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps
        self.kernels = kernels

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> Any:
        """``norm(x)``, or with ``residual`` the pair ``(norm(x + residual), x + residual)``."""
        return self.kernels.rms_norm(x, self.weight, self.eps, residual)


class RotaryEmbedding(nn.Module):
    """Rotates q and k by position; the cos/sin table is built on first use on the input's device."""

    def __init__(
        self, rotary_dim: int, max_positions: int, base: float, scaling: Mapping[str, Any] | None, kernels: KernelSet
    ) -> None:
        super().__init__()
        self.rotary_dim, self.max_positions, self.base, self.scaling = rotary_dim, max_positions, base, scaling
        self.kernels = kernels
        self._table: torch.Tensor | None = None

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self._table is None or self._table.device != q.device:
            table = cos_sin_table(self.rotary_dim, self.max_positions, self.base, self.scaling)
            self._table = table.to(q.device)
        return self.kernels.rotary(positions, q, k, self._table)


class PagedAttention(nn.Module):
    """Writes this step's k/v into the layer's cache blocks, then attends over the cache.

    The model runner sets ``kv_cache`` to this layer's ``(k_cache, v_cache)``,
    each ``[num_blocks, block_size, num_kv_heads, head_dim]``.
    """

    def __init__(
        self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float, kernels: KernelSet,
        sliding_window: int | None = None,
    ) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = scale
        self.sliding_window = sliding_window
        self.kernels = kernels
        self.kv_cache: tuple[torch.Tensor, torch.Tensor] | None = None

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, metadata: AttentionMetadata) -> torch.Tensor:
        # q: [T, H, D]; k, v: [T, Hkv, D] -> [T, H * D]
        if self.kv_cache is None:
            raise RuntimeError("PagedAttention has no KV cache: the model runner binds one before the first step")
        k_cache, v_cache = self.kv_cache
        self.kernels.write_kv(k, v, k_cache, v_cache, metadata.slot_mapping)
        if self.sliding_window != metadata.sliding_window:
            metadata = _with_window(metadata, self.sliding_window)
        out = self.kernels.paged_attention(q, k_cache, v_cache, metadata, self.scale)
        return out.reshape(q.shape[0], self.num_heads * self.head_dim)


def _with_window(metadata: AttentionMetadata, window: int | None) -> AttentionMetadata:
    return AttentionMetadata(
        metadata.query_start_loc, metadata.seq_lens, metadata.block_tables, metadata.slot_mapping,
        metadata.max_query_len, metadata.max_seq_len, window,
    )


class MergedLinear(nn.Linear):
    """One matmul for several checkpoint matrices stacked along the output dim (q|k|v, gate|up)."""

    def __init__(self, in_features: int, shard_sizes: Mapping[str, int], bias: bool) -> None:
        super().__init__(in_features, sum(shard_sizes.values()), bias=bias)
        self.shard_offsets: dict[str, tuple[int, int]] = {}
        offset = 0
        for shard, size in shard_sizes.items():
            self.shard_offsets[shard] = (offset, size)
            offset += size

    def load_shard(self, shard: str, param_name: str, tensor: torch.Tensor) -> None:
        offset, size = self.shard_offsets[shard]
        target = getattr(self, param_name).data.narrow(0, offset, size)
        _copy_checked(target, tensor, f"{shard} shard of {param_name}")


class GatedMLP(nn.Module):
    """``down(act(gate(x)) * up(x))`` with gate and up fused into one matmul."""

    def __init__(self, hidden: int, intermediate: int, bias: bool, kernels: KernelSet) -> None:
        super().__init__()
        self.gate_up_proj = MergedLinear(hidden, {"gate": intermediate, "up": intermediate}, bias=bias)
        self.down_proj = nn.Linear(intermediate, hidden, bias=bias)
        self.kernels = kernels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.kernels.silu_and_mul(self.gate_up_proj(x)))


class CausalLM(nn.Module):
    """Shared behaviour of the causal LMs built from these layers.

    Subclasses set ``model`` (with ``embed_tokens``), ``lm_head`` and
    ``stacked_params`` (checkpoint name part -> (fused name part, shard)).
    """

    stacked_params: Mapping[str, tuple[str, str]] = {
        ".q_proj.": (".qkv_proj.", "q"),
        ".k_proj.": (".qkv_proj.", "k"),
        ".v_proj.": (".qkv_proj.", "v"),
        ".gate_proj.": (".gate_up_proj.", "gate"),
        ".up_proj.": (".gate_up_proj.", "up"),
    }
    ignored_weights: tuple[str, ...] = ("rotary_emb.inv_freq",)
    tie_word_embeddings: bool = False

    def tie_weights(self) -> None:
        """Share the input embedding with the LM head (again, after ``to_empty`` split them)."""
        if self.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def attention_layers(self) -> list[PagedAttention]:
        """The layers that need a KV cache, in order."""
        return [m for m in self.modules() if isinstance(m, PagedAttention)]

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        tied = self.lm_head.weight is self.model.embed_tokens.weight
        for name, tensor in weights:
            if any(part in name for part in self.ignored_weights) or (tied and name == "lm_head.weight"):
                continue
            for part, (fused, shard) in self.stacked_params.items():
                if part in name:
                    target = name.replace(part, fused)
                    module_name, param_name = target.rsplit(".", 1)
                    self.get_submodule(module_name).load_shard(shard, param_name, tensor)
                    loaded.add(f"{target}:{shard}")
                    break
            else:
                if name not in params:
                    raise ModelLoadError(f"checkpoint weight {name!r} has no place in {type(self).__name__}")
                _copy_checked(params[name].data, tensor, name)
                loaded.add(name)
        expected = set()
        for name, param in params.items():
            module_name, param_name = name.rsplit(".", 1)
            module = self.get_submodule(module_name)
            shards = getattr(module, "shard_offsets", None)
            expected |= {f"{name}:{s}" for s in shards} if shards else {name}
        missing = sorted(expected - loaded)
        if missing:
            shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
            raise ModelLoadError(f"checkpoint lacks weights of {type(self).__name__}: {shown}")


def _copy_checked(target: torch.Tensor, tensor: torch.Tensor, name: str) -> None:
    if target.shape != tensor.shape:
        raise ModelLoadError(f"weight {name} has shape {tuple(tensor.shape)}, the model expects {tuple(target.shape)}")
    target.copy_(tensor)
