"""Compiled CPU kernels: the cpu set, with the parts the compiled library does better replaced.

- **Quantised linear layers** (``pack_quantized``) compute ``x @ W.T`` straight from the GGML blocks of a
  GGUF file (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and Q2_K to Q6_K): each tile of weight rows is dequantised to
  float32 in registers and L1 (the reference's values, bit for bit) and multiplied with every input row, so
  the weight is read once per call in its quantised size. A row's result depends only on that row (one fixed
  summation order), and work is split over output columns only, so it does not depend on the thread count.
- **Dense bfloat16 linear layers** (``pack_linear``, on CPUs with AVX2 at least) multiply a copy of the weight
  packed in panels of 64 columns, each output accumulated in float32 over K in an order that does not depend on
  the batch: ``vdpbf16ps`` pairs, AMX tiles where the CPU has them, or on a CPU without AVX-512 BF16 the same
  pairs widened to float32 in AVX2 registers (``library.dense_path``), where oneDNN would multiply a float32
  copy of the weight (twice the bytes a decoded token reads). The layer then
  calls it on the rows it has, where oneDNN's packed matmul (the ``cpu`` set's, used elsewhere) is called in
  padded 32-row blocks to keep a row's bits independent of the batch. A decode step of one sequence multiplies
  one row instead of 32, and a prefill reads each weight panel once per chunk of rows that stays in L2 instead
  of the whole weight every 32 rows. A gated MLP's gate|up matmul (``pack_gated_linear``, on the pairs) writes
  SiLU(gate) * up from its tiles' epilogue, with the bits of the matmul and ``silu_and_mul`` in turn.
- **Attention** (``paged_attention``) reads keys and values through the block table where they lie (no
  gather, no query block padded to 16 rows for one decode token), each KV head's tile of keys shared by its
  query heads, with sliding windows and soft-capping. Every query row is computed alone in an order fixed by
  its position (key tiles aligned to absolute positions), so a token's numbers are the same cold, warm,
  chunked, alone or batched, as the reference's plan of aligned query blocks makes them for the other sets.
  Float32 arithmetic in tiles of 16 keys, except bfloat16 queries over a bfloat16 cache on AVX-512 BF16 CPUs:
  there products of bfloat16 pairs (``vdpbf16ps``) in tiles of 32 keys, the weights rounded to bfloat16 for
  the product with the values as torch's flash attention rounds them, each thread's keys prefetched ahead.
- **A decode step's decoder layer** (``pack_decoder_layer``, with the pairs) in one call: the layer's ops in
  turn with their bits, in one OpenMP region whose threads split each product and the attention and wait at a
  barrier while the first runs the row kernels, where one op at a time is a region each (121 a SmolLM2-135M step
  at batch 1, whose threads are woken for each and wait for each other at its end).
- **Greedy tokens** (``argmax``): each row's first largest value in one pass over the logits.
- **Row-wise ops** (``rms_norm`` with or without the residual, ``rotary`` in place, ``silu_and_mul``,
  ``gelu_tanh_and_mul``, and ``write_kv``, into a cache of any of these dtypes) in one pass each over float32,
  bfloat16 or float16 rows, where torch runs a chain of small ops (a float32 RMSNorm with its residual add is
  seven dispatches: at batch 1 they cost more than the arithmetic). In float32, ``rotary`` and ``write_kv`` give
  the reference's bits (no FMA contraction, a copy or ``.to()``'s rounding); RMSNorm and SiLU-and-mul differ from
  it by a few ulps (the RMS sum's order, the exponential's last bits); float32 GELU stays on the reference (the
  compiled tanh, 1 - 2 / (exp(2y) + 1), loses small values' float32 precision).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from llmp_kernels_cpu.kernels import CpuKernels, half_matmul_path

from llmp.api import AttentionMetadata, DecoderLayerParts
from llmp.quantization import QuantizedWeight
from llmp_kernels_cpu_native.library import dense_chosen, dense_on_pairs, dense_path, load, quant_matmul_types

ROW_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # the row-wise ops' dtypes


def _native_rows(x: torch.Tensor, *others: torch.Tensor) -> bool:
    return x.device.type == "cpu" and x.dtype in ROW_DTYPES and all(t.dtype == x.dtype for t in others)


class QuantizedLinear:
    """``x @ W.T`` for x ``[..., in_features]``, ``W`` kept as its GGML blocks."""

    def __init__(self, weight: QuantizedWeight) -> None:
        self.blocks = weight.blocks.contiguous()  # a view of the file's bytes when they already are
        self.ggml_type = weight.format.ggml_type
        self.in_features = weight.in_features

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2:  # a step's rows as they are: no reshape (each is a dispatch in a decode step's trace)
            return torch.ops.llmp_native.quant_matmul(x, self.blocks, self.ggml_type, self.in_features)
        rows = x.reshape(-1, self.in_features)
        out = torch.ops.llmp_native.quant_matmul(rows, self.blocks, self.ggml_type, self.in_features)
        return out.reshape(*x.shape[:-1], out.shape[-1])


class DenseLinear:
    """``x @ weight.T (+ bias)`` in bfloat16, float32 sums, each row alone: called on the batch as it is.

    The weight is packed in panels (the layer then drops its own copy; a head tied to the embedding keeps both)."""

    row_invariant = True  # one fixed summation order per row: no 32-row blocks (llmp.api.PacksLinear)

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.out_features, self.in_features = weight.shape
        self.panels = torch.ops.llmp_native.dense_pack(weight)
        self.bias = bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2:  # a step's rows as they are: no reshape (each is a dispatch in a decode step's trace)
            return torch.ops.llmp_native.dense_matmul(x, self.panels, self.out_features, self.bias)
        rows = x.reshape(-1, self.in_features)
        out = torch.ops.llmp_native.dense_matmul(rows, self.panels, self.out_features, self.bias)
        return out.reshape(*x.shape[:-1], self.out_features)


class DenseGatedLinear:
    """A gated MLP's gate|up matmul from panels of 32 gate and the same 32 up columns (``dense_pack_gated``):
    ``silu(gate) * up`` ``[..., I]`` written by the tiles' epilogue (``gated``), so the ``[T, 2I]`` product is
    never stored and read back, or ``gate|up`` ``[..., 2I]`` as ``DenseLinear`` gives it. The bits of
    ``DenseLinear`` and then ``silu_and_mul``: each row alone, as they are."""

    row_invariant = True

    def __init__(self, panels: torch.Tensor, half: int, in_features: int, bias: torch.Tensor | None, gated: bool):
        self.panels, self.half, self.in_features, self.bias, self.gated = panels, half, in_features, bias, gated

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2:
            return torch.ops.llmp_native.dense_gated_matmul(x, self.panels, self.half, self.bias, self.gated)
        rows = x.reshape(-1, self.in_features)
        out = torch.ops.llmp_native.dense_gated_matmul(rows, self.panels, self.half, self.bias, self.gated)
        return out.reshape(*x.shape[:-1], out.shape[-1])


def gated_linear(weight: torch.Tensor, bias: torch.Tensor | None) -> tuple[DenseGatedLinear, DenseGatedLinear]:
    """``(plain, gated)`` of a bfloat16 gate|up weight ``[2I, K]``, sharing one packed copy (the pairs path)."""
    half, in_features = weight.shape[0] // 2, weight.shape[1]
    panels = torch.ops.llmp_native.dense_pack_gated(weight)
    ordered = None if bias is None else _panel_order(bias, half)
    return (
        DenseGatedLinear(panels, half, in_features, ordered, gated=False),
        DenseGatedLinear(panels, half, in_features, ordered, gated=True),
    )


def _panel_order(bias: torch.Tensor, half: int) -> torch.Tensor:
    """A gate|up bias ``[2I]`` in the order of ``dense_pack_gated``'s columns: 32 gate, the same 32 up, ..."""
    panels = (half + 31) // 32
    gate, up = torch.zeros(panels * 32), torch.zeros(panels * 32)
    gate[:half], up[:half] = bias[:half].float(), bias[half:].float()
    return torch.stack([gate.view(panels, 32), up.view(panels, 32)], dim=1).reshape(-1)


