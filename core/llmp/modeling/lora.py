"""Multi-LoRA on the model's layers: what an adapter holds per module (:class:`LoRAWeights`),
the modules a model can adapt (:class:`LoRATarget`), and the wrappers the model runner installs
around the loaded linears and embeddings so that every row of a step runs with its own adapter
slot (``llmp.api.LoRAMapping``), through the kernel set's ``lora_shrink``/``lora_expand``.

No model plugin changes: the runner calls :func:`install_lora` after ``load_weights``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from torch import Tensor

__all__ = ["LoRATarget", "LoRAWeights", "ModuleLoRA"]


@dataclass(frozen=True)
class LoRATarget:
    """One module a LoRA adapter may adapt, with its FULL (not tensor-parallel sliced) shapes."""

    kind: Literal["linear", "embedding", "lm_head"]
    in_features: int  # input width (an embedding: its vocabulary size; A is then [r, vocab])
    shards: Mapping[str, int]  # shard -> full output rows: {"": out}, {"q", "k", "v"} or {"gate", "up"}


@dataclass
class ModuleLoRA:
    """One module's adapter weights, on the CPU in the model's dtype."""

    a: dict[str, Tensor] = field(default_factory=dict)  # shard -> A [r, in_full]; "*" = trained on the fused module
    b: dict[str, Tensor] = field(default_factory=dict)  # shard -> B [out_full, r], scaling multiplied in


@dataclass
class LoRAWeights:
    """One adapter, read and checked once (``llmp.model_files.lora.load_lora_weights``); picklable,
    as it travels in ``StepInputs.lora.loads`` to tensor-parallel ranks."""

    lora_id: int
    name: str
    rank: int
    modules: dict[str, ModuleLoRA] = field(default_factory=dict)  # llmp module path -> its weights
