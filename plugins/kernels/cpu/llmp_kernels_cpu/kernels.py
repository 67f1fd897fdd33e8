"""CPU kernels: the torch reference set, with the parts that decide CPU speed replaced.

- **Linear layers** in bfloat16/float16 run on oneDNN with the weight re-laid
  out once (``pack_linear``): a matrix-vector product then streams the weight
  at close to memory bandwidth, where ``F.linear`` re-reads a plain layout.
  On a CPU without bfloat16/float16 matmul instructions (AVX2 only) the weight
  is packed in float32 instead (``UpcastLinear``): ``F.linear`` there costs a
  matrix-vector product per row, 4-7x slower than float32 from 32 rows up.
- **Gated MLPs** of long prefills run in blocks of 256 rows (``mlp_block_rows``),
  so the intermediate activations stay in cache.
- **Attention** works from a plan built once per step and shared by every
  layer: the flat cache slots each request reads, the decode rows' mask, where
  this step's keys are written. Decodes run as one SDPA call with each KV
  head's query heads folded into query rows (grouped-query attention without
  repeating keys), which is about twice as fast on CPU as SDPA's own GQA.
  A decode group's gathered keys and values are kept for the next step, which
  appends one token to them (``_Mirrors``).
- **Rotary** turns q and k together in one pass, same bits as the reference.
- **The allocator** keeps freed memory for the next step (``keep_freed_memory``).
"""

from __future__ import annotations

import ctypes
import platform
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from llmp_kernels_torch.kernels import TorchKernels, _causal_mask

from llmp.api import AttentionMetadata

# Packed for a batch of this many rows: oneDNN's layout for it serves 1 to 1024 rows within a few percent.
_PACK_FOR_ROWS = 32


class PackedLinear:
    """``x @ weight.T + bias`` on a oneDNN-packed copy of the weight."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.out_features, self.in_features = weight.shape
        self.weight = torch.ops.mkldnn._reorder_linear_weight(weight, _PACK_FOR_ROWS)
        self.bias = bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")


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


def _packing(dtype: torch.dtype) -> type[PackedLinear] | None:
    if not torch.backends.mkldnn.is_available() or dtype not in (torch.bfloat16, torch.float16):
        return None  # float32: F.linear (MKL), which keeps the reference's bits
    return PackedLinear if native_matmul(dtype) else UpcastLinear


@dataclass(slots=True)
class DecodePlan:
    """Decodes of similar context length: one SDPA call, keys padded to the group's longest."""

    rows: torch.Tensor | None  # the group's rows of the batch; None when it is every row, in order
    slots: torch.Tensor  # [R * L] flat cache slot of each (request, position); padding reads a valid slot
    mask: torch.Tensor | None  # [R, 1, 1, L] bool, True where the position is attended; None: all of it
    length: int  # L, the longest context in the group
    tables: torch.Tensor  # [R, ceil(L / block_size)] the members' block tables (padded past their own blocks)
    lengths: torch.Tensor  # [R] the members' context lengths
    new_slots: torch.Tensor  # [R] the slot of each member's newest position (this step's token)
    key: int | None = None  # names the group's gathered keys (see _Mirrors); kept by the same group next step
    continued: bool = False  # the same requests were a group of the previous step
    appends: tuple[int, torch.Tensor] | None = None  # (mirror capacity, flat mirror row of each newest position)


@dataclass(slots=True)
class PrefillGroup:
    """Prefill chunks of equal query and context lengths (requests sharing a prefix, say): one SDPA call."""

    rows: torch.Tensor | None  # [G * Q] the chunks' rows in order; None for one chunk (rows first:end)
    first: int
    end: int
    slots: torch.Tensor  # [G * L] flat slots of each chunk's whole context
    count: int  # G


@dataclass(slots=True)
class StepPlan:
    decodes: list[DecodePlan]
    prefills: list[PrefillGroup]


