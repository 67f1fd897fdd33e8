"""Reference kernels in plain PyTorch.

Correctness first: these define what every kernel set must compute. Shapes:
``T`` tokens in the flattened batch, ``H`` query heads, ``Hkv`` KV heads,
``D`` head size, ``N`` hidden size, ``B`` cache blocks, ``S`` block size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from llmp.api import AttentionMetadata, LoRAMapping
from llmp.modeling.layers import row_invariant


class TorchKernels:
    name = "torch"

    def rms_norm(
        self, x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        # x, residual: [T, N]; the sum stays in x's dtype, as in Hugging Face models
        if residual is not None:
            x = x + residual
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + eps)
        out = weight * normed.to(x.dtype)
        return out if residual is None else (out, x)

    def rotary(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # positions: [T]; q: [T, H, D]; k: [T, Hkv, D]; cos_sin: [max_pos, R] (cos | sin), R <= D
        cos, sin = cos_sin[positions].unsqueeze(1).chunk(2, dim=-1)  # [T, 1, R/2] each
        return _rotate(q, cos, sin), _rotate(k, cos, sin)

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, 2I] -> [T, I]
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up

    def gelu_tanh_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, 2I] -> [T, I]
        gate, up = x.chunk(2, dim=-1)
        return F.gelu(gate, approximate="tanh") * up

    def write_kv(
        self,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        # k, v: [T, Hkv, D]; caches: [B, S, Hkv, D]; slot_mapping: [T], -1 = padding
        keep = slot_mapping >= 0
        slots = slot_mapping[keep]
        k_cache.view(-1, *k_cache.shape[2:])[slots] = k[keep].to(k_cache.dtype)
        v_cache.view(-1, *v_cache.shape[2:])[slots] = v[keep].to(v_cache.dtype)

    def paged_attention(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        metadata: AttentionMetadata,
        scale: float,
        softcap: float | None = None,
    ) -> torch.Tensor:
        # q: [T, H, D] -> [T, H, D], in aligned query blocks (see plan_attention)
        out = torch.empty_like(q)
        k_flat, v_flat = k_cache.view(-1, *k_cache.shape[2:]), v_cache.view(-1, *v_cache.shape[2:])
        for group in plan_attention(metadata, k_cache.shape[1]):
            blocks, width = group.blocks, group.width
            q_ = q.index_select(0, group.q_rows).view(blocks, QUERY_BLOCK, *q.shape[1:]).transpose(1, 2)
            k_, v_ = (
                t.index_select(0, group.slots).view(blocks, width, *t.shape[1:]).transpose(1, 2).to(q.dtype)
                for t in (k_flat, v_flat)
            )
            mask = group.mask(metadata.sliding_window)[:, None]
            attended = _sdpa(q_, k_, v_, mask, scale, softcap).transpose(1, 2).reshape(-1, *q.shape[1:])
            out[group.out_rows] = attended[group.out_index]
        return out

    def lora_shrink(self, x: torch.Tensor, a: torch.Tensor, mapping: LoRAMapping) -> torch.Tensor:
        # x: [T, in]; a: [L, R, in] -> [N, R], one matmul per slot over its rows (in 32-row blocks
        # on the CPU, so a row's numbers are the same alone or beside other rows and adapters)
        out = x.new_empty(mapping.rows.shape[0], a.shape[1])
        for slot, rows, part in zip(mapping.group_slots, _groups(mapping), out.split(mapping.group_sizes), strict=True):
            part.copy_(row_invariant(lambda r, w=a[slot]: F.linear(r, w), x.index_select(0, rows)))
        return out

    def lora_expand(self, y: torch.Tensor, s: torch.Tensor, b: torch.Tensor, mapping: LoRAMapping) -> None:
        # y: [T, out] += s [N, R] @ b[slot].T [R, out] on each group's rows, in place
        for slot, rows, part in zip(mapping.group_slots, _groups(mapping), s.split(mapping.group_sizes), strict=True):
            y.index_add_(0, rows, row_invariant(lambda r, w=b[slot]: F.linear(r, w), part).to(y.dtype))


def _groups(mapping: LoRAMapping) -> tuple[torch.Tensor, ...]:
    """Each slot's rows of the step (``mapping.rows`` split by group)."""
    return mapping.rows.split(mapping.group_sizes)


# Query positions are attended in blocks of QUERY_BLOCK, aligned to the start of the sequence, each
# block against the keys before its end (later positions masked). A position's attention then has
# the same shapes, and so the same reduction order, wherever it is computed: in a whole prompt, in
# a chunk after a cached prefix, as a decode, alone or beside other requests. SDPA's CPU kernels
# (and SDPA's own causal path, which skips keys past the diagonal) otherwise choose their blocking
# by the number of query rows and keys, and the same prompt gave other tokens once its prefix was
# cached or other requests shared the step.
QUERY_BLOCK = 16


