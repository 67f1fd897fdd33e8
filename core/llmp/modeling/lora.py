"""Multi-LoRA on the model's layers: what an adapter holds per module (:class:`LoRAWeights`),
the modules a model can adapt (:class:`LoRATarget`), and the wrappers the model runner installs
around the loaded linears and embeddings so that every row of a step runs with its own adapter
slot (``llmp.api.LoRAMapping``), through the kernel set's ``lora_shrink``/``lora_expand``.

No model plugin changes: the runner calls :func:`install_lora` after ``load_weights``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor, nn

from llmp.api import LoRAKernels, LoRAMapping, ModelLoadError
from llmp.modeling.layers import (
    CausalLM,
    GatedMLP,
    MergedLinear,
    ParallelLMHead,
    RowParallelLinear,
    VocabParallelEmbedding,
)
from llmp.modeling.parallel import tp_rank

__all__ = [
    "EmbeddingWithLoRA",
    "LMHeadWithLoRA",
    "LoRAContext",
    "LoRALayer",
    "LoRAModelState",
    "LoRATarget",
    "LoRAWeights",
    "MergedLinearWithLoRA",
    "ModuleLoRA",
    "RowParallelLinearWithLoRA",
    "install_lora",
    "lora_mapping",
    "lora_targets",
]


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


# -- which rows run with which slot ----------------------------------------------


def lora_mapping(slots: Any, device: torch.device | str) -> LoRAMapping | None:
    """The :class:`llmp.api.LoRAMapping` of rows whose slots are ``slots`` ([T] ints, -1 = the base
    model only), or None when no row has a slot (the adapted layers then cost nothing).

    Rows are grouped by slot, ascending, each group in row order (a stable sort): a row's place in
    its group never depends on the other adapters of the batch.
    """
    slots = np.asarray(slots, dtype=np.int64).reshape(-1)
    adapted = np.flatnonzero(slots >= 0)
    if adapted.size == 0:
        return None
    rows = adapted[np.argsort(slots[adapted], kind="stable")]
    group_slots, group_sizes = np.unique(slots[rows], return_counts=True)
    return LoRAMapping(
        token_slots=torch.from_numpy(slots.copy()).to(device),
        rows=torch.from_numpy(rows).to(device),
        group_slots=tuple(group_slots.tolist()),
        group_sizes=tuple(group_sizes.tolist()),
    )


class LoRAContext:
    """The LoRA mapping of the forward call in progress, shared by every adapted layer of a model.

    The model runner sets the step's rows (:meth:`set_rows`) and narrows them where the model runs
    a subset of the rows: the logits rows (:meth:`rows`), and the row blocks of a
    :class:`~llmp.modeling.layers.GatedMLP` (:meth:`narrow`).
    """

    def __init__(self) -> None:
        self.mapping: LoRAMapping | None = None
        self._device = torch.device("cpu")
        self._step_slots: np.ndarray | None = None  # None: no adapted row in this step
        self._slots: np.ndarray | None = None  # the slots of the rows the model runs now
        self._blocks: dict[tuple[int, int], LoRAMapping | None] = {}  # narrow's mappings, the same in every layer

    def set_rows(self, slots: Any, device: torch.device | str) -> None:
        """Each row's slot for the next forward call ([T] ints, -1 = the base model), or None: no LoRA."""
        self._device = torch.device(device)
        self._blocks.clear()
        self.mapping = None if slots is None else lora_mapping(slots, self._device)
        self._step_slots = None if self.mapping is None else np.asarray(slots, dtype=np.int64).reshape(-1)
        self._slots = self._step_slots

    @contextmanager
    def rows(self, index: Any) -> Iterator[None]:
        """Run with the rows ``index`` of the current rows (``compute_logits`` on ``hidden[index]``)."""
        if self._slots is None:
            yield
            return
        with self._selecting(self._slots[np.asarray(index, dtype=np.int64)], None):
            yield

    @contextmanager
    def narrow(self, start: int, count: int) -> Iterator[None]:
        """Run with the ``count`` current rows from ``start`` (a row block)."""
        if self._slots is None:
            yield
            return
        with self._selecting(self._slots[start : start + count], (start, count)):
            yield

    @contextmanager
    def _selecting(self, slots: np.ndarray, block: tuple[int, int] | None) -> Iterator[None]:
        saved = self.mapping, self._slots
        cached = block is not None and self._slots is self._step_slots
        if cached and block in self._blocks:
            mapping = self._blocks[block]
        else:
            mapping = lora_mapping(slots, self._device)
            if cached:
                self._blocks[block] = mapping
        self.mapping, self._slots = mapping, slots
        try:
            yield
        finally:
            self.mapping, self._slots = saved

    def mapping_for(self, x: Tensor) -> LoRAMapping | None:
        """The mapping of ``x``'s rows; a layer given other rows than the mapping's is a bug, not a guess."""
        mapping = self.mapping
        if mapping is not None and mapping.token_slots.shape[0] != x.shape[0]:
            raise RuntimeError(
                f"a LoRA layer got {x.shape[0]} rows, but the LoRA mapping in effect has "
                f"{mapping.token_slots.shape[0]}: a model running a subset of the step's rows "
                "selects them with LoRAContext.rows or LoRAContext.narrow"
            )
        return mapping


