"""Qwen2, Qwen3 and Qwen3-MoE on the shared decoder.

Qwen2 always has a bias on q, k and v (never on o); Qwen3 normalises each
head's q and k before the rotation; Qwen3-MoE routes the MLP of its sparse
layers to experts (``decoder_sparse_step``, ``mlp_only_layers``). Qwen2.5-Math's
reward models put an MLP head on every token of a Qwen2 model.
"""

from typing import Any

import torch
from torch import nn

from llmp.api import KernelSet
from llmp.modeling.decoder import (
    DecoderAttention,
    DecoderForCausalLM,
    embedding_variant,
    sequence_classification_variant,
)
from llmp.modeling.layers import GatedMLP, row_invariant
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


class Qwen2ForRewardModel(Qwen2ForSequenceClassification):
    """Qwen2.5-Math-RM (vLLM's ``Qwen2ForRewardModel``): a reward at every token.

    The head is an MLP on each token's final hidden state, ``score.0`` (hidden -> hidden, with
    bias), ReLU, ``score.2`` (hidden -> one label); as in vLLM its rewards are raw by default
    (``use_activation=True`` puts them through the sigmoid). The label count is fixed by the
    architecture, whatever ``id2label`` the config carries.
    """

    num_labels = 1
    default_use_activation = False

    def make_score(self, config: Any) -> nn.Module:
        hidden = config.hidden_size
        return nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, self.num_labels))

    def classify(self, pooled: torch.Tensor) -> torch.Tensor:
        """``[N, hidden]`` -> ``[N, num_labels]`` float32 logits, computed in the weights' dtype
        (as the model was trained; no float32 copy of the hidden x hidden layer) row by row."""
        return row_invariant(self.score, pooled.to(self.score[0].weight.dtype)).float()


class Qwen2ForProcessRewardModel(Qwen2ForRewardModel):
    """Qwen2.5-Math-PRM (vLLM's ``Qwen2ForProcessRewardModel``): two labels (the step is wrong,
    right) at each step tag, softmax probabilities by default.

    As in vLLM, ``token_classify`` keeps the rows of the step-tag token, ``<extra_0>`` (151651)
    unless a request names another ``step_tag_id``.
    """

    num_labels = 2
    default_use_activation = True
    default_step_tag_id = 151651