@dataclass(slots=True)
class AttentionGroup:
    """Query blocks whose keys end at the same position: one attention call over ``blocks`` of them."""

    width: int  # keys [0, width) of every block (positions past a sequence's end read its last slot, masked)
    blocks: int
    request: int  # the request whose block this is when ``blocks == 1``, else -1
    q_rows: torch.Tensor  # [blocks * QUERY_BLOCK] the step's row of each block position (padding: a real row)
    slots: torch.Tensor  # [blocks * width] flat cache slot of each key
    q_pos: torch.Tensor  # [blocks, QUERY_BLOCK, 1] position of each block row
    causal: torch.Tensor  # [blocks, QUERY_BLOCK, width] key j is at or before the row's position
    out_index: torch.Tensor  # [R] the real rows among the block rows, in the step's order
    out_rows: torch.Tensor  # [R] the step's rows they are

    def mask(self, window: int | None) -> torch.Tensor:
        """[blocks, QUERY_BLOCK, width] bool: which keys each block row attends to."""
        if window is None:
            return self.causal
        return self.causal & (torch.arange(self.width, device=self.q_pos.device) > self.q_pos - window)


def plan_attention(metadata: AttentionMetadata, block_size: int) -> list[AttentionGroup]:
    """The step's query rows as aligned blocks of QUERY_BLOCK positions, grouped by where their keys end."""
    starts = metadata.query_start_loc.tolist()
    seq_lens = metadata.seq_lens.tolist()
    device = metadata.block_tables.device
    by_width: dict[int, list[tuple[int, int]]] = {}
    for r, seq_len in enumerate(seq_lens):
        first = seq_len - (starts[r + 1] - starts[r])  # the step's rows are the last positions
        for begin in range(first - first % QUERY_BLOCK, seq_len, QUERY_BLOCK):
            by_width.setdefault(begin + QUERY_BLOCK, []).append((r, begin))
    offsets = torch.arange(QUERY_BLOCK, device=device)
    groups = []
    for width, members in by_width.items():
        requests = torch.tensor([r for r, _ in members], device=device)
        q_pos = torch.tensor([begin for _, begin in members], device=device)[:, None] + offsets  # [U, C]
        lens = metadata.seq_lens.to(device)[requests].long()[:, None]
        first = lens - (metadata.query_start_loc[requests + 1] - metadata.query_start_loc[requests]).long()[:, None]
        real = (q_pos >= first) & (q_pos < lens)
        rows = metadata.query_start_loc[requests].long()[:, None] + (q_pos - first).clamp(min=0).minimum(
            lens - first - 1
        )
        key_pos = torch.arange(width, device=device).minimum(lens - 1)  # [U, width]
        tables = metadata.block_tables[requests].long()
        slots = tables.gather(1, key_pos // block_size) * block_size + key_pos % block_size
        flat_real = real.reshape(-1)
        groups.append(
            AttentionGroup(
                width=width,
                blocks=len(members),
                request=members[0][0] if len(members) == 1 else -1,
                q_rows=rows.reshape(-1),
                slots=slots.reshape(-1),
                q_pos=q_pos[:, :, None],
                causal=torch.arange(width, device=device) <= q_pos[:, :, None],
                out_index=flat_real.nonzero().squeeze(1),
                out_rows=rows.reshape(-1)[flat_real],
            )
        )
    return groups


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # neox layout: the rotated dims are split in halves; dims past 2 * cos.shape[-1] pass through
    rot = 2 * cos.shape[-1]
    x_rot, x_pass = x[..., :rot].float(), x[..., rot:]
    x1, x2 = x_rot.chunk(2, dim=-1)
    rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)
    return torch.cat((rotated, x_pass), dim=-1) if x_pass.numel() else rotated


def _sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float, softcap: float | None
) -> torch.Tensor:
    # q: [..., H, Q, D]; k, v: [..., Hkv, L, D]; mask: bool, broadcast to [..., H, Q, L]
    if softcap is None:
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, scale=scale, enable_gqa=q.shape[-3] != k.shape[-3]
        )
    # SDPA cannot cap scores: the explicit softmax, in float32 as Gemma 2 computes it
    groups = q.shape[-3] // k.shape[-3]
    k, v = k.repeat_interleave(groups, dim=-3), v.repeat_interleave(groups, dim=-3)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(torch.softmax(scores.float(), dim=-1).to(q.dtype), v)
