"""Building blocks of models on the paged KV cache.

Every tensor op that a kernel set may speed up goes through ``self.kernels``
(a :class:`llmp.api.KernelSet`); the rest is plain ``torch.nn``. Layers built
under ``torch.device("meta")`` allocate nothing until the runner moves them.
"""

from __future__ import annotations

import re
import weakref
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from llmp.api import AttentionMetadata, KernelSet, ModelLoadError, PacksGatedLinear
from llmp.modeling.parallel import all_gather, all_reduce, divide, tp_rank, tp_size
from llmp.modeling.rope import cos_sin_table
from llmp.quantization import Int8Activations, QuantizedWeight

__all__ = [
    "CausalLM",
    "ColumnParallelLinear",
    "GatedMLP",
    "MergedLinear",
    "PackableLinear",
    "PagedAttention",
    "QuantizedLayers",
    "ParallelLMHead",
    "RMSNorm",
    "RotaryEmbedding",
    "RowParallelLinear",
    "Slice",
    "VocabParallelEmbedding",
    "column_slice",
    "kv_head_slice",
    "load_weights",
    "pack_linear_layers",
    "pack_quantized_layers",
    "row_invariant",
    "token_classifier_method",
    "token_classifier_weight",
    "with_window",
]


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, kernels: KernelSet) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps
        self.kernels = kernels

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> Any:
        """``norm(x)``, or with ``residual`` the pair ``(norm(x + residual), x + residual)``."""
        return self.kernels.rms_norm(x, self.weight, self.eps, residual)


class RotaryEmbedding(nn.Module):
    """Rotates q and k by position; the cos/sin table is built on first use on the input's device."""

    def __init__(
        self, rotary_dim: int, max_positions: int, base: float, scaling: Mapping[str, Any] | None, kernels: KernelSet
    ) -> None:
        super().__init__()
        self.rotary_dim, self.max_positions, self.base, self.scaling = rotary_dim, max_positions, base, scaling
        self.kernels = kernels
        self._table: torch.Tensor | None = None

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.kernels.rotary(positions, q, k, self.table(q.device))

    def table(self, device: torch.device) -> torch.Tensor:
        """The cos|sin table ``[max_positions, rotary_dim]`` (float32) on ``device``."""
        if self._table is None or self._table.device != device:
            self._table = _shared_rotary_table(self.rotary_dim, self.max_positions, self.base, self.scaling, device)
        return self._table


# One table per shape and device, shared by every layer asking for it (a 30-layer model held 30 copies of
# the same 2 MiB table at 8192 positions), held weakly here: it goes with the last layer using it.
_ROTARY_TABLES: weakref.WeakValueDictionary[tuple[Any, ...], torch.Tensor] = weakref.WeakValueDictionary()


def _shared_rotary_table(
    rotary_dim: int, max_positions: int, base: float, scaling: Mapping[str, Any] | None, device: torch.device
) -> torch.Tensor:
    key = (rotary_dim, max_positions, base, repr(sorted((scaling or {}).items())), str(device))
    table = _ROTARY_TABLES.get(key)
    if table is None:
        table = cos_sin_table(rotary_dim, max_positions, base, scaling).to(device)
        _ROTARY_TABLES[key] = table
    return table


class PagedAttention(nn.Module):
    """Writes this step's k/v into the layer's cache blocks, then attends over the cache.

    The model runner sets ``kv_cache`` to this layer's ``(k_cache, v_cache)``,
    each ``[num_blocks, block_size, num_kv_heads, head_dim]``.
    """

    def __init__(
        self,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        scale: float,
        kernels: KernelSet,
        sliding_window: int | None = None,
        softcap: float | None = None,
    ) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = scale
        self.sliding_window = sliding_window
        self.softcap = softcap
        self.kernels = kernels
        self.kv_cache: tuple[torch.Tensor, torch.Tensor] | None = None

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        metadata: AttentionMetadata,
        rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        # q: [T, H, D]; k, v: [T, Hkv, D] -> [T, H * D]. With rows ([R], increasing): q is [R, H, D], the queries
        # of those rows of the step alone, and the output [R, H * D]; every row's k and v are written
        if self.kv_cache is None:
            raise RuntimeError("PagedAttention has no KV cache: the model runner binds one before the first step")
        k_cache, v_cache = self.kv_cache
        self.kernels.write_kv(k, v, k_cache, v_cache, metadata.slot_mapping)
        if rows is not None:
            metadata = rows_metadata(metadata, rows)
        if self.sliding_window != metadata.sliding_window:
            metadata = _with_window(metadata, self.sliding_window)
        if self.softcap is None:
            out = self.kernels.paged_attention(q, k_cache, v_cache, metadata, self.scale)
        else:
            out = self.kernels.paged_attention(q, k_cache, v_cache, metadata, self.scale, softcap=self.softcap)
        return out.reshape(q.shape[0], self.num_heads * self.head_dim)