# Decodes are grouped by context length so that short contexts are not padded to the longest one:
# a group closes at a context shorter than this fraction of its longest, once it has enough members
# (each SDPA call has a fixed cost). Attention time is proportional to the padded area.
_DECODE_GROUP_RATIO = 0.75
_DECODE_GROUP_MIN = 8
# A decode group's mirror (see _Mirrors) has room for this many more positions before it is gathered again.
_MIRROR_HEADROOM = 64


def decode_groups(decodes: list[int], seq_lens: list[int]) -> list[list[int]]:
    """The decode requests in groups of similar context length, longest first."""
    groups: list[list[int]] = []
    current: list[int] = []
    for r in sorted(decodes, key=lambda r: -seq_lens[r]):
        if len(current) >= _DECODE_GROUP_MIN and seq_lens[r] < _DECODE_GROUP_RATIO * seq_lens[current[0]]:
            groups.append(current)
            current = []
        current.append(r)
    return [*groups, current] if groups else [decodes]  # one group keeps the batch order: no scatter


def _plan_decode(
    metadata: AttentionMetadata, members: list[int], seq_lens: list[int], starts: list[int] | None, block_size: int
) -> DecodePlan:
    # starts is None when the members are every row of the batch, in order
    lengths = metadata.seq_lens[members].long() if starts is not None else metadata.seq_lens.long()
    longest = max(seq_lens[r] for r in members)
    positions = torch.arange(longest)
    tables = metadata.block_tables[members, : -(-longest // block_size)].long()
    slots = tables[:, positions // block_size] * block_size + positions % block_size  # [R, L]
    valid = positions < lengths[:, None]
    if metadata.sliding_window is not None:
        valid &= positions > (lengths[:, None] - 1 - metadata.sliding_window)
    # Past a sequence's end the slots were never written (they may hold NaN, and 0 * NaN is NaN
    # even where the mask gives no weight): read a slot the sequence did write instead.
    slots = torch.where(valid, slots, slots.gather(1, lengths[:, None] - 1))
    rows = None if starts is None else torch.tensor([starts[r] for r in members])
    mask = None if bool(valid.all()) else valid[:, None, None, :]
    new_slots = slots.gather(1, lengths[:, None] - 1).squeeze(1)
    return DecodePlan(rows, slots.reshape(-1), mask, longest, tables, lengths, new_slots)


def continues(previous: DecodePlan, current: DecodePlan, block_size: int) -> bool:
    """Whether ``current`` is ``previous`` one token later: the same requests, in the same order.

    The requests are recognised by their blocks: every block under the previous context is the same
    (a block in use is never rewritten below its sequence's length) and each length grew by one.
    """
    if current.lengths.shape != previous.lengths.shape or not torch.equal(current.lengths, previous.lengths + 1):
        return False
    width = previous.tables.shape[1]
    used = torch.arange(width) * block_size < previous.lengths[:, None]
    return bool(((current.tables[:, :width] == previous.tables) | ~used).all())


def plan_step(metadata: AttentionMetadata, block_size: int) -> StepPlan:
    """Where each request of the step reads its keys (see :class:`StepPlan`)."""
    starts = metadata.query_start_loc.tolist()
    seq_lens = metadata.seq_lens.tolist()
    decodes = [r for r in range(len(seq_lens)) if starts[r + 1] - starts[r] == 1]
    decode_plans = []
    for members in decode_groups(decodes, seq_lens) if decodes else ():
        in_order = members is decodes and len(decodes) == len(seq_lens)
        decode_plans.append(_plan_decode(metadata, members, seq_lens, None if in_order else starts, block_size))
    groups: dict[tuple[int, int], list[int]] = {}
    for r in range(len(seq_lens)) if len(decodes) < len(seq_lens) else ():
        if starts[r + 1] - starts[r] > 1:
            groups.setdefault((starts[r + 1] - starts[r], seq_lens[r]), []).append(r)
    prefills = []
    for (q_len, seq_len), members in groups.items():
        positions = torch.arange(seq_len)
        tables = metadata.block_tables[members].long()
        slots = (tables[:, positions // block_size] * block_size + positions % block_size).reshape(-1)
        rows = None
        if len(members) > 1:
            rows = torch.cat([torch.arange(starts[r], starts[r] + q_len) for r in members])
        prefills.append(PrefillGroup(rows, starts[members[0]], starts[members[0]] + q_len, slots, len(members)))
    return StepPlan(decode_plans, prefills)


def _decode(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, plan: DecodePlan, scale: float) -> torch.Tensor:
    # q: [R, H, D]; keys, values: [R, L, Hkv, D]. Each KV head's query heads become its query rows.
    requests, heads, dim = q.shape
    kv_heads = keys.shape[2]
    keys, values = keys.transpose(1, 2).to(q.dtype), values.transpose(1, 2).to(q.dtype)
    grouped = q.view(requests, kv_heads, heads // kv_heads, dim)
    out = F.scaled_dot_product_attention(grouped, keys, values, attn_mask=plan.mask, scale=scale)
    return out.reshape(requests, heads, dim)


def _prefill(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, window: int | None, scale: float, count: int = 1
) -> torch.Tensor:
    # q: [G * Q, H, D], the last Q positions of G chunks; keys, values: [G * L, Hkv, D]. 4-D inputs:
    # with 3-D ones SDPA takes its slow math kernel on CPU instead of the flash kernel.
    q_len, seq_len = q.shape[0] // count, keys.shape[0] // count
    q_ = q.view(count, q_len, *q.shape[1:]).transpose(1, 2)
    k_, v_ = (t.view(count, seq_len, *t.shape[1:]).transpose(1, 2).to(q.dtype) for t in (keys, values))
    gqa = q.shape[1] != keys.shape[1]
    if q_len == seq_len and window is None:  # no cached prefix: the causal mask is SDPA's own
        out = F.scaled_dot_product_attention(q_, k_, v_, is_causal=True, scale=scale, enable_gqa=gqa)
    else:
        mask = _causal_mask(q_len, seq_len, window, q.device)
        out = F.scaled_dot_product_attention(q_, k_, v_, attn_mask=mask, scale=scale, enable_gqa=gqa)
    return out.transpose(1, 2).reshape(q.shape)


class _PlanCache:
    """The plan of the step whose metadata was seen last (held, so its identity cannot be reused).

    A decode group that continues a group of the previous plan keeps its ``key``, and with it the
    keys and values the mirrors gathered for it; the mirrors of groups that did not continue are dropped.
    """

    def __init__(self, mirrors: _Mirrors) -> None:
        self.metadata: AttentionMetadata | None = None
        self.plan: StepPlan | None = None
        self.mirrors = mirrors
        self._next_key = 1

    def get(self, metadata: AttentionMetadata, block_size: int) -> StepPlan:
        if metadata is not self.metadata:
            plan = plan_step(metadata, block_size)
            previous = self.plan.decodes if self.plan is not None else []
            for decode in plan.decodes:
                decode.key = next((p.key for p in previous if continues(p, decode, block_size)), None)
                decode.continued = decode.key is not None
                if decode.key is None:
                    decode.key, self._next_key = self._next_key, self._next_key + 1
            self.mirrors.keep_only({decode.key for decode in plan.decodes})
            self.metadata, self.plan = metadata, plan
        return self.plan


@dataclass(slots=True)
class _Mirror:
    keys: torch.Tensor  # [R, capacity, Hkv, D]
    values: torch.Tensor
    length: int  # positions filled (per row up to its own length; past it finite padding)


class _Mirrors:
    """Each decode group's keys and values gathered from one layer's paged cache, kept from step to step.

    Gathering a group's whole context from the paged cache (one row per position) was a third of
    decode attention at batch 64; a group that continues, the same requests one token longer, only
    appends its new token. A new group is gathered straight into its mirror, with room to grow
    (no copy, no zero-fill), within ``budget`` bytes; past it groups gather every step.
    """

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.entries: dict[tuple[int, int], _Mirror] = {}
        self.bytes = 0

    def keep_only(self, keys: set[int]) -> None:
        for name in [name for name in self.entries if name[1] not in keys]:
            self._drop(name)

    def _drop(self, name: tuple[int, int]) -> None:
        entry = self.entries.pop(name)
        self.bytes -= 2 * entry.keys.numel() * entry.keys.element_size()

    def keys_values(
        self, k_flat: torch.Tensor, v_flat: torch.Tensor, plan: DecodePlan
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``[R, L, Hkv, D]`` keys and values of the group's contexts, padded to its longest."""
        requests, length = plan.lengths.shape[0], plan.length
        name = (k_flat.data_ptr(), plan.key)
        entry = self.entries.get(name)
        if entry is not None and entry.length == length - 1 and entry.keys.shape[1] >= length:
            capacity = entry.keys.shape[1]
            if plan.appends is None or plan.appends[0] != capacity:  # once per step, not per layer
                plan.appends = (capacity, torch.arange(requests) * capacity + plan.lengths - 1)
            flat = plan.appends[1]
            entry.keys.view(-1, *k_flat.shape[1:]).index_copy_(0, flat, k_flat.index_select(0, plan.new_slots))
            entry.values.view(-1, *v_flat.shape[1:]).index_copy_(0, flat, v_flat.index_select(0, plan.new_slots))
            entry.length = length
            return entry.keys[:, :length], entry.values[:, :length]
        if entry is not None:
            self._drop(name)
        capacity = -(-(length + _MIRROR_HEADROOM) // 64) * 64
        size = 2 * requests * capacity * k_flat[0].numel() * k_flat.element_size()
        kept = self.bytes + size <= self.budget
        # Kept: gathered straight into the mirror's layout, each row's positions past the group's
        # longest reading its own last slot (so they hold finite values until appended over).
        width = capacity if kept else length
        slots = plan.slots if width == length else _pad_rows(plan.slots.view(requests, length), width)
        shape = (requests, width, *k_flat.shape[1:])
        keys, values = k_flat.index_select(0, slots).view(shape), v_flat.index_select(0, slots).view(shape)
        if kept:
            self.entries[name], self.bytes = _Mirror(keys, values, length), self.bytes + size
        return keys[:, :length], values[:, :length]


def _pad_rows(slots: torch.Tensor, width: int) -> torch.Tensor:
    """[R, L] slots widened to [R * width], each row repeating its last slot."""
    return torch.cat((slots, slots[:, -1:].expand(-1, width - slots.shape[1])), dim=1).reshape(-1)


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


class CpuKernels(TorchKernels):
    name = "cpu"
    # Gated MLPs run in blocks of this many rows: a 2048-token prefill's [T, 2I] activations
    # (40 MB for Qwen2.5-0.5B) leave the caches; in 256-row blocks the MLP ran 1.8x faster.
    mlp_block_rows = 256

    # Bytes the decode groups' gathered keys and values may keep between steps (see _Mirrors).
    decode_mirror_bytes = 1 << 30

    def __init__(self) -> None:
        keep_freed_memory()
        self._mirrors = _Mirrors(self.decode_mirror_bytes)
        self._plans = _PlanCache(self._mirrors)
        self._writes = _WriteCache()
        self._rotary = _RotaryCache()

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
        if len(plan.decodes) == 1 and plan.decodes[0].rows is None:  # decodes only: no scatter
            decode = plan.decodes[0]
            return _decode(q, *self._mirrors.keys_values(k_flat, v_flat, decode), decode, scale)
        out = torch.empty_like(q)
        for decode in plan.decodes:
            out[decode.rows] = _decode(
                q[decode.rows], *self._mirrors.keys_values(k_flat, v_flat, decode), decode, scale
            )
        for group in plan.prefills:
            keys, values = k_flat.index_select(0, group.slots), v_flat.index_select(0, group.slots)
            if group.rows is None:
                out[group.first : group.end] = _prefill(
                    q[group.first : group.end], keys, values, metadata.sliding_window, scale
                )
            else:
                out[group.rows] = _prefill(q[group.rows], keys, values, metadata.sliding_window, scale, group.count)
        return out
