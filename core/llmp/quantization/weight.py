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
    """

    blocks: torch.Tensor
    format: BlockFormat
    in_features: int

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

    @property
    def out_features(self) -> int:
        return self.blocks.shape[0]

    @property
    def shape(self) -> tuple[int, int]:
        """The dense weight's shape, ``(out_features, in_features)``, as a checkpoint tensor's."""
        return self.out_features, self.in_features

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The dense ``[out_features, in_features]`` weight (the reference: bit for bit the ``gguf`` package's)."""
        return dequantize(self.blocks, self.format, dtype)

    def narrow(self, start: int, length: int) -> QuantizedWeight:
        """Rows ``start`` .. ``start + length`` (a view)."""
        return QuantizedWeight(self.blocks.narrow(0, start, length), self.format, self.in_features)

    def narrow_columns(self, start: int, length: int) -> QuantizedWeight | None:
        """Input columns ``start`` .. ``start + length`` of every row (a row-parallel rank's share), or None when
        they do not begin and end on block boundaries."""
        size, bytes_ = self.format.block_size, self.format.type_size
        if start % size or length % size:
            return None
        return QuantizedWeight(
            self.blocks.narrow(1, start // size * bytes_, length // size * bytes_), self.format, length
        )

    def take(self, rows: torch.Tensor) -> QuantizedWeight:
        """The rows at indices ``rows``, in that order (a copy)."""
        return QuantizedWeight(self.blocks.index_select(0, rows), self.format, self.in_features)

    @staticmethod
    def stack(parts: list[QuantizedWeight]) -> QuantizedWeight:
        """One weight of the parts' rows in order (a fused q|k|v); the parts share format and ``in_features``."""
        first = parts[0]
        if any(p.format != first.format or p.in_features != first.in_features for p in parts):
            raise ValueError("only weights of one format and input size stack")
        return QuantizedWeight(torch.cat([p.blocks for p in parts]), first.format, first.in_features)

    def to(self, device: torch.device | str) -> QuantizedWeight:
        """The blocks on ``device``, contiguous (a copy unless they already are)."""
        return QuantizedWeight(self.blocks.to(device).contiguous(), self.format, self.in_features)
