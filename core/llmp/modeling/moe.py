"""Mixture-of-experts MLP: a router picks the top-k gated experts of each token.

Experts are stacked into two tensors so one module holds them all; with tensor
parallelism each rank keeps a slice of every expert's intermediate size and
the partial outputs are summed over ranks, as in a dense MLP.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from llmp.api import KernelSet, ModelLoadError
from llmp.modeling.layers import column_slice, row_invariant
from llmp.modeling.parallel import all_reduce

__all__ = ["FusedExperts", "SparseMoE"]


class FusedExperts(nn.Module):
    """``w13`` [E, 2I, N] (each expert's gate rows, then up rows) and ``w2`` [E, N, I],
    loaded one checkpoint matrix at a time by ``load_weights`` (shards ``"<expert>:gate|up|down"``)."""

    def __init__(self, num_experts: int, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.num_experts, self.hidden, self.intermediate = num_experts, hidden, intermediate
        _, self.start, self.local = column_slice(intermediate)
        self.w13 = nn.Parameter(torch.empty(num_experts, 2 * self.local, hidden))
        self.w2 = nn.Parameter(torch.empty(num_experts, hidden, self.local))

    def shards_of(self, param_name: str) -> list[str]:
        kinds = ("gate", "up") if param_name == "w13" else ("down",)
        return [f"{e}:{kind}" for e in range(self.num_experts) for kind in kinds]

    def load_shard(self, shard: str, param_name: str, tensor: torch.Tensor) -> None:
        index, kind = shard.split(":")
        expert = int(index)
        if expert >= self.num_experts:
            raise ModelLoadError(f"checkpoint has expert {expert}; the config has {self.num_experts} experts")
        down = kind == "down"
        expected = (self.hidden, self.intermediate) if down else (self.intermediate, self.hidden)
        if tuple(tensor.shape) != expected:
            raise ModelLoadError(
                f"expert {expert} {kind} weight has shape {tuple(tensor.shape)}, the model expects {expected}"
            )
        if down:
            self.w2.data[expert].copy_(tensor.narrow(1, self.start, self.local))
        else:
            offset = 0 if kind == "gate" else self.local
            self.w13.data[expert].narrow(0, offset, self.local).copy_(tensor.narrow(0, self.start, self.local))


class SparseMoE(nn.Module):
    """Routes each token to its ``top_k`` experts and sums their outputs weighted by the router."""

    traceable_decode = False  # Python loops over the experts a step chose: a trace would freeze that choice

    def __init__(
        self, hidden: int, intermediate: int, num_experts: int, top_k: int, renormalize: bool, kernels: KernelSet
    ) -> None:
        super().__init__()
        self.gate = nn.Linear(hidden, num_experts, bias=False)  # the router, replicated on every rank
        self.experts = FusedExperts(num_experts, hidden, intermediate)
        self.top_k, self.renormalize = top_k, renormalize
        self.kernels = kernels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, N]. Routing in float32, as the reference implementations do.
        probs = F.softmax(row_invariant(self.gate, x).float(), dim=-1)
        weights, chosen = probs.topk(self.top_k, dim=-1)  # [T, k]
        if self.renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        out = torch.zeros_like(x)
        for expert in chosen.unique().tolist():  # ascending: the same summation order as transformers
            rows, slot = (chosen == expert).nonzero(as_tuple=True)
            w13, w2 = self.experts.w13[expert], self.experts.w2[expert]
            hidden = self.kernels.silu_and_mul(row_invariant(partial(F.linear, weight=w13), x[rows]))
            y = row_invariant(partial(F.linear, weight=w2), hidden) * weights[rows, slot, None]
            out.index_add_(0, rows, y.to(x.dtype))
        return all_reduce(out)