# -- the adapted layers ------------------------------------------------------------
# Each wrapper holds every slot's A and B stacked ([L, ...], zero-padded to the largest rank R, the
# scaling already in B) as buffers in the model's dtype, and adds the rows' LoRA to the base
# layer's output through the kernel set. A row with no slot gets exactly the base layer's numbers.


class LoRALayer(nn.Module):
    """A base layer plus the stacked adapter slots; ``lora_a``/``lora_b`` are this rank's parts."""

    lora_a: Tensor
    lora_b: Tensor

    def __init__(self, base_layer: nn.Module, context: LoRAContext, kernels: LoRAKernels, max_rank: int) -> None:
        super().__init__()
        self.base_layer = base_layer
        self.context = context
        self.kernels = kernels
        self.max_rank = max_rank

    def _buffers_of(self, a: tuple[int, ...], b: tuple[int, ...], dtype: torch.dtype, device: Any) -> None:
        self.register_buffer("lora_a", torch.zeros(a, dtype=dtype, device=device), persistent=False)
        self.register_buffer("lora_b", torch.zeros(b, dtype=dtype, device=device), persistent=False)

    def clear_slot(self, slot: int) -> None:
        self.lora_a[slot].zero_()
        self.lora_b[slot].zero_()

    def set_slot(self, slot: int, weights: ModuleLoRA) -> None:
        """Copy one module's adapter (full shapes) into ``slot``, keeping this rank's slices."""
        raise NotImplementedError

    def add_lora(self, y: Tensor, x: Tensor, mapping: LoRAMapping) -> None:
        """``y[row] += x[row] @ A.T @ B.T`` for every row with a slot, in place."""
        self.kernels.lora_expand(y, self.kernels.lora_shrink(x, self.lora_a, mapping), self.lora_b, mapping)


def _single(weights: ModuleLoRA, what: str) -> tuple[Tensor, Tensor]:
    """The A and B of an unfused module (shard ``""``)."""
    if set(weights.a) != {""} or set(weights.b) != {""}:
        raise ValueError(f"{what} takes one A and one B, got shards {sorted(weights.a)}")
    return weights.a[""], weights.b[""]


