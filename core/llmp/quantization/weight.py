"""A linear layer's weight kept quantised in memory: the rows of a GGML block matrix, as a GGUF file stores them."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from llmp.quantization.ggml import BlockFormat, dequantize

__all__ = ["QuantizedWeight"]


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
    """

    blocks: torch.Tensor
    format: BlockFormat
    in_features: int
    input_order: torch.Tensor | None = None

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
        stored = dequantize(self.blocks, self.format, dtype)
        if self.input_order is None:
            return stored
        dense = torch.empty_like(stored)
        dense[:, self.input_order.to(stored.device)] = stored
        return dense

    def in_stored_order(self) -> QuantizedWeight:
        """The blocks as stored, without :attr:`input_order`: the weight a kernel set computes."""
        return QuantizedWeight(self.blocks, self.format, self.in_features)

    def stacks_with(self, other: QuantizedWeight) -> bool:
        """Whether :meth:`stack` takes the two: one format, input size and input order."""
        orders = (self.input_order, other.input_order)
        return (
            self.format == other.format
            and self.in_features == other.in_features
            and (orders == (None, None) or (None not in orders and torch.equal(*orders)))
        )

    def narrow(self, start: int, length: int) -> QuantizedWeight:
        """Rows ``start`` .. ``start + length`` (a view)."""
        return QuantizedWeight(self.blocks.narrow(0, start, length), self.format, self.in_features, self.input_order)

    def narrow_columns(self, start: int, length: int) -> QuantizedWeight | None:
        """Input columns ``start`` .. ``start + length`` of every row (a row-parallel rank's share), or None when
        they do not begin and end on block boundaries or the columns are stored in another order."""
        size, bytes_ = self.format.block_size, self.format.type_size
        if start % size or length % size or self.input_order is not None:
            return None
        return QuantizedWeight(
            self.blocks.narrow(1, start // size * bytes_, length // size * bytes_), self.format, length
        )

    def take(self, rows: torch.Tensor) -> QuantizedWeight:
        """The rows at indices ``rows``, in that order (a copy)."""
        return QuantizedWeight(self.blocks.index_select(0, rows), self.format, self.in_features, self.input_order)

    @staticmethod
    def stack(parts: list[QuantizedWeight]) -> QuantizedWeight:
        """One weight of the parts' rows in order (a fused q|k|v); the parts share format, ``in_features`` and
        ``input_order``."""
        first = parts[0]
        if not all(first.stacks_with(p) for p in parts):
            raise ValueError("only weights of one format, input size and input order stack")
        return QuantizedWeight(torch.cat([p.blocks for p in parts]), first.format, first.in_features, first.input_order)

    def to(self, device: torch.device | str) -> QuantizedWeight:
        """The blocks on ``device``, contiguous (a copy unless they already are)."""
        order = None if self.input_order is None else self.input_order.to(device)
        return QuantizedWeight(self.blocks.to(device).contiguous(), self.format, self.in_features, order)