class FusedDecoderLayer:
    """A Llama-shaped decoder layer of a decode step in one call (``llmp_native::decoder_layer``), from the
    layer's own packed products: ``(out, residual)`` with the bits of its parts, or None for inputs it does not
    compute (not bfloat16, a cache of another dtype), which the layer then runs part by part."""

    def __init__(
        self, parts: DecoderLayerParts, qkv: DenseLinear, o: DenseLinear, gated: DenseGatedLinear, down: DenseLinear
    ) -> None:
        self.parts, self.qkv, self.o, self.gated, self.down = parts, qkv, o, gated, down
        self.softcap = parts.softcap or 0.0
        self.window = parts.sliding_window or 0

    def __call__(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        metadata: AttentionMetadata,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        cos_sin: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        p = self.parts
        rows = hidden.dim() == 2 and hidden.dtype == torch.bfloat16 and hidden.is_contiguous()
        caches = (
            k_cache.dtype == v_cache.dtype == torch.bfloat16 and k_cache.is_contiguous() and v_cache.is_contiguous()
        )
        table = cos_sin.dtype == torch.float32 and cos_sin.shape[-1] == p.head_dim
        if not (rows and caches and table and (residual is None or residual.dtype == torch.bfloat16)):
            return None
        return torch.ops.llmp_native.decoder_layer(
            hidden,
            residual,
            p.input_norm,
            self.qkv.panels,
            self.qkv.out_features,
            self.qkv.bias,
            positions,
            cos_sin,
            p.num_heads,
            p.num_kv_heads,
            p.head_dim,
            k_cache,
            v_cache,
            metadata.slot_mapping,
            metadata.query_start_loc,
            metadata.seq_lens,
            metadata.block_tables,
            p.scale,
            self.softcap,
            self.window,
            self.o.panels,
            p.post_attention_norm,
            p.eps,
            self.gated.panels,
            self.gated.half,
            self.gated.bias,
            self.down.panels,
        )


class NativeKernels(CpuKernels):
    name = "cpu-native"
    # every op of a step is a torch op (no Python decision on tensor values): the engine may replay decode steps
    # from a TorchScript trace (llmp.engine.decode_graphs), whose C++ dispatch saves ~3 ms a step at batch 1
    traceable_decode = True

    def __init__(self) -> None:
        super().__init__()
        self.isa = load()

    def isa_path(self, device: str, dtype: str) -> str:
        """The instruction set of its loops, then what multiplies bfloat16 layers: its own ``dense_matmul`` path
        (amx tiles, avx512-bf16 pairs, avx2 pairs) or, where that does not run or is not chosen, the cpu set's."""
        loops = "scalar loops" if self.isa == "scalar" else f"{self.isa.upper()} loops"
        if dtype == "bfloat16" and dense_chosen():
            return f"{loops}, bfloat16 matmul {dense_path()}"
        return ", ".join([loops, half] if (half := half_matmul_path(dtype)) else [loops])

    def pack_linear(
        self, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> Callable[[torch.Tensor], torch.Tensor] | None:
        if weight.device.type == "cpu" and weight.dim() == 2 and weight.dtype == torch.bfloat16 and dense_chosen():
            return DenseLinear(weight, bias)
        return super().pack_linear(weight, bias)

    def pack_gated_linear(
        self, weight: torch.Tensor, bias: torch.Tensor | None, activation: str
    ) -> tuple[Callable[[torch.Tensor], torch.Tensor], Callable[[torch.Tensor], torch.Tensor]] | None:
        # SiLU on the pairs (either form); AMX tiles (and GELU) keep the matmul and then the row kernel
        dense = weight.device.type == "cpu" and weight.dim() == 2 and weight.dtype == torch.bfloat16
        if activation != "silu" or not dense or weight.shape[0] % 2 or not dense_chosen():
            return None
        return gated_linear(weight, bias) if dense_on_pairs() else None

    def rms_norm(
        self, x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            if _native_rows(x, weight):
                return torch.ops.llmp_native.rms_norm(x, weight, eps)
        elif _native_rows(x, weight, residual) and residual.shape == x.shape:
            return torch.ops.llmp_native.add_rms_norm(x, residual, weight, eps)
        return super().rms_norm(x, weight, eps, residual)

    def rotary(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # in place: q and k are this step's fresh projections (views of one fused output); float32 too, where
        # x1 * cos - x2 * sin, each operation rounded, gives the reference's bits
        same = q.dtype == k.dtype and q.device.type == "cpu"
        if same and cos_sin.shape[-1] == q.shape[-1] and cos_sin.dtype == torch.float32:
            torch.ops.llmp_native.rotary_(positions, q, k, cos_sin)
            return q, k
        return super().rotary(positions, q, k, cos_sin)  # partial rotary

    def write_kv(
        self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
    ) -> None:
        dtypes = k.dtype == v.dtype and k_cache.dtype == v_cache.dtype and {k.dtype, k_cache.dtype} <= set(ROW_DTYPES)
        if k.device.type == "cpu" and dtypes and k_cache.is_contiguous():  # a 16-bit cache of float32 k, v too
            torch.ops.llmp_native.write_kv_(k, v, k_cache, v_cache, slot_mapping)
        else:
            super().write_kv(k, v, k_cache, v_cache, slot_mapping)

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        if _native_rows(x):
            return torch.ops.llmp_native.silu_and_mul(x)
        return super().silu_and_mul(x)

    def gelu_tanh_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        if _native_rows(x) and x.dtype != torch.float32:  # its tanh loses small values' float32 precision
            return torch.ops.llmp_native.gelu_tanh_and_mul(x)
        return super().gelu_tanh_and_mul(x)

    def argmax(self, logits: torch.Tensor) -> torch.Tensor:
        # greedy tokens in one pass (torch's bfloat16 max over 64 rows of a 152k vocabulary: 2.5 ms; this 0.3)
        if logits.device.type == "cpu" and logits.dim() == 2 and logits.dtype in ROW_DTYPES and logits.shape[1]:
            return torch.ops.llmp_native.argmax_rows(logits)
        return logits.argmax(-1)

    def pack_decoder_layer(self, parts: DecoderLayerParts) -> FusedDecoderLayer | None:
        # the layer's own products on the pairs (an AMX CPU's tiles keep the ops one at a time), in bfloat16
        qkv, o, gated, down = parts.qkv, parts.o, parts.gate_up_act, parts.down
        products = isinstance(qkv, DenseLinear) and isinstance(o, DenseLinear) and isinstance(down, DenseLinear)
        if not products or not isinstance(gated, DenseGatedLinear) or not gated.gated or o.bias is not None:
            return None
        norms = parts.input_norm.dtype == parts.post_attention_norm.dtype == torch.bfloat16
        shape = qkv.out_features == (parts.num_heads + 2 * parts.num_kv_heads) * parts.head_dim
        if down.bias is not None or not norms or not shape or parts.head_dim % 2:
            return None
        if not dense_on_pairs() or not torch.ops.llmp_native.decoder_layer_supported():
            return None
        return FusedDecoderLayer(parts, qkv, o, gated, down)

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
