"""Compiled CPU kernels: the cpu set, with the parts the compiled library does better replaced.

- **Quantised linear layers** (``pack_quantized``) compute ``x @ W.T`` straight from the GGML blocks of a
  GGUF file (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and Q2_K to Q6_K): each tile of weight rows is dequantised to
  float32 in registers and L1 (the reference's values, bit for bit) and multiplied with every input row, so
  the weight is read once per call in its quantised size. A row's result depends only on that row (one fixed
  summation order), and work is split over output columns only, so it does not depend on the thread count.
- **Dense bfloat16 linear layers** (``pack_linear``, on CPUs with AVX-512 BF16 and no AMX) multiply a copy of
  the weight packed in panels of 64 columns with ``vdpbf16ps``, each output one float32 lane accumulated over K
  in order whatever the batch: the layer then calls it on the rows it has, where oneDNN's packed matmul (the
  ``cpu`` set's, used elsewhere) is called in padded 32-row blocks to keep a row's bits independent of the batch.
  A decode step of one sequence multiplies one row instead of 32, and a prefill reads each weight panel once per
  96 rows instead of the whole weight every 32.
- **Attention** (``paged_attention``) reads keys and values through the block table where they lie (no
  gather, no query block padded to 16 rows for one decode token), each KV head's tile of keys shared by its
  query heads, with sliding windows and soft-capping. Every query row is computed alone in an order fixed by
  its position (key tiles aligned to absolute positions), so a token's numbers are the same cold, warm,
  chunked, alone or batched, as the reference's plan of aligned query blocks makes them for the other sets.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from llmp_kernels_cpu.kernels import CpuKernels

from llmp.api import AttentionMetadata
from llmp.quantization import QuantizedWeight
from llmp_kernels_cpu_native.library import dense_chosen, load, quant_matmul_types


class QuantizedLinear:
    """``x @ W.T`` for x ``[..., in_features]``, ``W`` kept as its GGML blocks."""

    def __init__(self, weight: QuantizedWeight) -> None:
        self.blocks = weight.blocks.contiguous()  # a view of the file's bytes when they already are
        self.ggml_type = weight.format.ggml_type
        self.in_features = weight.in_features

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        out = torch.ops.llmp_native.quant_matmul(rows, self.blocks, self.ggml_type, self.in_features)
        return out.reshape(*x.shape[:-1], out.shape[-1])


class DenseLinear:
    """``x @ weight.T (+ bias)`` in bfloat16 with AVX-512 BF16, each row alone: called on the batch as it is.

    The weight is packed in panels (the layer then drops its own copy; a head tied to the embedding keeps both)."""

    row_invariant = True  # one fixed summation order per row: no 32-row blocks (llmp.api.PacksLinear)

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.out_features, self.in_features = weight.shape
        self.panels = torch.ops.llmp_native.dense_pack(weight)
        self.bias = bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        out = torch.ops.llmp_native.dense_matmul(rows, self.panels, self.out_features, self.bias)
        return out.reshape(*x.shape[:-1], self.out_features)


class NativeKernels(CpuKernels):
    name = "cpu-native"

    def __init__(self) -> None:
        super().__init__()
        self.isa = load()

    def pack_linear(
        self, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> Callable[[torch.Tensor], torch.Tensor] | None:
        if weight.device.type == "cpu" and weight.dim() == 2 and weight.dtype == torch.bfloat16 and dense_chosen():
            return DenseLinear(weight, bias)
        return super().pack_linear(weight, bias)

    def pack_quantized(self, weight: QuantizedWeight) -> Callable[[torch.Tensor], torch.Tensor] | None:
        if weight.blocks.device.type != "cpu" or weight.format.ggml_type not in quant_matmul_types():
            return None
        return QuantizedLinear(weight)

    def paged_attention(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        metadata: AttentionMetadata,
        scale: float,
        softcap: float | None = None,
    ) -> torch.Tensor:
        if q.device.type != "cpu":
            return super().paged_attention(q, k_cache, v_cache, metadata, scale, softcap)
        return torch.ops.llmp_native.paged_attention(
            q,
            k_cache,
            v_cache,
            metadata.query_start_loc,
            metadata.seq_lens,
            metadata.block_tables,
            scale,
            softcap or 0.0,
            metadata.sliding_window or 0,
        )
