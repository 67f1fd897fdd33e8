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
        # q: [T, H, D] -> [T, H, D]. Decodes (one query row) go through one batched
        # SDPA call; prefill chunks run one request at a time.
        out = torch.empty_like(q)
        starts = metadata.query_start_loc.tolist()
        seq_lens = metadata.seq_lens.tolist()
        decodes = [r for r in range(len(seq_lens)) if starts[r + 1] - starts[r] == 1]
        if decodes:
            rows = torch.tensor([starts[r] for r in decodes], device=q.device)
            out[rows] = _decode(q[rows], k_cache, v_cache, metadata, decodes, seq_lens, scale, softcap)
        for r in range(len(seq_lens)) if len(decodes) < len(seq_lens) else ():
            q_start, q_end = starts[r], starts[r + 1]
            if q_end - q_start <= 1:
                continue
            keys, values = _gather(k_cache, v_cache, metadata.block_tables[r], seq_lens[r])
            out[q_start:q_end] = _attend(
                q[q_start:q_end], keys, values, seq_lens[r], metadata.sliding_window, scale, softcap
            )
        return out


def _gather(
    k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor, seq_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    # one request's keys and values in order: [L, Hkv, D]
    blocks = block_table[: -(-seq_len // k_cache.shape[1])].long()
    return k_cache[blocks].flatten(0, 1)[:seq_len], v_cache[blocks].flatten(0, 1)[:seq_len]


def _decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    metadata: AttentionMetadata,
    requests: list[int],
    seq_lens: list[int],
    scale: float,
    softcap: float | None,
) -> torch.Tensor:
    # q: [B, H, D], one row per request; keys padded to the longest sequence
    block_size = k_cache.shape[1]
    lengths = torch.tensor([seq_lens[r] for r in requests], device=q.device)
    longest = int(lengths.max())
    tables = metadata.block_tables[requests, : -(-longest // block_size)].long()
    keys = k_cache[tables].flatten(1, 2).transpose(1, 2)  # [B, Hkv, Lpad, D]
    values = v_cache[tables].flatten(1, 2).transpose(1, 2)
    positions = torch.arange(keys.shape[2], device=q.device)
    valid = positions < lengths[:, None]  # [B, Lpad]
    if metadata.sliding_window is not None:
        valid &= positions > (lengths[:, None] - 1 - metadata.sliding_window)
    # Slots past a sequence's end were never written (they may hold NaN): zero them.
    keep = valid[:, None, :, None]
    keys = keys.masked_fill(~keep, 0).to(q.dtype)
    values = values.masked_fill(~keep, 0).to(q.dtype)
    out = _sdpa(q.unsqueeze(2), keys, values, valid[:, None, None, :], scale, softcap)
    return out.squeeze(2)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # neox layout: the rotated dims are split in halves; dims past 2 * cos.shape[-1] pass through
    rot = 2 * cos.shape[-1]
    x_rot, x_pass = x[..., :rot].float(), x[..., rot:]
    x1, x2 = x_rot.chunk(2, dim=-1)
    rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)
    return torch.cat((rotated, x_pass), dim=-1) if x_pass.numel() else rotated


def _attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    seq_len: int,
    window: int | None,
    scale: float,
    softcap: float | None,
) -> torch.Tensor:
    # q: [Q, H, D] are the last Q positions of the sequence; k, v: [L, Hkv, D]
    q_len = q.shape[0]
    q_, k_, v_ = q.transpose(0, 1), k.transpose(0, 1).to(q.dtype), v.transpose(0, 1).to(q.dtype)
    gqa = q.shape[1] != k.shape[1]
    if q_len == seq_len and window is None and softcap is None:  # no cached prefix: the fused causal path
        out = F.scaled_dot_product_attention(q_, k_, v_, is_causal=True, scale=scale, enable_gqa=gqa)
    else:
        out = _sdpa(q_, k_, v_, _causal_mask(q_len, seq_len, window, q.device), scale, softcap)
    return out.transpose(0, 1)


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


def _causal_mask(q_len: int, seq_len: int, window: int | None, device: torch.device) -> torch.Tensor:
    # query i sits at position seq_len - q_len + i and sees keys at positions <= its own
    q_pos = torch.arange(seq_len - q_len, seq_len, device=device).unsqueeze(1)
    k_pos = torch.arange(seq_len, device=device).unsqueeze(0)
    mask = k_pos <= q_pos
    if window is not None:
        mask &= k_pos > q_pos - window
    return mask  # [q_len, seq_len]
