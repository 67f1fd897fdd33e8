"""A linear layer's weight kept quantised in memory: the rows of a GGML block matrix, as a GGUF file stores them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from llmp.quantization.ggml import BlockFormat, dequantize

__all__ = ["Int8Activations", "QuantizedWeight"]


@dataclass(frozen=True)
class Int8Activations:
    """A layer whose inputs are quantised to int8 before its matmul (a W8A8 checkpoint's ``input_activations``):
    each row of x becomes ``clamp(round(x / s), -128, 127) * s``, symmetric, ``s`` the row's ``max |x| / 127``
    (``scale`` None: dynamic, per token) or the checkpoint's static per-tensor ``scale``. The products are then
    those of the int8 values, as an int8 kernel's, scaled back in float32 (each row on its own: row invariant)."""

    scale: float | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.float()
        scale: torch.Tensor | float = self.scale if self.scale is not None else rows.abs().amax(-1, keepdim=True)
        if self.scale is None:
            scale = torch.where(scale > 0, scale / 127.0, 1.0)  # an all-zero row stays zero
        return torch.round(rows / scale).clamp_(-128, 127).mul_(scale).to(x.dtype)


@dataclass(frozen=True)
class QuantizedWeight:
    """``out_features`` rows of ``in_features`` weights each, every row a run of whole ``format`` blocks.

    ``blocks`` is uint8 ``[out_features, in_features // format.block_size * format.type_size]``,
    row-major, as the GGUF file holds the tensor (often a read-only view of the memory-mapped file).
    Rows are independent, so slicing and reordering rows (tensor-parallel output slices, fused
    q|k|v shards, llama.cpp's q/k permutation) keeps the blocks as they are.

    ``input_order`` (int64 ``[in_features]``, or ``None`` for the natural order): the blocks hold the
    weight's input columns in this order, ``W[:, input_order]``, and the layer computes
    ``x[:, input_order] @ blocks.T``. An act-order GPTQ checkpoint's shuffled groups become contiguous
    blocks this way. Kernel sets never see it: the model runner gathers the columns of x before calling
    the set's matmul (:func:`llmp.modeling.layers.pack_quantized_layers`), and :meth:`dequantize` puts
    the columns back.

    ``activations``: the layer's inputs are quantised to int8 first (:class:`Int8Activations`, a W8A8
    checkpoint), by the model runner too, whichever set computes the blocks.

    ``group_offsets`` (float32 ``[out_features, G]``, or ``None``): an asymmetric integer checkpoint's zero
    points, where its levels ``q - zero`` do not fit a block format but ``q`` does. The input columns (in
    stored order) are G equal runs, and the weight is the blocks' values minus the row's offset of each run:
    ``W[n, k] = blocks[n, k] - group_offsets[n, k // (in_features / G)]``. The model runner subtracts each
    run's sum of x times the offsets from the set's matmul.
    """

    blocks: torch.Tensor
    format: BlockFormat
    in_features: int
    input_order: torch.Tensor | None = None
    activations: Int8Activations | None = None
    group_offsets: torch.Tensor | None = None

    def __post_init__(self) -> None:
        fmt = self.format
        if self.blocks.dtype != torch.uint8 or self.blocks.dim() != 2:
            raise ValueError(
                f"{fmt.name} weight blocks must be uint8 [rows, bytes], not {self.blocks.dtype} "
                f"{tuple(self.blocks.shape)}"
            )
        if (
            self.in_features % fmt.block_size
            or self.blocks.shape[1] != self.in_features // fmt.block_size * fmt.type_size
        ):
            raise ValueError(
                f"{self.blocks.shape[1]} bytes per row do not hold {self.in_features} {fmt.name} weights "
                f"(blocks of {fmt.block_size} in {fmt.type_size} bytes)"
            )
        order = self.input_order
        if order is not None and (order.dtype != torch.int64 or tuple(order.shape) != (self.in_features,)):
            raise ValueError(f"input_order must be int64 [{self.in_features}], not {order.dtype} {tuple(order.shape)}")
        offsets = self.group_offsets
        if offsets is not None and (
            offsets.dtype != torch.float32
            or offsets.dim() != 2
            or offsets.shape[0] != self.out_features
            or self.in_features % offsets.shape[1]
        ):
            raise ValueError(
                f"group_offsets must be float32 [{self.out_features}, G], G dividing {self.in_features}, not "
                f"{offsets.dtype} {tuple(offsets.shape)}"
            )

    @property
    def out_features(self) -> int:
        return self.blocks.shape[0]

    @property
    def shape(self) -> tuple[int, int]:
        """The dense weight's shape, ``(out_features, in_features)``, as a checkpoint tensor's."""
        return self.out_features, self.in_features

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The dense ``[out_features, in_features]`` weight (the reference: bit for bit the ``gguf`` package's),
        its columns in their natural order."""
        if self.group_offsets is None:
            stored = dequantize(self.blocks, self.format, dtype)
        else:  # exact in float32: each value and offset a small integer times a float16 scale, and so their difference
            runs = self.in_features // self.group_offsets.shape[1]
            offsets = self.group_offsets.to(self.blocks.device).repeat_interleave(runs, dim=1)
            stored = (dequantize(self.blocks, self.format) - offsets).to(dtype)
        if self.input_order is None:
            return stored
        dense = torch.empty_like(stored)
        dense[:, self.input_order.to(stored.device)] = stored
        return dense

    def in_stored_order(self) -> QuantizedWeight:
        """The blocks alone (no :attr:`input_order` or :attr:`group_offsets`): the weight a kernel set computes."""
        return QuantizedWeight(self.blocks, self.format, self.in_features)

    def stacks_with(self, other: QuantizedWeight) -> bool:
        """Whether :meth:`stack` takes the two: one format, input size, input order, activations and runs of
        group offsets (or none)."""
        orders = (self.input_order, other.input_order)
        runs = [None if w.group_offsets is None else w.group_offsets.shape[1] for w in (self, other)]
        return (
            self.format == other.format
            and self.in_features == other.in_features
            and self.activations == other.activations
            and runs[0] == runs[1]
            and (orders == (None, None) or (None not in orders and torch.equal(*orders)))
        )

    def narrow(self, start: int, length: int) -> QuantizedWeight:
        """Rows ``start`` .. ``start + length`` (a view)."""
        return self._rows(lambda t: t.narrow(0, start, length))

    def narrow_columns(self, start: int, length: int) -> QuantizedWeight | None:
        """Input columns ``start`` .. ``start + length`` of every row (a row-parallel rank's share), or None when
        they do not begin and end on block boundaries or the columns are stored in another order."""
        size, bytes_ = self.format.block_size, self.format.type_size
        if start == 0 and length == self.in_features:  # one rank: the whole weight, its order and offsets with it
            return self
        if start % size or length % size or self.input_order is not None or self.group_offsets is not None:
            return None
        return QuantizedWeight(
            self.blocks.narrow(1, start // size * bytes_, length // size * bytes_),
            self.format,
            length,
            activations=self.activations,  # a rank quantises its own share of each row, as vLLM's does
        )

    def take(self, rows: torch.Tensor) -> QuantizedWeight:
        """The rows at indices ``rows``, in that order (a copy)."""
        return self._rows(lambda t: t.index_select(0, rows.to(t.device)))

    @staticmethod
    def stack(parts: list[QuantizedWeight]) -> QuantizedWeight:
        """One weight of the parts' rows in order (a fused q|k|v); the parts share format, ``in_features``,
        ``input_order`` and ``activations``."""
        first = parts[0]
        if not all(first.stacks_with(p) for p in parts):
            raise ValueError("only weights of one format, input size, input order, activations and offset runs stack")
        offsets = None if first.group_offsets is None else torch.cat([p.group_offsets for p in parts])
        return first._replaced(torch.cat([p.blocks for p in parts]), offsets)

    def to(self, device: torch.device | str) -> QuantizedWeight:
        """The blocks on ``device``, contiguous (a copy unless they already are)."""
        order = None if self.input_order is None else self.input_order.to(device)
        offsets = None if self.group_offsets is None else self.group_offsets.to(device)
        return QuantizedWeight(
            self.blocks.to(device).contiguous(), self.format, self.in_features, order, self.activations, offsets
        )

    def _rows(self, rows: Callable[[torch.Tensor], torch.Tensor]) -> QuantizedWeight:
        """Other rows of this weight (``rows`` applied to the blocks and to the offsets)."""
        return self._replaced(rows(self.blocks), None if self.group_offsets is None else rows(self.group_offsets))

    def _replaced(self, blocks: torch.Tensor, offsets: torch.Tensor | None) -> QuantizedWeight:
        return QuantizedWeight(blocks, self.format, self.in_features, self.input_order, self.activations, offsets)
