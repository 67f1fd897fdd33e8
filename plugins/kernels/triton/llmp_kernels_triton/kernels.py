"""The ``triton`` kernel set: each op is a Triton kernel in its own module (see the launchers there); the
optional parts too: LoRA shrink/expand (``lora``) and matmuls from GGML blocks (``quant_matmul``)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from llmp.api import AttentionMetadata, LoRAMapping
from llmp.quantization import QuantizedWeight
from llmp_kernels_triton import activation, attention, kv_write, lora, quant_matmul, rms_norm, rotary
from llmp_kernels_triton._common import INTERPRET


class TritonKernels:
    name = "triton"

    def __init__(self) -> None:
        # Fail at engine start, not at the first launch deep inside a forward pass
        if not INTERPRET and not torch.cuda.is_available():
            raise RuntimeError(
                "the triton kernel set needs a CUDA device (or TRITON_INTERPRET=1 set before "
                "triton is imported, for tests); use --kernels torch on CPU"
            )

    def rms_norm(
        self, x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        return rms_norm.rms_norm(x, weight, eps, residual)

    def rotary(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return rotary.rotary(positions, q, k, cos_sin)

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        return activation.silu_and_mul(x)

    def gelu_tanh_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        return activation.gelu_tanh_and_mul(x)

    def write_kv(
        self,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        kv_write.write_kv(k, v, k_cache, v_cache, slot_mapping)

    def paged_attention(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        metadata: AttentionMetadata,
        scale: float,
        softcap: float | None = None,
    ) -> torch.Tensor:
        return attention.paged_attention(q, k_cache, v_cache, metadata, scale, softcap)

    def lora_shrink(self, x: torch.Tensor, a: torch.Tensor, mapping: LoRAMapping) -> torch.Tensor:
        return lora.lora_shrink(x, a, mapping)

    def lora_expand(self, y: torch.Tensor, s: torch.Tensor, b: torch.Tensor, mapping: LoRAMapping) -> None:
        lora.lora_expand(y, s, b, mapping)

    def pack_quantized(self, weight: QuantizedWeight) -> Callable[[torch.Tensor], torch.Tensor] | None:
        return quant_matmul.pack_quantized(weight)
