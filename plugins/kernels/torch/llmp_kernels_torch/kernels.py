"""Reference kernels in plain PyTorch.

Correctness first: these define what every kernel set must compute. Shapes:
``T`` tokens in the flattened batch, ``H`` query heads, ``Hkv`` KV heads,
``D`` head size, ``N`` hidden size, ``B`` cache blocks, ``S`` block size.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from llmp.api import AttentionMetadata


class TorchKernels:
    name = "torch"

    def rms_norm(
        self, x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        # x, residual: [T, N]; the sum stays in x's dtype, as in Hugging Face models
        if residual is not None:
            x = x + residual
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
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
    ) -> torch.Tensor:
        # q: [T, H, D] -> [T, H, D]; one request at a time, gathering its blocks
        out = torch.empty_like(q)
        block_size = k_cache.shape[1]
        starts = metadata.query_start_loc.tolist()
        seq_lens = metadata.seq_lens.tolist()
        for r, seq_len in enumerate(seq_lens):
            q_start, q_end = starts[r], starts[r + 1]
            if q_end == q_start:
                continue
            num_blocks = -(-seq_len // block_size)
            blocks = metadata.block_tables[r, :num_blocks].long()
            keys = k_cache[blocks].flatten(0, 1)[:seq_len]  # [L, Hkv, D]
            values = v_cache[blocks].flatten(0, 1)[:seq_len]
            mask = _causal_mask(q_end - q_start, seq_len, metadata.sliding_window, q.device)
            out[q_start:q_end] = _attend(q[q_start:q_end], keys, values, mask, scale)
        return out


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # neox layout: the rotated dims are split in halves; dims past 2 * cos.shape[-1] pass through
    rot = 2 * cos.shape[-1]
    x_rot, x_pass = x[..., :rot].float(), x[..., rot:]
    x1, x2 = x_rot.chunk(2, dim=-1)
    rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)
    return torch.cat((rotated, x_pass), dim=-1) if x_pass.numel() else rotated


def _causal_mask(q_len: int, seq_len: int, window: int | None, device: torch.device) -> torch.Tensor:
    # query i sits at position seq_len - q_len + i and sees keys at positions <= its own
    q_pos = torch.arange(seq_len - q_len, seq_len, device=device).unsqueeze(1)
    k_pos = torch.arange(seq_len, device=device).unsqueeze(0)
    mask = k_pos <= q_pos
    if window is not None:
        mask &= k_pos > q_pos - window
    return mask  # [q_len, seq_len]


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    # q: [Q, H, D]; k, v: [L, Hkv, D]; grouped-query heads share KV heads
    group = q.shape[1] // k.shape[1]
    q_ = q.transpose(0, 1)  # [H, Q, D]
    k_ = k.transpose(0, 1).repeat_interleave(group, dim=0).to(q.dtype)
    v_ = v.transpose(0, 1).repeat_interleave(group, dim=0).to(q.dtype)
    out = F.scaled_dot_product_attention(q_, k_, v_, attn_mask=mask, scale=scale)
    return out.transpose(0, 1)
