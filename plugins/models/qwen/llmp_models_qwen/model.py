"""Qwen2, Qwen3 and Qwen3-MoE on the shared decoder.

Qwen2 always has a bias on q, k and v (never on o); Qwen3 normalises each
head's q and k before the rotation; Qwen3-MoE routes the MLP of its sparse
layers to experts (``decoder_sparse_step``, ``mlp_only_layers``).
"""

from typing import Any

from torch import nn

from llmp.api import KernelSet
from llmp.modeling.decoder import (
    DecoderAttention,
    DecoderForCausalLM,
    embedding_variant,
    sequence_classification_variant,
)
from llmp.modeling.layers import GatedMLP
from llmp.modeling.moe import SparseMoE


class Qwen2ForCausalLM(DecoderForCausalLM):
    def make_attention(self, config: Any, kernels: KernelSet, index: int, window: int | None) -> nn.Module:
        return DecoderAttention(config, kernels, sliding_window=window, qkv_bias=True)


class Qwen3ForCausalLM(DecoderForCausalLM):
    def make_attention(self, config: Any, kernels: KernelSet, index: int, window: int | None) -> nn.Module:
        bias = bool(getattr(config, "attention_bias", False))
        return DecoderAttention(config, kernels, sliding_window=window, qkv_bias=bias, o_bias=bias, qk_norm=True)


class Qwen3MoeForCausalLM(Qwen3ForCausalLM):
    def make_mlp(self, config: Any, kernels: KernelSet, index: int) -> nn.Module:
        sparse = (
            index not in (getattr(config, "mlp_only_layers", None) or [])
            and config.num_experts > 0
            and (index + 1) % config.decoder_sparse_step == 0
        )
        if not sparse:
            return GatedMLP(config.hidden_size, config.intermediate_size, False, kernels)
        return SparseMoE(
            config.hidden_size,
            config.moe_intermediate_size,
            config.num_experts,
            config.num_experts_per_tok,
            renormalize=bool(config.norm_topk_prob),
            kernels=kernels,
        )


Qwen2Model = embedding_variant(Qwen2ForCausalLM)
Qwen3Model = embedding_variant(Qwen3ForCausalLM)
Qwen2ForSequenceClassification = sequence_classification_variant(Qwen2ForCausalLM)
Qwen3ForSequenceClassification = sequence_classification_variant(Qwen3ForCausalLM)
