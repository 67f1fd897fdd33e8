"""CPU kernels: the torch reference set, with the parts that decide CPU speed replaced.

- **Linear layers** in bfloat16/float16 run on oneDNN with the weight re-laid
  out once (``pack_linear``): a matrix-vector product then streams the weight
  at close to memory bandwidth, where ``F.linear`` re-reads a plain layout.
  On a CPU without bfloat16/float16 matmul instructions (AVX2 only) the weight
  is packed in float32 instead (``UpcastLinear``): ``F.linear`` there costs a
  matrix-vector product per row, 4-7x slower than float32 from 32 rows up.
- **Gated MLPs** of long prefills run in blocks of 256 rows (``mlp_block_rows``),
  so the intermediate activations stay in cache.
- **Attention** works from the reference set's plan of aligned query blocks
  (``plan_attention``: the same numbers for a position wherever it is computed),
  built once per step and shared by every layer, with each KV head's query heads
  folded into query rows (grouped-query attention without repeating keys),
  about twice as fast on CPU as SDPA's own GQA.
- **Rotary** turns q and k together in one pass, same bits as the reference.
- **LoRA** shrink and expand run all adapter slots in one matmul (``_WideLoRA``) where the
  stacked rank is small: one call per module instead of one per adapter in the step.
- **The allocator** keeps freed memory for the next step (``keep_freed_memory``).
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import platform
import weakref
from collections.abc import Callable

import torch
import torch.nn.functional as F
from llmp_kernels_torch.kernels import QUERY_BLOCK, AttentionGroup, TorchKernels, plan_attention

from llmp.api import AttentionMetadata, LoRAMapping
from llmp.modeling.layers import row_invariant

# Packed for a batch of this many rows: oneDNN's layout for it serves 1 to 1024 rows within a few percent.
_PACK_FOR_ROWS = 32


class PackedLinear:
    """``x @ weight.T + bias`` on a oneDNN-packed copy of the weight, in ``row_invariant`` blocks of 32 rows.

    The blocks are made here rather than by the layer (``row_invariant = True``) so that a traced decode
    step (``llmp.engine.decode_graphs``) records the whole call as one op: a oneDNN-packed weight cannot be
    a trace's constant, and 32-row padding done by the layer's Python would tie a trace to the batch size
    it saw. The op finds this object by its handle, so the trace holds no tensor of it.
    """

    row_invariant = True  # rows computed in fixed 32-row blocks: a row's bits do not depend on the batch

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.out_features, self.in_features = weight.shape
        self.weight = torch.ops.mkldnn._reorder_linear_weight(weight, _PACK_FOR_ROWS)
        self.bias = bias
        self.handle = next(_HANDLES)
        _LIVE_LINEARS[self.handle] = self

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if torch.jit.is_tracing():
            return _traced_linear_op()(x, self.handle)
        return row_invariant(self.matmul, x)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")


_HANDLES = itertools.count()
_LIVE_LINEARS: weakref.WeakValueDictionary[int, PackedLinear] = weakref.WeakValueDictionary()


def _linear_by_handle(x: torch.Tensor, handle: int) -> torch.Tensor:
    linear = _LIVE_LINEARS.get(handle)
    if linear is None:  # a trace replayed after its model's weights went away (sleep drops the traces first)
        raise RuntimeError(f"packed linear layer {handle} no longer exists")
    return row_invariant(linear.matmul, x)


@functools.cache
def _traced_linear_op() -> Callable[[torch.Tensor, int], torch.Tensor]:
    """``llmp_cpu::packed_linear(x, handle)``: a packed layer's call as one op a trace can record, defined
    the first time a trace needs it (nothing is registered with torch at import)."""
    library = torch.library.Library("llmp_cpu", "DEF")
    library.define("packed_linear(Tensor x, int handle) -> Tensor")
    library.impl("packed_linear", _linear_by_handle, "CPU")
    _LIBRARIES.append(library)  # the op lives as long as its library object
    return torch.ops.llmp_cpu.packed_linear


_LIBRARIES: list[torch.library.Library] = []


class UpcastLinear(PackedLinear):
    """A bfloat16/float16 layer on a CPU whose oneDNN has no matmul in that dtype: a packed float32
    copy of the weight (twice the bytes), the input widened and the output rounded back once, as a
    native matmul's float32 accumulators are. Where the CPU has no such instructions, torch's own
    bfloat16 ``F.linear`` runs a matrix-vector product per row: for a [9728, 896] weight 0.94 ms a
    row, 27 ms at 32 rows and 435 ms at 512, against 2.0, 8.9 and 59 ms here (AVX2, 2 cores)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__(weight.float(), None if bias is None else bias.float())

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return super().__call__(x.float()).to(x.dtype)


# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def keep_freed_memory(mmap_threshold: int = 32 << 20, trim_threshold: int = 512 << 20) -> bool:
    """Have glibc's malloc keep freed memory in the heap for the next step's tensors.

    By default an allocation over 128 KiB (a threshold glibc raises as it goes) gets fresh pages
    from ``mmap`` and gives them back on free, and the heap's top is trimmed, so each step's large
    activations page-fault again on first touch: 10-60 thousand faults of about 1.5 us per
    2048-token prefill step of Qwen2.5-0.5B (about 8 thousand remain with this setting, mostly the
    KV cache's first use). vLLM's CPU build preloads tcmalloc for the same reason. Returns False
    where the C library is not glibc, whose allocator is then left as it is.
    """
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(None)
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, mmap_threshold)) and bool(
        libc.mallopt(_M_TRIM_THRESHOLD, trim_threshold)
    )


def native_matmul(dtype: torch.dtype) -> bool:
    """Whether this CPU's oneDNN multiplies ``dtype`` matrices itself (AVX-512 BF16 / FP16, AMX)."""
    if dtype == torch.bfloat16:
        return torch.ops.mkldnn._is_mkldnn_bf16_supported()
    return dtype == torch.float16 and torch.ops.mkldnn._is_mkldnn_fp16_supported()


def half_matmul_path(dtype: str) -> str | None:
    """How the set multiplies ``dtype`` ("bfloat16", "float16") matrices here; None for float32 (MKL, as torch)."""
    half = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(dtype)
    if half is None:
        return None
    if _packing(half) is None:
        return f"{dtype} matmul emulated (torch)"  # no oneDNN in this torch build: F.linear
    return f"{dtype} matmul {'native' if native_matmul(half) else 'on float32 copies'} (oneDNN)"


def _packing(dtype: torch.dtype) -> type[PackedLinear] | None:
    if not torch.backends.mkldnn.is_available() or dtype not in (torch.bfloat16, torch.float16):
        return None  # float32: F.linear (MKL), which keeps the reference's bits
    return PackedLinear if native_matmul(dtype) else UpcastLinear


class _PlanCache:
    """The attention plan of the step seen last, shared by every layer. Keyed by the step's tensors,
    which windowed layers share too (``with_window`` copies only the window); held, so that their
    identity cannot be reused."""

    def __init__(self) -> None:
        self.key: tuple[torch.Tensor, ...] = ()
        self.plan: list[AttentionGroup] = []
        self.masks: dict[tuple[int, int | None, int, torch.dtype], torch.Tensor] = {}
        # request -> slots of its keys up to the widest of its blocks that have a call of their own
        # (a prefill's): its keys are gathered once per layer and each block reads a prefix of them
        self.spans: dict[int, torch.Tensor] = {}

    def get(self, metadata: AttentionMetadata, block_size: int) -> list[AttentionGroup]:
        key = (metadata.query_start_loc, metadata.seq_lens, metadata.block_tables)
        if len(self.key) != len(key) or any(a is not b for a, b in zip(self.key, key, strict=True)):
            self.key, self.plan, self.masks = key, plan_attention(metadata, block_size), {}
            widest: dict[int, AttentionGroup] = {}
            for group in self.plan:
                if group.request >= 0 and group.width > getattr(widest.get(group.request), "width", 0):
                    widest[group.request] = group
            self.spans = {r: group.slots for r, group in widest.items()}
        return self.plan

    def folded_mask(self, index: int, window: int | None, group_size: int, dtype: torch.dtype) -> torch.Tensor:
        """Group ``index``'s mask for query heads folded into query rows, [U, 1, G * C, width]: additive
        (0 or -inf in ``dtype``), as SDPA would turn a boolean one on every call of every layer."""
        name = (index, window, group_size, dtype)
        if name not in self.masks:
            mask = self.plan[index].mask(window)
            blocks, rows, width = mask.shape
            folded = mask[:, None, None].expand(blocks, 1, group_size, rows, width)
            additive = torch.zeros(folded.shape, dtype=dtype).masked_fill_(~folded, float("-inf"))
            self.masks[name] = additive.reshape(blocks, 1, group_size * rows, width)
        return self.masks[name]


