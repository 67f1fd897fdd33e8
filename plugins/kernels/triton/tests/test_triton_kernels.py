"""The triton kernel set against the torch reference set.

Without CUDA every kernel runs under Triton's interpreter (conftest.py sets
``TRITON_INTERPRET=1``), so shapes are tiny; on a CUDA machine the same tests
run the compiled kernels. Caches start filled with NaN so a kernel that reads a
slot it should not shows up as NaN in its output.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from llmp_kernels_torch.kernels import TorchKernels
from llmp_kernels_triton.kernels import TritonKernels

from llmp import registry
from llmp.api import AttentionMetadata, KernelSet
from llmp.modeling.rope import cos_sin_table

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
REF, TRI = TorchKernels(), TritonKernels()
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def rand(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, device=DEVICE).to(dtype)


def close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    torch.testing.assert_close(actual, expected, atol=TOL[dtype], rtol=TOL[dtype])


def test_registered_for_cuda_and_satisfies_the_contract():
    spec = registry.get_component("kernels", "triton")
    assert spec.distribution == "llmp-kernels-triton" and spec.devices == ("cuda",) and spec.priority == 10
    assert registry.select_kernels(None, "cuda").name == "triton"
    assert registry.select_kernels(None, "cpu").name != "triton"
    kernels = spec.load()()
    assert isinstance(kernels, KernelSet) and kernels.name == "triton"


@pytest.mark.skipif(DEVICE == "cuda", reason="checks the message shown on a machine without CUDA")
def test_without_cuda_or_interpreter_the_set_refuses_to_start():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = "from llmp_kernels_triton.kernels import TritonKernels; TritonKernels()"
    result = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode != 0 and "needs a CUDA device" in result.stderr


def test_every_kernel_compiles_for_sm90_without_a_gpu():
    # the interpreter never compiles: this runs triton's real pipeline (bundled ptxas) down to cubins
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = Path(__file__).with_name("compile_for_gpu.py")
    result = subprocess.run(
        [sys.executable, str(script)], check=False, capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("ok ") == 31  # attention: 3 configurations x (2 main variants, segment, merge)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,size", [(5, 64), (7, 48)])
def test_rms_norm_with_and_without_residual(dtype, rows, size):
    torch.manual_seed(0)
    x, res, w = rand(rows, size, dtype=dtype), rand(rows, size, dtype=dtype), rand(size, dtype=dtype)
    close(TRI.rms_norm(x, w, 1e-6), REF.rms_norm(x, w, 1e-6), dtype)
    out, summed = TRI.rms_norm(x, w, 1e-5, residual=res)
    ref_out, ref_summed = REF.rms_norm(x, w, 1e-5, residual=res)
    assert torch.equal(summed, ref_summed)  # the residual stream is rounded exactly like torch's add
    close(out, ref_out, dtype)


def test_rms_norm_of_strided_rows_and_float32_weight():
    torch.manual_seed(0)
    x = rand(6, 40, dtype=torch.bfloat16)[:, :32]  # rows 40 apart, as a split of a fused projection
    w = rand(32)
    close(TRI.rms_norm(x, w, 1e-6), REF.rms_norm(x, w, 1e-6), torch.bfloat16)  # promoted to float32, as in torch


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rotary_dim", [16, 8])
def test_rotary_full_and_partial(dtype, rotary_dim):
    torch.manual_seed(0)
    positions = torch.tensor([0, 3, 7, 100, 5], device=DEVICE)
    qkv = rand(5, (4 + 2 + 2) * 16, dtype=dtype)
    q = qkv[:, : 4 * 16].view(5, 4, 16)  # non-contiguous views, as the model's fused QKV split gives
    k = qkv[:, 4 * 16 : 6 * 16].view(5, 2, 16)
    table = cos_sin_table(rotary_dim, 128, base=10000.0).to(DEVICE)
    (q_out, k_out), (q_ref, k_ref) = TRI.rotary(positions, q, k, table), REF.rotary(positions, q, k, table)
    close(q_out, q_ref, dtype)
    close(k_out, k_ref, dtype)
    assert torch.equal(q_out[..., rotary_dim:], q[..., rotary_dim:])  # partial rotary passes the rest through


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_gelu_tanh_and_mul(dtype):
    torch.manual_seed(0)
    x = rand(3, 2, 2 * 20, dtype=dtype) * 3
    close(TRI.silu_and_mul(x), REF.silu_and_mul(x), dtype)
    close(TRI.gelu_tanh_and_mul(x), REF.gelu_tanh_and_mul(x), dtype)
    wide = rand(2, 2 * 1500, dtype=dtype)  # several column blocks per row
    close(TRI.silu_and_mul(wide), REF.silu_and_mul(wide), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_write_kv_skips_minus_one_slots(dtype):
    torch.manual_seed(0)
    caches = [torch.full((3, 4, 2, 8), float("nan"), device=DEVICE, dtype=dtype) for _ in range(4)]
    k, v = rand(4, 2, 8, dtype=dtype), rand(4, 2, 8, dtype=dtype)
    slots = torch.tensor([5, -1, 11, 0], device=DEVICE)
    TRI.write_kv(k, v, caches[0], caches[1], slots)
    REF.write_kv(k, v, caches[2], caches[3], slots)
    for ours, ref in zip(caches[:2], caches[2:]):
        assert torch.equal(ours.isnan(), ref.isnan()) and torch.equal(ours.nan_to_num(), ref.nan_to_num())
    assert int((~caches[0].isnan()).any(-1).any(-1).sum()) == 3


def test_launchers_reject_bad_inputs_clearly():
    q = rand(4, 4, 16)
    with pytest.raises(ValueError, match="rotary: k must have shape"):
        TRI.rotary(torch.arange(4, device=DEVICE), q, rand(4, 2, 8), cos_sin_table(16, 32, 10000.0).to(DEVICE))
    with pytest.raises(ValueError, match="contiguous in its last dimension"):
        TRI.silu_and_mul(rand(8, 3).t())
    with pytest.raises(ValueError, match="residual must match"):
        TRI.rms_norm(rand(2, 8), rand(8), 1e-6, residual=rand(2, 8, dtype=torch.float16))
    with pytest.raises(ValueError, match="float32, float16 or bfloat16"):
        TRI.silu_and_mul(torch.ones(2, 4, dtype=torch.int64, device=DEVICE))
    cache = torch.zeros(4, 4, 3, 16, device=DEVICE)
    meta = AttentionMetadata(
        torch.tensor([0, 4], dtype=torch.int32),
        torch.tensor([4], dtype=torch.int32),
        torch.zeros(1, 1, dtype=torch.int32),
        torch.arange(4),
        4,
        4,
    )
    with pytest.raises(ValueError, match=r"query heads \(4\) must be a multiple of KV heads \(3\)"):
        TRI.paged_attention(q, cache, cache, meta, 0.25)


# -- paged attention ------------------------------------------------------------


def build_batch(requests, heads, kv_heads, head_dim, block_size, dtype, window=None, seed=0):
    """Caches (NaN wherever nothing was written), q and metadata for requests of (cached, new) tokens."""
    torch.manual_seed(seed)
    max_blocks = max(-(-(c + n) // block_size) for c, n in requests) + 1  # +1: a padded table column
    num_blocks = sum(-(-(c + n) // block_size) for c, n in requests) + 3  # spare blocks stay NaN
    k_cache = torch.full((num_blocks, block_size, kv_heads, head_dim), float("nan"), dtype=dtype, device=DEVICE)
    v_cache = k_cache.clone()
    free = torch.randperm(num_blocks).tolist()  # scattered physical blocks
    unused = free.pop()
    tables, seq_lens, starts, slots, qs = [], [], [0], [], []
    for cached, new in requests:
        total = cached + new
        blocks = [free.pop() for _ in range(-(-total // block_size))]
        flat = torch.tensor(
            [blocks[p // block_size] * block_size + p % block_size for p in range(total)], device=DEVICE
        )
        # the cached prefix and this step's tokens are all written before attention runs
        REF.write_kv(
            rand(total, kv_heads, head_dim, dtype=dtype),
            rand(total, kv_heads, head_dim, dtype=dtype),
            k_cache,
            v_cache,
            flat,
        )
        slots.append(flat[cached:])
        qs.append(rand(new, heads, head_dim, dtype=dtype))
        tables.append(blocks + [unused] * (max_blocks - len(blocks)))  # padding points at a NaN block
        seq_lens.append(total)
        starts.append(starts[-1] + new)
    meta = AttentionMetadata(
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=DEVICE),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE),
        block_tables=torch.tensor(tables, dtype=torch.int32, device=DEVICE),
        slot_mapping=torch.cat(slots),
        max_query_len=max(n for _, n in requests),
        max_seq_len=max(seq_lens),
        sliding_window=window,
    )
    return torch.cat(qs), k_cache, v_cache, meta


PREFILL = [(0, 7), (0, 12)]
PREFIX = [(5, 6), (9, 4), (16, 1)]
DECODE = [(9, 1), (3, 1), (17, 1), (0, 1)]
MIXED = [(0, 7), (5, 6), (9, 1), (3, 1)]


@pytest.mark.parametrize(
    "requests,heads,kv_heads,block_size,window,softcap",
    [
        pytest.param(PREFILL, 4, 2, 4, None, None, id="prefill"),
        pytest.param(PREFIX, 4, 2, 4, None, None, id="cached-prefix"),
        pytest.param(DECODE, 4, 2, 4, None, None, id="decode"),
        pytest.param(MIXED, 4, 2, 4, None, None, id="mixed"),
        pytest.param(MIXED, 4, 1, 4, None, None, id="mixed-gqa4"),
        pytest.param(MIXED, 4, 2, 16, None, None, id="mixed-block16"),
        pytest.param(DECODE, 4, 1, 16, None, None, id="decode-gqa4-block16"),
        pytest.param(MIXED, 4, 2, 4, 5, None, id="mixed-window5"),
        pytest.param(PREFIX, 4, 1, 16, 3, None, id="prefix-window3-block16"),
        pytest.param(MIXED, 4, 2, 4, None, 5.0, id="mixed-softcap"),
        pytest.param(MIXED, 4, 2, 4, 4, 5.0, id="mixed-window-softcap"),
        pytest.param([(60, 20), (70, 1)], 4, 2, 4, None, None, id="several-key-tiles"),
    ],
)
def test_paged_attention_matches_torch(requests, heads, kv_heads, block_size, window, softcap):
    q, k_cache, v_cache, meta = build_batch(requests, heads, kv_heads, 16, block_size, torch.float32, window)
    scale = 1 / math.sqrt(16) * 4  # sharper than uniform, so masks and caps matter
    out = TRI.paged_attention(q, k_cache, v_cache, meta, scale, softcap=softcap)
    assert not out.isnan().any()  # the NaN in unwritten slots never leaks
    close(out, REF.paged_attention(q, k_cache, v_cache, meta, scale, softcap=softcap), torch.float32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("window,softcap", [(None, None), (6, 20.0)])
def test_paged_attention_half_precision(dtype, window, softcap):
    q, k_cache, v_cache, meta = build_batch(MIXED, 4, 2, 16, 4, dtype, window)
    out = TRI.paged_attention(q, k_cache, v_cache, meta, 0.25, softcap=softcap)
    # against the float32 reference: our softmax runs in float32, the torch set's SDPA partly in half precision
    expected = REF.paged_attention(q.float(), k_cache.float(), v_cache.float(), meta, 0.25, softcap=softcap)
    close(out.float(), expected, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_positions_attention_does_not_depend_on_how_it_is_batched(dtype):
    """Bit-identical output for a position computed in a whole prompt, after a cached prefix, as a
    decode, alone or beside other requests (the tile shape must not follow the batch)."""
    gen = torch.Generator().manual_seed(5)
    total, heads, kv_heads, dim, block = 21, 4, 2, 16, 4
    q_all, k_all, v_all = (torch.randn(total, n, dim, generator=gen).to(dtype) for n in (heads, kv_heads, kv_heads))
    other = torch.randn(40, kv_heads, dim, generator=gen).to(dtype)  # a 40-token prompt computed beside
    layouts = [[(0, total)], [(total - 2, 2)], [(0, total - 3), *[(n, 1) for n in range(total - 3, total)]]]
    results = []
    for layout in layouts:
        for beside in (False, True):
            got = torch.full((total, heads, dim), float("nan"), dtype=dtype)
            k_cache = torch.full((20, block, kv_heads, dim), float("nan"), dtype=dtype, device=DEVICE)
            v_cache = k_cache.clone()
            own, theirs = list(range(6)), list(range(6, 16))
            prefix = torch.tensor([own[p // block] * block + p % block for p in range(layout[0][0])], dtype=torch.long)
            REF.write_kv(k_all[: len(prefix)], v_all[: len(prefix)], k_cache, v_cache, prefix.to(DEVICE))
            for cached, new in layout:
                lens, starts = [cached + new], [0, new]
                slots = [own[p // block] * block + p % block for p in range(cached, cached + new)]
                qs, ks, vs = (
                    [q_all[cached : cached + new]],
                    [k_all[cached : cached + new]],
                    [v_all[cached : cached + new]],
                )
                if beside:
                    lens.append(40)
                    starts.append(new + 40)
                    slots += [theirs[p // block] * block + p % block for p in range(40)]
                    qs.append(other.repeat(1, heads // kv_heads, 1))
                    ks.append(other)
                    vs.append(other.flip(0))
                metadata = AttentionMetadata(
                    torch.tensor(starts, dtype=torch.int32, device=DEVICE),
                    torch.tensor(lens, dtype=torch.int32, device=DEVICE),
                    torch.tensor([own + [0] * 4, theirs][: len(lens)], dtype=torch.int32, device=DEVICE),
                    torch.tensor(slots, device=DEVICE),
                    max(starts[i + 1] - starts[i] for i in range(len(lens))),
                    max(lens),
                )
                TRI.write_kv(
                    torch.cat(ks).to(DEVICE), torch.cat(vs).to(DEVICE), k_cache, v_cache, metadata.slot_mapping
                )
                out = TRI.paged_attention(torch.cat(qs).to(DEVICE), k_cache, v_cache, metadata, 0.25)
                got[cached : cached + new] = out[:new].cpu()
            results.append(got)
    assert not results[0].isnan().any()
    for got in results[1:]:  # the positions each way computed (a cached prefix's are not)
        computed = ~got.isnan().flatten(1).any(1)
        assert computed.sum() >= 2 and torch.equal(got[computed], results[0][computed])


LONG = [(150, 1), (70, 1), (60, 20), (0, 1), (200, 1), (64, 1)]  # decodes over 1-4 segments of 64 keys


@pytest.mark.parametrize("window,softcap", [(None, None), (37, None), (None, 5.0), (100, 5.0)])
@pytest.mark.parametrize("kv_heads", [2, 1])
def test_long_decodes_split_by_key_segment_match_torch_bit_for_bit_with_the_unsplit_path(
    monkeypatch, window, softcap, kv_heads
):
    from llmp_kernels_triton import attention

    monkeypatch.setattr(attention, "SEGMENT", 64)
    q, k_cache, v_cache, meta = build_batch(LONG, 4, kv_heads, 16, 16, torch.float32, window, seed=3)
    expected = REF.paged_attention(q, k_cache, v_cache, meta, 0.5, softcap=softcap)
    outs = {}
    for split in (True, False):
        monkeypatch.setattr(attention, "SPLIT_DECODES", split)
        outs[split] = TRI.paged_attention(q, k_cache, v_cache, meta, 0.5, softcap=softcap)
    assert not outs[True].isnan().any()
    close(outs[True], expected, torch.float32)
    assert torch.equal(outs[True], outs[False])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_split_decode_equals_the_same_position_in_a_prompt_chunk(monkeypatch, dtype):
    """Segments start at key 0 whichever path runs: a decode split across programs sums in the order a
    chunk's row summed in one program, where segments past the row's position add exactly nothing. (The
    position is the chunk's first row, so both products are the dot's row 0: under the interpreter, numpy's
    matmul may round rows at other offsets otherwise; the GPU's does not.)"""
    from llmp_kernels_triton import attention

    monkeypatch.setattr(attention, "SEGMENT", 64)
    monkeypatch.setattr(attention, "SPLIT_DECODES", True)
    gen = torch.Generator().manual_seed(9)
    total, heads, kv_heads, dim, block = 150, 4, 2, 16, 8
    q_all, k_all, v_all = (torch.randn(total, n, dim, generator=gen).to(dtype) for n in (heads, kv_heads, kv_heads))
    blocks = torch.randperm(total // block + 2, generator=gen)[: -(-total // block)].tolist()
    slots = torch.tensor([blocks[p // block] * block + p % block for p in range(total)], device=DEVICE)
    k_cache = torch.full((len(blocks) + 2, block, kv_heads, dim), float("nan"), dtype=dtype, device=DEVICE)
    v_cache = k_cache.clone()
    REF.write_kv(k_all.to(DEVICE), v_all.to(DEVICE), k_cache, v_cache, slots)
    table = torch.tensor([blocks], dtype=torch.int32, device=DEVICE)

    def run(first: int, last: int) -> torch.Tensor:
        meta = AttentionMetadata(
            torch.tensor([0, last - first], dtype=torch.int32, device=DEVICE),
            torch.tensor([last], dtype=torch.int32, device=DEVICE),
            table,
            slots[first:last],
            last - first,
            last,
        )
        return TRI.paged_attention(q_all[first:last].to(DEVICE), k_cache, v_cache, meta, 0.25).cpu()

    for position in (5, 60, 63, 64, 100, 127, 140):  # one segment, segment edges, chunks crossing them
        decode, chunk = run(position, position + 1)[0], run(position, min(position + 8, total))[0]
        assert not decode.isnan().any() and torch.equal(decode, chunk)


# -- end to end: test_engine_parity.py (the engine with this set against transformers, on each device present)
