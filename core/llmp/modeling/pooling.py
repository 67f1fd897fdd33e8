"""Pooling hidden states into one embedding per sequence (configured by :class:`llmp.api.PoolingConfig`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

__all__ = ["POOLING_TYPES", "Pooler", "as_pooling_model", "finish_embedding"]

POOLING_TYPES = ("mean", "cls", "last")


@dataclass(frozen=True)
class Pooler:
    """Pools a step's hidden states, as :class:`llmp.api.PoolingConfig` (resolved with the model) says."""

    pooling_type: str
    normalize: bool

    def __call__(self, hidden: torch.Tensor, query_start_loc: list[int]) -> list[torch.Tensor]:
        """One float32 vector per sequence of the flattened ``hidden`` [T, N]."""
        pooled = []
        for start, end in zip(query_start_loc, query_start_loc[1:]):
            rows = hidden[start:end].float()
            if self.pooling_type == "mean":
                vector = rows.mean(0)
            elif self.pooling_type == "cls":
                vector = rows[0]
            else:
                vector = rows[-1]
            pooled.append(vector)
        return pooled


def as_pooling_model(model_cls: type, task: str) -> type:
    """``model_cls`` itself, or for ``task="embed"`` on a causal LM of the shared layers, its
    embedding variant (hidden states pooled, no LM head)."""
    if task != "embed" or getattr(model_cls, "is_pooling_model", False):
        return model_cls
    from llmp.modeling.layers import CausalLM

    if not (isinstance(model_cls, type) and issubclass(model_cls, CausalLM)):
        raise ValueError(
            f"{getattr(model_cls, '__name__', model_cls)} cannot produce embeddings: only native "
            "causal LMs and embedding models can (task='embed')"
        )
    from llmp.modeling.decoder import embedding_variant

    return embedding_variant(model_cls)


def finish_embedding(vector: torch.Tensor, normalize: bool, dimensions: int | None) -> list[float]:
    if dimensions is not None:
        if dimensions > vector.shape[-1]:
            raise ValueError(f"dimensions {dimensions} exceeds the model's embedding size {vector.shape[-1]}")
        vector = vector[:dimensions]
    if normalize:
        vector = F.normalize(vector, dim=-1)
    return vector.tolist()