def _attend(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, group: AttentionGroup, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    # q: [T, H, D]; keys, values: [U * width, Hkv, D] (or a longer span whose first ``width`` are
    # the one block's) -> [U * C, H, D] for the group's block rows. Each KV head's query heads become
    # its query rows (GQA without repeating keys): about twice as fast on CPU as SDPA's own GQA.
    # 4-D inputs: with 3-D ones SDPA takes its slow math kernel.
    blocks, width, (heads, dim), kv_heads = group.blocks, group.width, q.shape[1:], keys.shape[1]
    per_kv = heads // kv_heads
    q_ = q.index_select(0, group.q_rows).view(blocks, QUERY_BLOCK, kv_heads, per_kv, dim)
    q_ = q_.permute(0, 2, 3, 1, 4).reshape(blocks, kv_heads, per_kv * QUERY_BLOCK, dim)
    k_, v_ = (
        t[: blocks * width].view(blocks, width, kv_heads, dim).transpose(1, 2).to(q.dtype) for t in (keys, values)
    )
    out = F.scaled_dot_product_attention(q_, k_, v_, attn_mask=mask, scale=scale)
    out = out.view(blocks, kv_heads, per_kv, QUERY_BLOCK, dim).permute(0, 3, 1, 2, 4)
    return out.reshape(blocks * QUERY_BLOCK, heads, dim)


class _WriteCache:
    """Rows to write and their slots, for the step whose slot mapping was seen last."""

    def __init__(self) -> None:
        self.slot_mapping: torch.Tensor | None = None
        self.value: tuple[torch.Tensor | None, torch.Tensor] | None = None

    def get(self, slot_mapping: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
        if slot_mapping is not self.slot_mapping:
            keep = slot_mapping >= 0
            if bool(keep.all()):
                value = (None, slot_mapping.long())
            else:
                rows = keep.nonzero().squeeze(1)
                value = (rows, slot_mapping[rows].long())
            self.slot_mapping, self.value = slot_mapping, value
        return self.value


class _RotaryCache:
    """``cos | cos`` and ``-sin | sin`` rows [T, 1, D] of the step's positions (every layer rotates by them)."""

    def __init__(self) -> None:
        self.key: tuple[torch.Tensor, torch.Tensor] | None = None
        self.value: tuple[torch.Tensor, torch.Tensor] | None = None

    def get(self, positions: torch.Tensor, cos_sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.key is None or self.key[0] is not positions or self.key[1] is not cos_sin:
            cos, sin = cos_sin[positions].unsqueeze(1).chunk(2, dim=-1)
            self.key, self.value = (positions, cos_sin), (torch.cat((cos, cos), -1), torch.cat((-sin, sin), -1))
        return self.value


# Stacked LoRA widths (slots x rank) up to this run as one matmul over every slot: for 32 decode rows
# over 4 rank-16 adapters of a Qwen2.5-0.5B-shaped model, a layer's LoRA took about 1 ms instead of
# the reference's 3-5 ms (one matmul, gather and add per adapter). Past it the extra columns cost more
# than the per-adapter calls save. A fixed function of the model's L and R, never of the batch.
_WIDE_LORA_MAX = 256


class _WideLoRA:
    """Multi-LoRA as one matmul over every slot's columns, row-invariant as the reference is.

    shrink: ``x[rows] @ a.view(L*R, in).T`` gives every slot's R columns; each row keeps its slot's.
    expand: each row's s goes into its slot's columns of an otherwise zero ``[N, L*R]`` row, times
    every slot's B side by side ``[out, L*R]``: the other slots add exact zeros. Both weights are
    kept packed for oneDNN (bfloat16/float16) and the side-by-side B is a copy; each is made again
    only when its slots' buffer changes (its version counter: a slot load writes in place). So slots
    never loaded must hold zeros, not garbage (0 * NaN is NaN).
    """

    def __init__(self) -> None:
        self.mapping: LoRAMapping | None = None
        self.slot_of_row = torch.empty(0, dtype=torch.long)  # [N] each mapped row's slot, in mapping.rows order
        # data_ptr of a slots' buffer -> (the buffer, its version, its matmul)
        self.matmuls: dict[int, tuple[torch.Tensor, int, Callable[[torch.Tensor], torch.Tensor]]] = {}

    def slots(self, mapping: LoRAMapping) -> torch.Tensor:
        if mapping is not self.mapping:
            self.mapping, self.slot_of_row = mapping, mapping.token_slots.index_select(0, mapping.rows)
        return self.slot_of_row

    def matmul(
        self, buffer: torch.Tensor, weight: Callable[[torch.Tensor], torch.Tensor]
    ) -> Callable[[torch.Tensor], torch.Tensor]:
        """``x @ weight(buffer).T``, packed where the dtype allows, for this version of ``buffer``."""
        held = self.matmuls.get(buffer.data_ptr())
        if held is None or held[0].shape != buffer.shape or held[0].stride() != buffer.stride():
            held = None
        if held is None or held[1] != buffer._version:
            w = weight(buffer).contiguous()
            packing = _packing(w.dtype)
            held = (buffer, buffer._version, packing(w, None) if packing else lambda x, w=w: F.linear(x, w))
            self.matmuls[buffer.data_ptr()] = held  # holding the buffer: its address cannot be reused
        return held[2]

    def shrink(self, x: torch.Tensor, a: torch.Tensor, mapping: LoRAMapping) -> torch.Tensor:
        slots, rank = a.shape[0], a.shape[1]
        every = row_invariant(self.matmul(a, lambda t: t.view(slots * rank, -1)), x.index_select(0, mapping.rows))
        rows = torch.arange(every.shape[0], device=x.device)
        return every.view(-1, slots, rank)[rows, self.slots(mapping)]

    def expand(self, y: torch.Tensor, s: torch.Tensor, b: torch.Tensor, mapping: LoRAMapping) -> None:
        slots, rank = b.shape[0], b.shape[2]
        stacked = self.matmul(b, lambda t: t.permute(1, 0, 2).reshape(t.shape[1], -1))
        if s.shape[0] == y.shape[0]:  # every row has a slot: in y's row order, one add instead of an index_add
            wide = s.new_zeros(y.shape[0], slots, rank)
            wide[mapping.rows, self.slots(mapping)] = s
            y.add_(row_invariant(stacked, wide.view(y.shape[0], slots * rank)).to(y.dtype))
            return
        wide = s.new_zeros(s.shape[0], slots, rank)
        wide[torch.arange(s.shape[0], device=s.device), self.slots(mapping)] = s
        y.index_add_(0, mapping.rows, row_invariant(stacked, wide.view(s.shape[0], slots * rank)).to(y.dtype))


def _wide_lora_pays(weights: torch.Tensor, rank_dim: int) -> bool:
    return weights.device.type == "cpu" and weights.shape[0] * weights.shape[rank_dim] <= _WIDE_LORA_MAX


class CpuKernels(TorchKernels):
    name = "cpu"
    # Gated MLPs run in blocks of this many rows: a 2048-token prefill's [T, 2I] activations
    # (40 MB for Qwen2.5-0.5B) leave the caches; in 256-row blocks the MLP ran 1.8x faster.
    mlp_block_rows = 256

    def __init__(self) -> None:
        keep_freed_memory()
        self._plans = _PlanCache()
        self._writes = _WriteCache()
        self._rotary = _RotaryCache()
        self._lora = _WideLoRA()

    def isa_path(self, device: str, dtype: str) -> str:
        """ATen's vector ISA (the elementwise ops, float32 matmuls), AMX, and how half-precision layers multiply:
        where oneDNN has no such matmul, on packed float32 copies (``UpcastLinear``), not torch's emulation."""
        parts = [torch.backends.cpu.get_cpu_capability()]
        if torch.cpu._is_amx_tile_supported():
            parts.append("AMX")
        return ", ".join([*parts, half] if (half := half_matmul_path(dtype)) else parts)

    def pack_linear(
        self, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> Callable[[torch.Tensor], torch.Tensor] | None:
        packing = _packing(weight.dtype)
        if weight.device.type != "cpu" or weight.dim() != 2 or packing is None:
            return None
        if bias is not None and bias.dtype != weight.dtype:
            return None
        return packing(weight, bias)

    def rms_norm(
        self, x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if x.dtype == torch.float32:  # float32 keeps the reference's bits (and the greedy parity with transformers)
            return super().rms_norm(x, weight, eps, residual)
        # torch's own RMSNorm: one float32 rounding at the end instead of the reference's two, and fewer ops
        # (a decode step at batch 32 ran 1-2% faster)
        if residual is not None:
            x = x + residual
        out = F.rms_norm(x, (x.shape[-1],), weight, eps)
        return out if residual is None else (out, x)

    def rotary(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # q and k rotated together in one float32 buffer, as x * (cos|cos) + swap_halves(x) * (-sin|sin):
        # a third of the reference's ops, same bits (x1*cos + x2*-sin is x1*cos - x2*sin exactly).
        if q.device.type != "cpu" or cos_sin.shape[-1] != q.shape[-1]:  # partial rotary: the reference
            return super().rotary(positions, q, k, cos_sin)
        cos, sin = self._rotary.get(positions, cos_sin)
        tokens, heads, dim = q.shape
        x = torch.empty(tokens, heads + k.shape[1], dim, dtype=torch.float32)
        x[:, :heads], x[:, heads:] = q, k
        swapped = (
            x.view(tokens, -1, 2, dim // 2).roll(1, 2).view(x.shape)
        )  # roll: 0.58 ms vs flip 0.82 at 2048 tokens, alone
        out = x.mul_(cos).add_(swapped.mul_(sin)).to(q.dtype)
        return out[:, :heads], out[:, heads:]

    def write_kv(
        self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
    ) -> None:
        rows, slots = self._writes.get(slot_mapping)
        if rows is not None:
            k, v = k[rows], v[rows]
        k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slots, k.to(k_cache.dtype))
        v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slots, v.to(v_cache.dtype))

    def paged_attention(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        metadata: AttentionMetadata,
        scale: float,
        softcap: float | None = None,
    ) -> torch.Tensor:
        if softcap is not None or q.device.type != "cpu":  # SDPA cannot cap scores: the reference's explicit softmax
            return super().paged_attention(q, k_cache, v_cache, metadata, scale, softcap)
        plan = self._plans.get(metadata, k_cache.shape[1])
        k_flat, v_flat = k_cache.view(-1, *k_cache.shape[2:]), v_cache.view(-1, *v_cache.shape[2:])
        out = torch.empty_like(q)
        per_kv = q.shape[1] // k_cache.shape[2]
        spans = {r: (k_flat.index_select(0, s), v_flat.index_select(0, s)) for r, s in self._plans.spans.items()}
        for index, group in enumerate(plan):
            mask = self._plans.folded_mask(index, metadata.sliding_window, per_kv, q.dtype)
            if group.request in spans:
                keys, values = spans[group.request]
            else:
                keys, values = k_flat.index_select(0, group.slots), v_flat.index_select(0, group.slots)
            out[group.out_rows] = _attend(q, keys, values, group, mask, scale)[group.out_index]
        return out

    def lora_shrink(self, x: torch.Tensor, a: torch.Tensor, mapping: LoRAMapping) -> torch.Tensor:
        if not _wide_lora_pays(a, 1) or a.is_inference():  # no version counter: a copy could go stale
            return super().lora_shrink(x, a, mapping)
        return self._lora.shrink(x, a, mapping)

    def lora_expand(self, y: torch.Tensor, s: torch.Tensor, b: torch.Tensor, mapping: LoRAMapping) -> None:
        if not _wide_lora_pays(b, 2) or b.is_inference():  # no version counter: a copy could go stale
            return super().lora_expand(y, s, b, mapping)
        self._lora.expand(y, s, b, mapping)
