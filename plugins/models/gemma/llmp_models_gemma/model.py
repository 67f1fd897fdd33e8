"""Gemma and Gemma 2 on the shared decoder blocks.

Both scale the embeddings by sqrt(hidden size), use a tanh-GELU gated MLP and
an RMSNorm whose weight is stored as an offset from 1. Gemma 2 adds a norm
after the attention and after the MLP, alternates sliding-window and global
layers, and soft-caps attention scores and final logits. Their sequence classifiers score the
last token's hidden state (no soft-capping, as transformers).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from llmp.api import AttentionMetadata, KernelSet
from llmp.modeling.decoder import DecoderAttention, DecoderForCausalLM, sequence_classification_variant
from llmp.modeling.layers import GatedMLP

_TANH_GELUS = ("gelu_pytorch_tanh", "gelu_tanh", "gelu_new", "gelu")  # plain "gelu" is Gemma's legacy name for tanh


class GemmaRMSNorm(nn.Module):
    """``norm(x) * (1 + w)``, computed in float32 as Gemma was trained.

    Not routed through the kernel set: folding ``1 + w`` into a bf16 weight
    would round away most of ``w``.
    """

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(size))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> Any:
        if residual is not None:
            x = x + residual
        x32 = x.float()
        out = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps) * (1.0 + self.weight.float())).to(
            x.dtype
        )
        return out if residual is None else (out, x)


def _activation(config: Any) -> str:
    name = getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", "gelu_pytorch_tanh")
    if name not in _TANH_GELUS:
        raise ValueError(f"Gemma with activation {name!r} is not supported; supported: {', '.join(_TANH_GELUS)}")
    return "gelu_tanh"


class GemmaForCausalLM(DecoderForCausalLM):
    @property
    def embed_scale(self) -> float:
        return self.config.hidden_size**0.5

    def make_norm(self, config: Any, kernels: KernelSet) -> nn.Module:
        return GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)

    def make_mlp(self, config: Any, kernels: KernelSet, index: int) -> nn.Module:
        return GatedMLP(config.hidden_size, config.intermediate_size, False, kernels, activation=_activation(config))


class Gemma2DecoderLayer(nn.Module):
    """``x + norm(attn(norm(x)))`` then ``x + norm(mlp(norm(x)))``.

    Returns ``(block output, residual)`` like :class:`llmp.modeling.decoder.DecoderLayer`,
    so the model's final norm adds them.
    """

    def __init__(self, config: Any, self_attn: nn.Module, mlp: nn.Module) -> None:
        super().__init__()
        size, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = GemmaRMSNorm(size, eps)
        self.self_attn = self_attn
        self.post_attention_layernorm = GemmaRMSNorm(size, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(size, eps)
        self.mlp = mlp
        self.post_feedforward_layernorm = GemmaRMSNorm(size, eps)
        self.selects_rows = bool(getattr(self_attn, "selects_rows", False))

    def forward(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        metadata: AttentionMetadata,
        rows: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """With ``rows`` (the model's last layer, :class:`llmp.modeling.decoder.DecoderModel`), those rows alone."""
        if residual is not None:
            hidden = hidden + residual
        normed = self.input_layernorm(hidden)
        if rows is None:
            attended = self.self_attn(positions, normed, metadata)
        else:
            attended, hidden = self.self_attn(positions, normed, metadata, rows=rows), hidden[rows]
        hidden = hidden + self.post_attention_layernorm(attended)
        return self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(hidden))), hidden


class Gemma2ForCausalLM(GemmaForCausalLM):
    def make_layer(self, config: Any, kernels: KernelSet, index: int, window: int | None) -> nn.Module:
        return Gemma2DecoderLayer(
            config, self.make_attention(config, kernels, index, window), self.make_mlp(config, kernels, index)
        )

    def make_attention(self, config: Any, kernels: KernelSet, index: int, window: int | None) -> nn.Module:
        bias = bool(getattr(config, "attention_bias", False))
        return DecoderAttention(
            config,
            kernels,
            sliding_window=window,
            qkv_bias=bias,
            o_bias=bias,
            scale=config.query_pre_attn_scalar**-0.5,
            softcap=config.attn_logit_softcapping,
        )

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        logits = super().compute_logits(hidden_states)
        cap = getattr(self.config, "final_logit_softcapping", None)
        return logits if cap is None else torch.tanh(logits / cap) * cap


# bge-reranker-v2-gemma is a GemmaForCausalLM served as GemmaForSequenceClassification through
# hf_overrides (classifier_from_token ["Yes"], method no_post_processing): the head is lm_head["Yes"]
GemmaForSequenceClassification = sequence_classification_variant(GemmaForCausalLM)
Gemma2ForSequenceClassification = sequence_classification_variant(Gemma2ForCausalLM)