class MergedLinearWithLoRA(LoRALayer):
    """A :class:`~llmp.modeling.layers.MergedLinear` (``qkv_proj``, ``gate_up_proj``, a column-parallel
    linear) with LoRA: shard k's A fills rows ``[kR, kR + r)`` of ``lora_a [L, n·R, in]``, its B the
    same columns of ``lora_b [L, out_local, n·R]`` at the shard's rows, so one shrink and one expand
    serve all shards. An adapter trained on the fused module (shard ``"*"``) uses block 0 for all."""

    def __init__(
        self,
        base_layer: MergedLinear,
        context: LoRAContext,
        kernels: LoRAKernels,
        *,
        max_loras: int,
        max_rank: int,
        dtype: torch.dtype,
        device: Any,
    ) -> None:
        super().__init__(base_layer, context, kernels, max_rank)
        offsets = base_layer.shard_offsets
        out_local = sum(piece[2] for _, piece in offsets.values())
        width = len(offsets) * max_rank
        self._buffers_of((max_loras, width, base_layer.in_features), (max_loras, out_local, width), dtype, device)

    def forward(self, x: Tensor) -> Tensor:
        y = self.base_layer(x)
        mapping = self.context.mapping_for(x)
        if mapping is not None:
            self.add_lora(y, x, mapping)
        return y

    def set_slot(self, slot: int, weights: ModuleLoRA) -> None:
        offsets = self.base_layer.shard_offsets
        if "*" in weights.a:
            if set(weights.a) != {"*"} or set(weights.b) != {"*"}:
                raise ValueError("an adapter of a fused module cannot also adapt its parts")
            a, b = weights.a["*"], weights.b["*"]
            rank, full = a.shape[0], 0
            self.lora_a[slot, :rank] = a
            for offset, (rows, start, length) in offsets.values():
                self.lora_b[slot, offset : offset + length, :rank] = b[full + start : full + start + length]
                full += rows
            return
        unknown = (set(weights.a) | set(weights.b)) - set(offsets)
        if unknown:
            raise ValueError(f"no shard {sorted(unknown)} in a module of shards {sorted(offsets)}")
        for k, (shard, (offset, (_, start, length))) in enumerate(offsets.items()):
            if shard in weights.a:
                a, b = weights.a[shard], weights.b[shard]
                block = slice(k * self.max_rank, k * self.max_rank + a.shape[0])
                self.lora_a[slot, block] = a
                self.lora_b[slot, offset : offset + length, block] = b.narrow(0, start, length)


class RowParallelLinearWithLoRA(LoRALayer):
    """A :class:`~llmp.modeling.layers.RowParallelLinear` (``o_proj``, ``down_proj``) with LoRA: each
    rank holds A's columns of its input slice (``lora_a [L, R, in_local]``) and all of B, adds
    ``B (A_local x_local)`` to its partial output, and the one all-reduce sums ``B A x``."""

    def __init__(
        self,
        base_layer: RowParallelLinear,
        context: LoRAContext,
        kernels: LoRAKernels,
        *,
        max_loras: int,
        max_rank: int,
        dtype: torch.dtype,
        device: Any,
    ) -> None:
        super().__init__(base_layer, context, kernels, max_rank)
        self._buffers_of(
            (max_loras, max_rank, base_layer.in_local), (max_loras, base_layer.out_features, max_rank), dtype, device
        )

    def forward(self, x: Tensor) -> Tensor:
        mapping = self.context.mapping_for(x)
        if mapping is None:
            return self.base_layer(x)
        partial = self.base_layer.matmul(x)
        self.add_lora(partial, x, mapping)
        return self.base_layer.reduce(partial)

    def set_slot(self, slot: int, weights: ModuleLoRA) -> None:
        a, b = _single(weights, "a row-parallel linear")
        local = self.base_layer.in_local
        rank = a.shape[0]
        self.lora_a[slot, :rank] = a.narrow(1, tp_rank() * local, local)
        self.lora_b[slot, :, :rank] = b


