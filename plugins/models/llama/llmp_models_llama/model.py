"""``LlamaForCausalLM`` on the paged KV cache, loading Hugging Face checkpoints."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from llmp.api import AttentionMetadata, KernelSet
from llmp.modeling.layers import (
    CausalLM,
    GatedMLP,
    MergedLinear,
    PagedAttention,
    ParallelLMHead,
    RMSNorm,
    RotaryEmbedding,
    RowParallelLinear,
    VocabParallelEmbedding,
    column_slice,
    kv_head_slice,
)


def rope_settings(config: Any) -> tuple[float, dict[str, Any] | None]:
    """``(theta, scaling)`` from a config of any transformers version (rope_parameters or rope_theta/rope_scaling)."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    theta = params.pop("rope_theta", None) or getattr(config, "rope_theta", 10000.0)
    scaling = getattr(config, "rope_scaling", None) or (params if params.get("rope_type", "default") != "default" else None)
    return float(theta), scaling


class LlamaAttention(nn.Module):
    def __init__(self, config: Any, kernels: KernelSet) -> None:
        super().__init__()
        total_heads = config.num_attention_heads
        total_kv_heads = getattr(config, "num_key_value_heads", None) or total_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // total_heads
        bias = getattr(config, "attention_bias", False)
        q = column_slice(total_heads * self.head_dim)
        kv = kv_head_slice(total_kv_heads, self.head_dim)
        self.num_heads = q[2] // self.head_dim  # this rank's heads
        self.num_kv_heads = kv[2] // self.head_dim
        self.qkv_proj = MergedLinear(config.hidden_size, {"q": q, "k": kv, "v": kv}, bias=bias)
        self.o_proj = RowParallelLinear(total_heads * self.head_dim, config.hidden_size, bias=bias)
        theta, scaling = rope_settings(config)
        rotary_dim = int(self.head_dim * getattr(config, "partial_rotary_factor", 1.0))
        self.rotary_emb = RotaryEmbedding(rotary_dim, config.max_position_embeddings, theta, scaling, kernels)
        self.attn = PagedAttention(self.num_heads, self.num_kv_heads, self.head_dim, self.head_dim**-0.5, kernels)
        self.split = (q[2], kv[2], kv[2])

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, metadata: AttentionMetadata) -> torch.Tensor:
        tokens = hidden.shape[0]
        q, k, v = self.qkv_proj(hidden).split(self.split, dim=-1)
        q = q.view(tokens, self.num_heads, self.head_dim)
        k = k.view(tokens, self.num_kv_heads, self.head_dim)
        q, k = self.rotary_emb(positions, q, k)
        out = self.attn(q, k, v.view(tokens, self.num_kv_heads, self.head_dim), metadata)
        return self.o_proj(out)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: Any, kernels: KernelSet) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, kernels)
        self.self_attn = LlamaAttention(config, kernels)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, kernels)
        self.mlp = GatedMLP(config.hidden_size, config.intermediate_size, getattr(config, "mlp_bias", False), kernels)

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None, metadata: AttentionMetadata
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden, metadata)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class LlamaModel(nn.Module):
    def __init__(self, config: Any, kernels: KernelSet) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config, kernels) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, kernels)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, metadata: AttentionMetadata) -> torch.Tensor:
        hidden, residual = self.embed_tokens(input_ids), None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual, metadata)
        hidden, _ = self.norm(hidden, residual)
        return hidden


class LlamaForCausalLM(CausalLM):
    def __init__(self, config: Any, kernels: KernelSet) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaModel(config, kernels)
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size)
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        self.tie_weights()

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn_metadata: AttentionMetadata) -> torch.Tensor:
        return self.model(input_ids, positions, attn_metadata)