def rows_metadata(metadata: AttentionMetadata, rows: torch.Tensor) -> AttentionMetadata:
    """``metadata`` for the queries of the step's ``rows`` alone (increasing), its keys and values written:
    each row a one-token query at its own position, over its request's blocks, as in a decode step."""
    ends = metadata.query_start_loc[1:]
    request = torch.searchsorted(ends, rows.to(ends.dtype), right=True)
    seq_lens = (metadata.seq_lens[request] - (ends[request] - 1 - rows)).to(metadata.seq_lens.dtype)
    return AttentionMetadata(
        torch.arange(len(rows) + 1, dtype=metadata.query_start_loc.dtype, device=rows.device),
        seq_lens,
        metadata.block_tables[request],
        metadata.slot_mapping[rows],
        1,
        int(seq_lens.max()) if len(rows) else 0,
        metadata.sliding_window,
    )


def with_window(metadata: AttentionMetadata, window: int | None) -> AttentionMetadata:
    """``metadata`` for a layer attending to the last ``window`` positions (``None``: all)."""
    return metadata if metadata.sliding_window == window else _with_window(metadata, window)


def _with_window(metadata: AttentionMetadata, window: int | None) -> AttentionMetadata:
    return AttentionMetadata(
        metadata.query_start_loc,
        metadata.seq_lens,
        metadata.block_tables,
        metadata.slot_mapping,
        metadata.max_query_len,
        metadata.max_seq_len,
        window,
    )


# -- tensor-parallel linear layers --------------------------------------------
# With one rank they are plain matmuls; with several, each rank holds a slice of
# the weight and loads only that slice from the checkpoint. After loading, a
# kernel set with ``pack_linear`` may take over each matmul (pack_linear_layers).


class PackableLinear(nn.Module):
    """A layer whose ``x @ weight.T`` a kernel set may compute from its own copy of the weight.

    Loaded from a GGUF file, the layer keeps quantised rows in their blocks (``quantized``: output row
    offset -> :class:`QuantizedWeight`) and leaves those rows of ``weight`` untouched (allocated, never
    written: no memory) until :func:`pack_quantized_layers` hands them to the kernel set.
    """

    weight: nn.Parameter
    packed: Callable[[torch.Tensor], torch.Tensor] | None = None
    packed_row_invariant = False  # the packed function's rows are independent already: no row_invariant blocks
    quantized: dict[int, QuantizedWeight] | None = None

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if self.packed is not None:
            return self.packed(x) if self.packed_row_invariant else row_invariant(self.packed, x)
        return row_invariant(lambda rows: F.linear(rows, self.weight, bias), x)

    def packed_bias(self) -> torch.Tensor | None:
        """The bias the packed matmul adds itself (a row-parallel layer adds its own after the all-reduce)."""
        return None

    def keep_quantized(self, offset: int, weight: QuantizedWeight) -> None:
        """Keep ``weight`` as this layer's output rows from ``offset`` on, in its blocks."""
        if self.quantized is None:
            self.quantized = {}
        self.quantized[offset] = weight

    def dense_weight(self) -> torch.Tensor:
        """The whole weight, quantised rows dequantised (a copy when there are any)."""
        if not self.quantized:
            return self.weight.detach()
        weight = self.weight.detach().clone()
        for offset, part in self.quantized.items():
            weight[offset : offset + part.out_features] = part.dequantize(weight.dtype)
        return weight


# Rows of every matmul call on the CPU. oneDNN and MKL pick their kernel, and with it the order in
# which a row's products are summed, by the number of rows (on a Xeon with AMX, bfloat16: 1-32 rows
# one kernel, 33 and more others, changing again with size), so a token's numbers would depend on
# how many tokens share its step: what the prefix cache held, which requests were batched with it.
# Calls of exactly this many rows (the last one padded) make each row's result a function of that
# row alone. The cost: prefill matmuls lose the large-tile kernels' speed; a decode batch of up to
# 32 pays only the padding.
INVARIANT_ROWS = 32