class EmbeddingWithLoRA(LoRALayer):
    """A :class:`~llmp.modeling.layers.VocabParallelEmbedding` (``embed_tokens``) with LoRA: A is kept
    transposed and whole on every rank (``lora_a [L, vocab, R]``: a token's row is its shrunk input),
    B is ``lora_b [L, hidden, R]``; the adapter is added after the base lookup's all-reduce."""

    def __init__(
        self,
        base_layer: VocabParallelEmbedding,
        context: LoRAContext,
        kernels: LoRAKernels,
        *,
        max_loras: int,
        max_rank: int,
        dtype: torch.dtype,
        device: Any,
    ) -> None:
        super().__init__(base_layer, context, kernels, max_rank)
        self._buffers_of(
            (max_loras, base_layer.vocab_size, max_rank), (max_loras, base_layer.hidden_size, max_rank), dtype, device
        )

    @property
    def weight(self) -> Tensor:
        return self.base_layer.weight

    def forward(self, input_ids: Tensor) -> Tensor:
        y = self.base_layer(input_ids)
        mapping = self.context.mapping_for(input_ids)
        if mapping is not None:
            rows = mapping.rows
            shrunk = self.lora_a[mapping.token_slots[rows], input_ids[rows]]  # [N, R]: a lookup, row by row
            self.kernels.lora_expand(y, shrunk, self.lora_b, mapping)
        return y

    def set_slot(self, slot: int, weights: ModuleLoRA) -> None:
        a, b = _single(weights, "an embedding")
        rank = a.shape[0]
        self.lora_a[slot, :, :rank] = a.T
        self.lora_b[slot, :, :rank] = b


class LMHeadWithLoRA(LoRALayer):
    """A :class:`~llmp.modeling.layers.ParallelLMHead` with LoRA: ``lora_a [L, R, hidden]`` whole,
    ``lora_b [L, rows_local, R]`` this rank's vocabulary rows (zero past the vocabulary); the adapter
    is added to each rank's logits before they are gathered."""

    def __init__(
        self,
        base_layer: ParallelLMHead,
        context: LoRAContext,
        kernels: LoRAKernels,
        *,
        max_loras: int,
        max_rank: int,
        dtype: torch.dtype,
        device: Any,
    ) -> None:
        super().__init__(base_layer, context, kernels, max_rank)
        self._buffers_of(
            (max_loras, max_rank, base_layer.hidden_size), (max_loras, base_layer.rows, max_rank), dtype, device
        )

    @property
    def weight(self) -> Tensor:
        return self.base_layer.weight

    @property
    def vocab_size(self) -> int:
        return self.base_layer.vocab_size

    def forward(self, hidden: Tensor) -> Tensor:
        mapping = self.context.mapping_for(hidden)
        if mapping is None:
            return self.base_layer(hidden)
        logits = self.base_layer.matmul(hidden)
        self.add_lora(logits, hidden, mapping)
        return self.base_layer.gather(logits)

    def set_slot(self, slot: int, weights: ModuleLoRA) -> None:
        a, b = _single(weights, "an LM head")
        head, rank = self.base_layer, a.shape[0]
        kept = b[head.start : head.start + head.rows]
        self.lora_a[slot, :rank] = a
        self.lora_b[slot, : kept.shape[0], :rank] = kept


# ParallelLMHead before VocabParallelEmbedding: it is a subclass
_WRAPPERS: tuple[tuple[type[nn.Module], type[LoRALayer]], ...] = (
    (ParallelLMHead, LMHeadWithLoRA),
    (VocabParallelEmbedding, EmbeddingWithLoRA),
    (MergedLinear, MergedLinearWithLoRA),
    (RowParallelLinear, RowParallelLinearWithLoRA),
)


def _target(module: nn.Module) -> LoRATarget | None:
    if isinstance(module, ParallelLMHead):
        return LoRATarget("lm_head", module.hidden_size, {"": module.vocab_size})
    if isinstance(module, VocabParallelEmbedding):
        return LoRATarget("embedding", module.vocab_size, {"": module.hidden_size})
    if isinstance(module, MergedLinear):
        return LoRATarget("linear", module.in_features, {s: piece[0] for s, (_, piece) in module.shard_offsets.items()})
    if isinstance(module, RowParallelLinear):
        return LoRATarget("linear", module.in_features, {"": module.out_features})
    return None


