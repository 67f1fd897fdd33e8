"""``BertModel``: a bidirectional encoder whose hidden states the engine pools into embeddings.

Each request's tokens attend to each other (never across requests); there is
no KV cache, so every request is computed whole in one step.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from llmp.api import AttentionMetadata, KernelSet
from llmp.modeling.layers import load_weights
from llmp.modeling.parallel import tp_size

_ACTIVATIONS = {"gelu": F.gelu, "gelu_new": lambda x: F.gelu(x, approximate="tanh"), "relu": F.relu}


class BertEmbeddings(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # one segment: every token has token type 0
        hidden = self.word_embeddings(input_ids) + self.position_embeddings(positions)
        return self.LayerNorm(hidden + self.token_type_embeddings.weight[0])


class BertSelfAttention(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // self.num_heads
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, hidden: torch.Tensor, starts: list[int]) -> torch.Tensor:
        tokens = hidden.shape[0]
        q, k, v = (
            proj(hidden).view(tokens, self.num_heads, self.head_dim).transpose(0, 1)
            for proj in (self.query, self.key, self.value)
        )  # [H, T, D]
        out = torch.empty_like(q)
        for start, end in zip(starts, starts[1:]):  # each request attends only to itself
            out[:, start:end] = F.scaled_dot_product_attention(q[:, start:end], k[:, start:end], v[:, start:end])
        return out.transpose(0, 1).reshape(tokens, -1)


class BertAttention(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = _DenseNorm(config.hidden_size, config.hidden_size, config.layer_norm_eps)

    def forward(self, hidden: torch.Tensor, starts: list[int]) -> torch.Tensor:
        return self.output(self.self(hidden, starts), hidden)


class _DenseNorm(nn.Module):
    """``LayerNorm(dense(x) + residual)``: the output block of BERT's attention and MLP."""

    def __init__(self, in_features: int, hidden: int, eps: float) -> None:
        super().__init__()
        self.dense = nn.Linear(in_features, hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dense(x) + residual)


class BertIntermediate(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act = _ACTIVATIONS[config.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.dense(x))


class BertLayer(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = _DenseNorm(config.intermediate_size, config.hidden_size, config.layer_norm_eps)

    def forward(self, hidden: torch.Tensor, starts: list[int]) -> torch.Tensor:
        hidden = self.attention(hidden, starts)
        return self.output(self.intermediate(hidden), hidden)


class BertEncoder(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))


class BertModel(nn.Module):
    is_pooling_model = True
    default_pooling = "cls"  # without a sentence-transformers config, BERT's [CLS] vector

    def __init__(self, config: Any, kernels: KernelSet) -> None:
        super().__init__()
        if tp_size() > 1:
            raise ValueError("BertModel runs on one rank: use tensor_parallel_size=1")
        if getattr(config, "position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"BertModel supports absolute positions, not {config.position_embedding_type!r}")
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)

    def attention_layers(self) -> list:
        return []  # no KV cache

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, attn_metadata: AttentionMetadata
    ) -> torch.Tensor:
        starts = attn_metadata.query_start_loc.tolist()
        hidden = self.embeddings(input_ids, positions)
        for layer in self.encoder.layer:
            hidden = layer(hidden, starts)
        return hidden

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        # BertModel checkpoints may carry a "bert." prefix, the unused pooler and position ids
        renamed = ((name.removeprefix("bert."), tensor) for name, tensor in weights)
        load_weights(self, renamed, ignored=("pooler.", "position_ids", "cls.predictions", "cls.seq_relationship"))
