"""The torch kernel set against first-principles formulas (float64 where it matters): float16
attention and Llama 3's rope table. (Every kernel in float32 and bfloat16 against the conformance
kit's float64 formulas: tests/test_conformance.py.)"""

from __future__ import annotations

import math

import pytest
import torch
from llmp_kernels_torch.kernels import TorchKernels

from llmp import registry
from llmp.api import AttentionMetadata, KernelSet
from llmp.modeling.rope import inverse_frequencies

K = TorchKernels()


def test_registered_lazily_and_satisfies_the_contract():
    spec = registry.get_component("kernels", "torch")
    assert spec.distribution == "llmp-kernels-torch" and "cpu" in spec.devices
    assert isinstance(spec.load()(), KernelSet)


def test_llama3_rope_scaling_keeps_high_and_slows_low_frequencies():
    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    plain, scaled = inverse_frequencies(128, 500000.0), inverse_frequencies(128, 500000.0, scaling)
    wavelen = 2 * math.pi / plain
    high = wavelen < 8192 / 4.0
    low = wavelen > 8192 / 1.0
    torch.testing.assert_close(scaled[high], plain[high])
    torch.testing.assert_close(scaled[low], plain[low] / 8.0)
    middle = ~(high | low)
    assert middle.any() and torch.all(scaled[middle] < plain[middle]) and torch.all(scaled[middle] > plain[middle] / 8)
    with pytest.raises(ValueError, match="not supported"):
        inverse_frequencies(8, 10000.0, {"rope_type": "yarn-ish"})


def _dense_attention(q, keys, values, q_len, window=None):
    # float64 softmax(q k^T) v with causal (and optional sliding-window) masking; GQA by head groups
    L, group = keys.shape[0], q.shape[1] // keys.shape[1]
    out = torch.zeros(q.shape, dtype=torch.float64)
    for i in range(q_len):
        pos = L - q_len + i
        lo = 0 if window is None else max(0, pos - window + 1)
        for h in range(q.shape[1]):
            kh, vh = keys[lo : pos + 1, h // group].double(), values[lo : pos + 1, h // group].double()
            scores = kh @ q[i, h].double() / math.sqrt(q.shape[-1])
            out[i, h] = torch.softmax(scores, 0) @ vh
    return out


@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("dtype", [torch.float16])  # float32 and bfloat16: tests/test_conformance.py
def test_paged_attention_mixed_prefill_and_decode(window, dtype):
    torch.manual_seed(0)
    heads, kv_heads, head_dim, block_size, num_blocks = 4, 2, 16, 4, 16
    # (cached tokens, new tokens): a fresh prefill, a chunk after a cached prefix, two decodes
    requests = [(0, 7), (5, 6), (9, 1), (3, 1)]
    k_cache = torch.zeros(num_blocks, block_size, kv_heads, head_dim, dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    free = torch.randperm(num_blocks).tolist()  # scattered physical blocks
    tables, seq_lens, q_starts, slots, qs, truth = [], [], [0], [], [], []
    for cached, new in requests:
        total = cached + new
        blocks = [free.pop() for _ in range(-(-total // block_size))]
        keys, values = (
            torch.randn(total, kv_heads, head_dim, dtype=dtype),
            torch.randn(total, kv_heads, head_dim, dtype=dtype),
        )
        flat = [blocks[p // block_size] * block_size + p % block_size for p in range(total)]
        K.write_kv(keys[:cached], values[:cached], k_cache, v_cache, torch.tensor(flat[:cached], dtype=torch.long))
        slots += flat[cached:]
        q = torch.randn(new, heads, head_dim, dtype=dtype)
        qs.append(q)
        truth.append(_dense_attention(q, keys, values, new, window))
        tables.append(blocks + [0] * (4 - len(blocks)))
        seq_lens.append(total)
        q_starts.append(q_starts[-1] + new)
        new_k, new_v = keys[cached:], values[cached:]
        K.write_kv(new_k, new_v, k_cache, v_cache, torch.tensor(flat[cached:], dtype=torch.long))
    meta = AttentionMetadata(
        query_start_loc=torch.tensor(q_starts, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_tables=torch.tensor(tables, dtype=torch.int32),
        slot_mapping=torch.tensor(slots, dtype=torch.long),
        max_query_len=max(n for _, n in requests),
        max_seq_len=max(seq_lens),
        sliding_window=window,
    )
    out = K.paged_attention(torch.cat(qs), k_cache, v_cache, meta, scale=1 / math.sqrt(head_dim))
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    torch.testing.assert_close(out.double(), torch.cat(truth), atol=tol, rtol=tol)