def lora_targets(model: nn.Module) -> dict[str, LoRATarget]:
    """Every module of ``model`` a LoRA adapter may adapt, by llmp module path
    (``model.layers.0.self_attn.qkv_proj``), with full (not tensor-parallel) shapes.

    Call it on the model as built (before :func:`install_lora`); a model on the meta device works.
    The q/k/v and gate/up checkpoint matrices are the shards of the fused modules
    (``CausalLM.stacked_params`` maps the names); an MoE's experts and router are not targets.
    """
    return {name: target for name, module in model.named_modules() if (target := _target(module)) is not None}


@dataclass
class LoRAModelState:
    """A model's adapted layers after :func:`install_lora`, and the slots they hold."""

    context: LoRAContext
    modules: dict[str, LoRALayer]  # llmp module path -> its wrapper
    max_loras: int
    max_rank: int

    def load(self, slot: int, weights: LoRAWeights | None) -> None:
        """Put ``weights`` in ``slot`` (None: empty it). The slot is zeroed first, so nothing of the
        adapter it held before remains; each rank keeps its tensor-parallel slices."""
        if not 0 <= slot < self.max_loras:
            raise ValueError(f"LoRA slot {slot} is out of range: there are {self.max_loras} (max_loras)")
        if weights is not None:
            if weights.rank > self.max_rank:
                raise ValueError(
                    f"LoRA adapter {weights.name!r} has rank {weights.rank}, above max_lora_rank {self.max_rank}"
                )
            unknown = sorted(set(weights.modules) - set(self.modules))
            if unknown:
                raise ValueError(f"LoRA adapter {weights.name!r} has weights for modules the model lacks: {unknown}")
        for module in self.modules.values():
            module.clear_slot(slot)
        if weights is not None:
            for path, module_weights in weights.modules.items():
                self.modules[path].set_slot(slot, module_weights)


def install_lora(
    model: nn.Module, kernels: Any, *, max_loras: int, max_rank: int, dtype: torch.dtype, device: Any
) -> LoRAModelState:
    """Wrap every LoRA target of the loaded ``model`` (:func:`lora_targets`) in place, with
    ``max_loras`` empty slots of rank up to ``max_rank``; the row blocks of gated MLPs follow the
    mapping. Call it after ``load_weights`` and ``pack_linear_layers``: the wrappers run the base
    layers as loaded. The model runner then fills slots with :meth:`LoRAModelState.load` and sets
    each forward call's rows on ``state.context``.

    Raises ``ModelLoadError`` for a model not built from llmp's layers (the transformers fallback,
    an encoder) or a kernel set without ``lora_shrink``/``lora_expand``.
    """
    if not isinstance(model, CausalLM):
        raise ModelLoadError(
            f"LoRA needs a native decoder model (Llama, Mistral, Qwen2/3, Gemma/Gemma 2 ...); "
            f"{type(model).__name__} is not one"
        )
    if not isinstance(kernels, LoRAKernels):
        raise ModelLoadError(
            f"the kernel set {type(kernels).__name__} has no LoRA kernels (lora_shrink, lora_expand): "
            "choose one that has them with --kernels"
        )
    context = LoRAContext()
    modules: dict[str, LoRALayer] = {}
    for name, module in list(model.named_modules()):
        if isinstance(module, GatedMLP):
            module.lora_context = context
        if getattr(module, "fused_decode", None) is not None:
            module.fused_decode = None  # a layer computed in one call would skip the adapters between its parts
        wrapper = next((w for base, w in _WRAPPERS if isinstance(module, base)), None)
        if wrapper is None:
            continue
        parent, _, attribute = name.rpartition(".")
        built = wrapper(module, context, kernels, max_loras=max_loras, max_rank=max_rank, dtype=dtype, device=device)
        setattr(model.get_submodule(parent), attribute, built)
        modules[name] = built
    return LoRAModelState(context, modules, max_loras, max_rank)
