"""Mistral and Mixtral on the shared decoder.

Mistral is Llama with a sliding window on every layer (``sliding_window`` in
its config, read by ``layer_windows``). Mixtral replaces the MLP with a sparse
mixture of experts whose router weights are renormalised over the top k.
"""

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from llmp.api import KernelSet
from llmp.modeling.decoder import DecoderForCausalLM, embedding_variant, sequence_classification_variant
from llmp.modeling.moe import SparseMoE


class MistralForCausalLM(DecoderForCausalLM):
    pass


class MixtralForCausalLM(DecoderForCausalLM):
    def make_mlp(self, config: Any, kernels: KernelSet, index: int) -> nn.Module:
        return SparseMoE(
            config.hidden_size,
            config.intermediate_size,
            config.num_local_experts,
            config.num_experts_per_tok,
            renormalize=True,
            kernels=kernels,
        )

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        # Mixtral checkpoints call the MoE block "block_sparse_moe"
        super().load_weights((name.replace(".block_sparse_moe.", ".mlp."), tensor) for name, tensor in weights)


MistralModel = embedding_variant(MistralForCausalLM)
MistralForSequenceClassification = sequence_classification_variant(MistralForCausalLM)