def row_invariant(matmul: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """``matmul(x)`` for x ``[T, in]``; on the CPU in calls of exactly :data:`INVARIANT_ROWS` rows, so that
    a row's output does not depend on the other rows (greedy output then does not depend on the batch)."""
    rows = x.shape[0]
    if x.device.type != "cpu" or rows == INVARIANT_ROWS or rows == 0:
        return matmul(x)
    padded = -(-rows // INVARIANT_ROWS) * INVARIANT_ROWS
    if padded != rows:
        x = F.pad(x, (0, 0, 0, padded - rows))
    if padded == INVARIANT_ROWS:
        return matmul(x)[:rows]
    return torch.cat([matmul(block) for block in x.split(INVARIANT_ROWS)])[:rows]


Slice = tuple[int, int, int]  # (rows of the full checkpoint matrix, first row kept, rows kept)


def column_slice(rows: int) -> Slice:
    """This rank's equal share of ``rows`` output rows."""
    local = divide(rows, tp_size(), "output size")
    return rows, tp_rank() * local, local


def kv_head_slice(num_kv_heads: int, head_dim: int) -> Slice:
    """This rank's KV heads: an equal share, or one replicated head when there are fewer heads than ranks."""
    size, rank = tp_size(), tp_rank()
    if num_kv_heads >= size:
        local = divide(num_kv_heads, size, "number of KV heads")
        return num_kv_heads * head_dim, rank * local * head_dim, local * head_dim
    if size % num_kv_heads:
        raise ValueError(f"tensor-parallel size {size} must divide or be a multiple of the KV heads ({num_kv_heads})")
    return num_kv_heads * head_dim, (rank * num_kv_heads // size) * head_dim, head_dim


class MergedLinear(PackableLinear):
    """One matmul for several checkpoint matrices stacked along the output dim (q|k|v, gate|up),
    each split over ranks by its :data:`Slice`."""

    def __init__(self, in_features: int, shards: Mapping[str, Slice], bias: bool) -> None:
        super().__init__()
        self.in_features = in_features
        self.shard_offsets: dict[str, tuple[int, Slice]] = {}
        offset = 0
        for shard, piece in shards.items():
            self.shard_offsets[shard] = (offset, piece)
            offset += piece[2]
        self.weight = nn.Parameter(torch.empty(offset, in_features))
        self.bias = nn.Parameter(torch.empty(offset)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.matmul(x, self.bias)

    def packed_bias(self) -> torch.Tensor | None:
        return self.bias

    def load_shard(self, shard: str, param_name: str, tensor: torch.Tensor | QuantizedWeight) -> None:
        offset, (rows, start, length) = self.shard_offsets[shard]
        expected = (rows, self.in_features) if param_name == "weight" else (rows,)
        _check_shape(tensor, expected, f"{shard} shard of {param_name}")
        if isinstance(tensor, QuantizedWeight):
            self.keep_quantized(offset, tensor.narrow(start, length))
            return
        getattr(self, param_name).data.narrow(0, offset, length).copy_(tensor.narrow(0, start, length))


class ColumnParallelLinear(MergedLinear):
    """Output rows split over ranks; each rank keeps its slice of the output."""

    def __init__(self, in_features: int, out_features: int, bias: bool) -> None:
        super().__init__(in_features, {"": column_slice(out_features)}, bias)

    def load_weight(self, param_name: str, tensor: torch.Tensor) -> None:
        self.load_shard("", param_name, tensor)

    def shards_of(self, param_name: str) -> tuple[str, ...]:
        return ()  # one checkpoint matrix, loaded by its own name (load_weights expects the name, no shard)


class RowParallelLinear(PackableLinear):
    """Input columns split over ranks; partial outputs are summed over ranks."""

    def __init__(self, in_features: int, out_features: int, bias: bool) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.in_local = divide(in_features, tp_size(), "input size")
        self.weight = nn.Parameter(torch.empty(out_features, self.in_local))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.reduce(self.matmul(x))

    def reduce(self, partial: torch.Tensor) -> torch.Tensor:
        """The layer's output from this rank's partial ``matmul``: summed over ranks, then the bias."""
        out = all_reduce(partial)
        return out + self.bias if self.bias is not None else out

    def load_weight(self, param_name: str, tensor: torch.Tensor | QuantizedWeight) -> None:
        if param_name == "bias":
            _copy_checked(self.bias.data, _dense(tensor), "bias")
            return
        _check_shape(tensor, (self.out_features, self.in_features), param_name)
        if isinstance(tensor, QuantizedWeight):
            share = tensor.narrow_columns(tp_rank() * self.in_local, self.in_local)
            if share is not None:  # a rank's columns on block boundaries stay quantised
                self.keep_quantized(0, share)
                return
            tensor = _dense(tensor)
        self.weight.data.copy_(tensor.narrow(1, tp_rank() * self.in_local, self.in_local))


class VocabParallelEmbedding(nn.Module):
    """Embedding rows split over ranks (the vocabulary padded to a multiple of the rank count).

    Loaded from a GGUF file on one rank, the table stays in its blocks (``quantized_rows``) and each step
    dequantises only the rows it looks up (as the dense table's rows: the same float32 numbers, then
    the model's dtype); a tied LM head then computes from the same blocks.
    """

    quantized_rows: QuantizedWeight | None = None

    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__()
        self.vocab_size, self.hidden_size = vocab_size, hidden_size
        self.rows = -(-vocab_size // tp_size())
        self.start = tp_rank() * self.rows
        self.weight = nn.Parameter(torch.empty(self.rows, hidden_size))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.quantized_rows is not None:
            rows = self.quantized_rows.take(input_ids.reshape(-1)).dequantize(self.weight.dtype)
            return rows.view(*input_ids.shape, self.hidden_size)
        if tp_size() == 1:
            return F.embedding(input_ids, self.weight)
        local = input_ids - self.start
        outside = (local < 0) | (local >= self.rows)
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        return all_reduce(out.masked_fill(outside.unsqueeze(-1), 0))

    def load_weight(self, param_name: str, tensor: torch.Tensor | QuantizedWeight) -> None:
        _check_shape(tensor, (self.vocab_size, self.hidden_size), param_name)
        if isinstance(tensor, QuantizedWeight):
            if self.rows == self.vocab_size:  # one rank's rows: no padding
                if isinstance(self, PackableLinear):  # a head
                    self.keep_quantized(0, tensor)
                else:
                    self.quantized_rows = tensor
                return
            tensor = _dense(tensor)  # split over ranks with padding
        kept = tensor[self.start : self.start + self.rows]
        self.weight.data.zero_()
        self.weight.data[: kept.shape[0]].copy_(kept)


class ParallelLMHead(VocabParallelEmbedding, PackableLinear):
    """Logits over the vocabulary, computed per rank on its rows and gathered."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.gather(self.matmul(hidden))

    def gather(self, logits: torch.Tensor) -> torch.Tensor:
        """The whole vocabulary's logits from this rank's rows (``matmul``): gathered, padding cut."""
        return all_gather(logits, dim=-1)[..., : self.vocab_size] if tp_size() > 1 else logits


def pack_linear_layers(model: nn.Module, kernels: Any) -> int:
    """Let ``kernels.pack_linear`` take over every linear layer's matmul, once, after loading; first, for a
    set with ``pack_gated_linear`` (:class:`llmp.api.PacksGatedLinear`), each gated MLP's gate|up matmul and its
    activation in one pass.

    A layer whose weight was packed drops its dense copy, unless another module
    shares that parameter (a head tied to the embedding). Returns the number of
    layers packed.
    """
    uses = Counter(id(p) for _, p in model.named_parameters(remove_duplicate=False))
    packed = 0
    if isinstance(kernels, PacksGatedLinear):
        for mlp in model.modules():
            if not isinstance(mlp, GatedMLP):
                continue
            layer = mlp.gate_up_proj
            if layer.weight.numel() == 0 or layer.packed is not None or layer.quantized:
                continue  # packed already, or quantised rows
            bias = layer.packed_bias()
            both = kernels.pack_gated_linear(
                layer.weight.detach(), None if bias is None else bias.detach(), mlp.activation
            )
            if both is not None:
                layer.packed, mlp.gated = both
                layer.packed_row_invariant = getattr(layer.packed, "row_invariant", False)
                packed += 1
                if uses[id(layer.weight)] == 1:
                    layer.weight.data = layer.weight.data.new_empty(0)
    for module in model.modules():
        if not isinstance(module, PackableLinear) or module.weight.numel() == 0 or module.packed is not None:
            continue
        bias = module.packed_bias()
        module.packed = kernels.pack_linear(module.weight.detach(), None if bias is None else bias.detach())
        if module.packed is not None:
            module.packed_row_invariant = getattr(module.packed, "row_invariant", False)
            packed += 1
            if uses[id(module.weight)] == 1:
                module.weight.data = module.weight.data.new_empty(0)
    return packed


@dataclass
class QuantizedLayers:
    """What :func:`pack_quantized_layers` did: quantised weights by ``(format name, computed in blocks)``, and
    the bytes the layers now hold (blocks, and dequantised or dense rows)."""

    counts: Counter[tuple[str, bool]] = field(default_factory=Counter)
    nbytes: int = 0


def pack_quantized_layers(model: nn.Module, kernels: Any, dtype: torch.dtype) -> QuantizedLayers:
    """Hand every layer's quantised rows to ``kernels.pack_quantized`` (:class:`llmp.api.PacksQuantized`), once,
    after loading; rows of a format the set does not compute (or every format, for a set without it) are
    dequantised to ``dtype`` and computed as dense rows. A layer's rows of several formats (a fused q|k|v of
    ``Q4_K`` and ``Q6_K``) are computed format by format and concatenated. The set gets the blocks as stored;
    for a weight storing its inputs in another order (``QuantizedWeight.input_order``) the layer gathers x's
    columns in that order first, subtracts ``group_offsets``' share (an asymmetric checkpoint's zero points), and
    for a W8A8 weight (``activations``) quantises x to int8 first.
    """
    from llmp.api import PacksQuantized

    done = QuantizedLayers()
    blocks = _Blocks()
    moved: dict[tuple[int, tuple[int, ...]], QuantizedWeight] = {}

    def on_device(part: QuantizedWeight, device: torch.device) -> QuantizedWeight:
        """The blocks where the layer computes (a GGUF file's are memory-mapped host memory); a tied
        head's blocks, the embedding's, are copied once."""
        if part.blocks.device == device:
            return part
        key = (part.blocks.data_ptr(), tuple(part.blocks.shape))
        if key not in moved:
            moved[key] = part.to(device)
        return moved[key]

    for module in model.modules():
        if isinstance(module, VocabParallelEmbedding) and module.quantized_rows is not None:
            module.quantized_rows = on_device(module.quantized_rows, module.weight.device)
            blocks.add(module.quantized_rows.blocks)
            module.weight.data = module.weight.data.new_empty(0)  # a tied head's too: it computes from the blocks
        if not isinstance(module, PackableLinear) or not module.quantized:
            continue
        pieces = []
        for start, length, part in _row_regions(module):
            if part is None:
                dense = module.weight.detach()[start : start + length].clone()
                done.nbytes += dense.nbytes
                pieces.append(_dense_rows(dense))
                continue
            part = on_device(part, module.weight.device)
            stored = part.in_stored_order()
            compute = kernels.pack_quantized(stored) if isinstance(kernels, PacksQuantized) else None
            done.counts[part.format.name, compute is not None] += 1
            if compute is not None:
                blocks.add(part.blocks)
                if part.group_offsets is not None:
                    compute = _offset(compute, part.group_offsets)
                if part.input_order is not None:
                    compute = _gathered(compute, part.input_order)
            else:
                dense = part.dequantize(dtype)
                done.nbytes += dense.nbytes
                compute = _dense_rows(dense)
            pieces.append(compute if part.activations is None else _quantised_inputs(compute, part.activations))
        module.packed = _concatenated(pieces, module.packed_bias())
        module.packed_row_invariant = True
        module.quantized = None
        module.weight.data = module.weight.data.new_empty(0)
    done.nbytes += blocks.nbytes
    return done


class _Blocks:
    """Bytes of quantised blocks, each storage counted once (a tied head computes from the embedding's)."""

    def __init__(self) -> None:
        self.storages: dict[int, int] = {}

    def add(self, blocks: torch.Tensor) -> None:
        storage = blocks.untyped_storage()
        self.storages[storage.data_ptr()] = max(self.storages.get(storage.data_ptr(), 0), blocks.nbytes)

    @property
    def nbytes(self) -> int:
        return sum(self.storages.values())


def _row_regions(module: PackableLinear) -> list[tuple[int, int, QuantizedWeight | None]]:
    """The layer's output rows as ``(start, length, quantised rows or None for dense ones)``, in order; adjacent
    quantised parts of one format stacked into one."""
    regions: list[tuple[int, int, QuantizedWeight | None]] = []
    position = 0
    for offset, part in sorted((module.quantized or {}).items()):
        if offset > position:
            regions.append((position, offset - position, None))
        previous = regions[-1][2] if regions else None
        if previous is not None and regions[-1][0] + regions[-1][1] == offset and previous.stacks_with(part):
            start, length, _ = regions.pop()
            regions.append((start, length + part.out_features, QuantizedWeight.stack([previous, part])))
        else:
            regions.append((offset, part.out_features, part))
        position = offset + part.out_features
    if position < module.weight.shape[0]:
        regions.append((position, module.weight.shape[0] - position, None))
    return regions


def _gathered(compute: Callable[[torch.Tensor], torch.Tensor], order: torch.Tensor) -> Callable:
    """``compute`` of x's columns taken in ``order`` (a weight whose blocks store its inputs in that order)."""
    return lambda x: compute(x.index_select(-1, order))


def _offset(compute: Callable[[torch.Tensor], torch.Tensor], offsets: torch.Tensor) -> Callable:
    """``compute`` minus each run of x's columns summed times the rows' offsets of that run
    (``QuantizedWeight.group_offsets``), in float32, row by row."""
    runs = offsets.shape[1]

    def offset(x: torch.Tensor) -> torch.Tensor:
        sums = x.float().reshape(x.shape[0], runs, x.shape[1] // runs).sum(-1)  # T = 0 too
        correction = sums * offsets[:, 0] if runs == 1 else row_invariant(lambda rows: F.linear(rows, offsets), sums)
        return (compute(x).float() - correction).to(x.dtype)

    return offset


def _quantised_inputs(compute: Callable[[torch.Tensor], torch.Tensor], activations: Int8Activations) -> Callable:
    """``compute`` of x quantised to int8 first (a W8A8 checkpoint's layer)."""
    return lambda x: compute(activations(x))


def _dense_rows(weight: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda x: row_invariant(lambda rows: F.linear(rows, weight), x)


def _concatenated(
    pieces: list[Callable[[torch.Tensor], torch.Tensor]], bias: torch.Tensor | None
) -> Callable[[torch.Tensor], torch.Tensor]:
    """``x -> cat(piece(x) for piece in pieces) + bias``."""
    bias = None if bias is None else bias.detach()

    def matmul(x: torch.Tensor) -> torch.Tensor:
        out = pieces[0](x) if len(pieces) == 1 else torch.cat([piece(x) for piece in pieces], dim=-1)
        return out if bias is None else out + bias

    return matmul


class GatedMLP(nn.Module):
    """``down(act(gate(x)) * up(x))`` with gate and up fused into one matmul; ``act`` is SiLU
    or, with ``activation="gelu_tanh"``, tanh-approximated GELU (Gemma)."""

    def __init__(
        self, hidden: int, intermediate: int, bias: bool, kernels: KernelSet, activation: str = "silu"
    ) -> None:
        super().__init__()
        shards = {"gate": column_slice(intermediate), "up": column_slice(intermediate)}
        self.gate_up_proj = MergedLinear(hidden, shards, bias=bias)
        self.down_proj = RowParallelLinear(intermediate, hidden, bias=bias)
        activations = {"silu": kernels.silu_and_mul, "gelu_tanh": kernels.gelu_tanh_and_mul}
        if activation not in activations:
            raise ValueError(
                f"gated MLP activation {activation!r} is not supported; supported: {', '.join(activations)}"
            )
        self.act_and_mul = activations[activation]
        self.activation = activation
        # act(gate) * up in one pass from the kernel set (llmp.api.PacksGatedLinear), set by pack_linear_layers
        self.gated: Callable[[torch.Tensor], torch.Tensor] | None = None
        self.block_rows: int | None = getattr(kernels, "mlp_block_rows", None)
        # llmp.modeling.lora.LoRAContext once install_lora adapts gate_up_proj/down_proj: a row block
        # then runs with that block's rows of the step's LoRA mapping
        self.lora_context: Any = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.block_rows is None or x.shape[0] <= self.block_rows:
            return self._mlp(x)
        # a kernel set may ask for row blocks: a long prefill's [T, 2I] activations then stay in cache
        blocks = x.split(self.block_rows)
        if self.lora_context is None:
            return torch.cat([self._mlp(block) for block in blocks])
        out = []
        for index, block in enumerate(blocks):
            with self.lora_context.narrow(index * self.block_rows, block.shape[0]):
                out.append(self._mlp(block))
        return torch.cat(out)

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated is not None and self.lora_context is None:
            return self.down_proj(self.gated(x))
        return self.down_proj(self.act_and_mul(self.gate_up_proj(x)))


class CausalLM(nn.Module):
    """Shared behaviour of the causal LMs built from these layers.

    Subclasses set ``model`` (with ``embed_tokens``), ``lm_head`` and
    ``stacked_params`` (checkpoint name part -> (fused name part, shard)).
    """

    stacked_params: Mapping[str, tuple[str, str]] = {
        ".q_proj.": (".qkv_proj.", "q"),
        ".k_proj.": (".qkv_proj.", "k"),
        ".v_proj.": (".qkv_proj.", "v"),
        ".gate_proj.": (".gate_up_proj.", "gate"),
        ".up_proj.": (".gate_up_proj.", "up"),
    }
    ignored_weights: tuple[str, ...] = ("rotary_emb.inv_freq",)
    tie_word_embeddings: bool = False
    keeps_quantized_weights: bool = True  # load_weights takes QuantizedWeight matrices (a GGUF file's blocks)
    # its forward pass is torch ops whose Python depends on shapes only: on the CPU a decode step may be replayed
    # from a TorchScript trace (llmp.engine.decode_graphs); a module with ``traceable_decode = False`` (MoE
    # routing) anywhere in the model turns that off
    traceable_decode: bool = True
    classifier_weight: torch.Tensor | None = None  # [labels, hidden] float32; set when the config names tokens

    def tie_weights(self) -> None:
        """Share the input embedding with the LM head (again, after ``to_empty`` split them)."""
        if self.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def attention_layers(self) -> list[PagedAttention]:
        """The layers that need a KV cache, in order."""
        return [m for m in self.modules() if isinstance(m, PagedAttention)]

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden_states)

    def classify(self, hidden: torch.Tensor) -> torch.Tensor:
        """An LLM reranker's scores from its LM head: ``[N, hidden]`` -> ``[N, labels]`` float32.

        Only for a config with ``classifier_token_ids`` (``classifier_from_token`` resolved by
        the tokenizer, e.g. ``["no", "yes"]`` of Qwen3-Reranker): ``from_2_way_softmax`` gives
        ``logits[yes] - logits[no]`` (one label), ``no_post_processing`` the tokens' logits.
        The model keeps generating; only those rows of the head are multiplied.
        """
        if self.classifier_weight is None:
            raise TypeError(
                f"{type(self).__name__} has no classification head: its config names no classifier_from_token"
            )
        weight = self.classifier_weight  # row by row: a score does not depend on its batch
        return row_invariant(lambda rows: F.linear(rows, weight), hidden.float())

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        tied = self.lm_head.weight is self.model.embed_tokens.weight
        ignored = (*self.ignored_weights, *(("lm_head.weight",) if tied else ()))
        load_weights(self, weights, self.stacked_params, ignored)
        if tied and (blocks := self.model.embed_tokens.quantized_rows) is not None:
            self.lm_head.keep_quantized(0, blocks)  # the head computes from the embedding's blocks
        self.bind_token_classifier()

    def bind_token_classifier(self) -> None:
        """Copy the classifier tokens' rows out of the loaded LM head (before a kernel set packs it)."""
        config = getattr(self, "config", None)
        method = token_classifier_method(config, live=True)
        if method is None:
            return
        head = self.lm_head
        ids = torch.tensor(config.classifier_token_ids, device=head.weight.device)
        if int(ids.min()) < 0 or int(ids.max()) >= head.vocab_size:
            raise ModelLoadError(f"classifier token ids {ids.tolist()} are outside the vocabulary ({head.vocab_size})")
        local = ids - head.start  # the head's rows are split over ranks: each rank adds the rows it holds
        held = (local >= 0) & (local < head.rows)
        rows = head.dense_weight()[local.clamp(0, head.rows - 1)].float() * held[:, None]
        self.classifier_weight = token_classifier_weight(all_reduce(rows), method)


TOKEN_CLASSIFIER_METHODS = ("from_2_way_softmax", "no_post_processing")


def token_classifier_method(config: Any, *, live: bool = False) -> str | None:
    """How the config's ``classifier_token_ids`` become a classifier (vLLM's ``method``), or None.

    A ``*ForSequenceClassification`` with token ids but no method loads its ``score`` head
    from the checkpoint, as vLLM does; a ``live`` causal LM has no such head, so it scores with
    the tokens' own logits (``no_post_processing``: one label per token, as
    ``llmp.modeling.pooling.num_labels`` counts them).
    """
    ids = getattr(config, "classifier_token_ids", None)
    if not ids:
        return None
    method = getattr(config, "method", None)
    if method is None and live:
        method = "no_post_processing"
    if method is not None and method not in TOKEN_CLASSIFIER_METHODS:
        raise ValueError(f"method {method!r} is not supported; supported: {', '.join(TOKEN_CLASSIFIER_METHODS)}")
    if method == "from_2_way_softmax" and len(ids) != 2:
        raise ValueError(f"from_2_way_softmax takes two classifier tokens ([no, yes]), got {len(ids)}")
    return method


def token_classifier_weight(rows: torch.Tensor, method: str) -> torch.Tensor:
    """The classifier matrix from the LM head's rows of the classifier tokens (float32, in token order)."""
    rows = rows.float()
    if method == "from_2_way_softmax":  # softmax over (no, yes) is sigmoid(yes - no): one logit
        return rows[1:2] - rows[0:1]
    return rows


def load_weights(
    model: nn.Module,
    weights: Iterable[tuple[str, torch.Tensor]],
    stacked_params: Mapping[str, tuple[str, str]] = {},
    ignored: tuple[str, ...] = (),
) -> None:
    """Copy checkpoint tensors into ``model`` by Hugging Face name.

    ``stacked_params`` maps a checkpoint name part to a fused module and shard
    (``".q_proj." -> (".qkv_proj.", "q")``); names containing a part of
    ``ignored`` are skipped. Layers with ``load_weight``/``load_shard`` keep only
    their rank's slice. Raises ``ModelLoadError`` for an unknown, misshapen or
    missing weight.
    """
    params = dict(model.named_parameters())
    loaded: set[str] = set()
    for name, tensor in weights:
        if any(part in name for part in ignored):
            continue
        stacked = _expert_target(name) or next(
            ((name.replace(part, fused), shard) for part, (fused, shard) in stacked_params.items() if part in name),
            None,
        )
        if stacked is not None:
            target, shard = stacked
            module_name, param_name = target.rsplit(".", 1)
            with _naming(name, model):
                model.get_submodule(module_name).load_shard(shard, param_name, tensor)
            loaded.add(f"{target}:{shard}")
        else:
            if name not in params:
                raise ModelLoadError(f"checkpoint weight {name!r} has no place in {type(model).__name__}")
            module_name, param_name = name.rsplit(".", 1)
            module = model.get_submodule(module_name)
            if hasattr(module, "load_weight"):  # a parallel layer keeps only its rank's slice
                with _naming(name, model):
                    module.load_weight(param_name, tensor)
            else:
                _copy_checked(params[name].data, _dense(tensor), name)
            loaded.add(name)
    expected = set()
    for name in params:
        module_name, param_name = name.rsplit(".", 1)
        module = model.get_submodule(module_name)
        shards = (
            module.shards_of(param_name) if hasattr(module, "shards_of") else getattr(module, "shard_offsets", None)
        )
        expected |= {f"{name}:{s}" for s in shards} if shards else {name}
    missing = sorted(_checkpoint_name(key, stacked_params) for key in expected - loaded)
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise ModelLoadError(f"checkpoint lacks weights of {type(model).__name__}: {shown}")


@contextmanager
def _naming(name: str, model: nn.Module) -> Iterator[None]:
    """Prefix a loading error with the checkpoint weight at fault (a layer only knows its own part)."""
    try:
        yield
    except ModelLoadError as exc:
        raise ModelLoadError(
            f"checkpoint weight {name!r} does not fit {type(model).__name__} "
            f"(does config.json match the weights?): {exc}"
        ) from None


def _checkpoint_name(key: str, stacked_params: Mapping[str, tuple[str, str]]) -> str:
    """The checkpoint's name for a missing ``fused:shard`` key (``gate_up_proj.weight:up`` -> ``up_proj.weight``)."""
    name, _, shard = key.partition(":")
    for part, (fused, fused_shard) in stacked_params.items():
        if shard == fused_shard and fused in name:
            return name.replace(fused, part)
    return key


# One expert's matrix of a mixture-of-experts layer: ``...experts.<index>.<proj>.weight``
# (Mixtral names them w1/w3/w2, Qwen-MoE gate_proj/up_proj/down_proj).
_EXPERT_WEIGHT = re.compile(r"\.experts\.(\d+)\.(w1|w2|w3|gate_proj|up_proj|down_proj)\.weight$")
_EXPERT_SHARDS = {
    "w1": ("w13", "gate"),
    "gate_proj": ("w13", "gate"),
    "w3": ("w13", "up"),
    "up_proj": ("w13", "up"),
    "w2": ("w2", "down"),
    "down_proj": ("w2", "down"),
}


def _expert_target(name: str) -> tuple[str, str] | None:
    """``(fused parameter name, "<expert>:<shard>")`` for an expert's weight, else None."""
    match = _EXPERT_WEIGHT.search(name)
    if match is None:
        return None
    param, shard = _EXPERT_SHARDS[match.group(2)]
    return f"{name[: match.start()]}.experts.{param}", f"{match.group(1)}:{shard}"


def _dense(tensor: torch.Tensor | QuantizedWeight) -> torch.Tensor:
    """A checkpoint tensor as numbers: a quantised one dequantised (for a layer that does not keep blocks). A
    W8A8 weight's int8 inputs are applied only around its blocks: held dense, they would be lost, so it is refused."""
    if not isinstance(tensor, QuantizedWeight):
        return tensor
    if tensor.activations is not None:
        raise ModelLoadError(
            "a W8A8 weight (int8 inputs) must stay in its blocks, and this layer holds it dense (a tensor-parallel "
            "share that does not split it on 32-column blocks, or a layer that keeps no quantised weights)"
        )
    return tensor.dequantize()


def _check_shape(tensor: torch.Tensor | QuantizedWeight, expected: tuple[int, ...], name: str) -> None:
    if tuple(tensor.shape) != tuple(expected):
        raise ModelLoadError(f"{name} has shape {tuple(tensor.shape)}, the model expects {tuple(expected)}")


def _copy_checked(target: torch.Tensor, tensor: torch.Tensor, name: str) -> None:
    _check_shape(tensor, tuple(target.shape), name)
    target.copy_(tensor)
