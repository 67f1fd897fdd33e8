"""``NullForCausalLM``: logits that always pick ``config.null_token_id``, computed for free."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn


class NullForCausalLM(nn.Module):
    def __init__(self, config: Any, kernels: Any) -> None:
        super().__init__()
        self.vocab_size = config.vocab_size
        self.token = getattr(config, "null_token_id", 100)

    def attention_layers(self) -> list[Any]:
        return []  # no KV cache

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        for _ in weights:
            pass

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, metadata: Any) -> torch.Tensor:
        return torch.zeros(input_ids.shape[0], 1)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = torch.zeros(hidden.shape[0], self.vocab_size)
        logits[:, self.token] = 1.0
        return logits
