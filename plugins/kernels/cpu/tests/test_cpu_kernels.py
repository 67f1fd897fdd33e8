"""The cpu kernel set against the torch reference set, and the packed linear layers in a real engine.

Caches start filled with NaN, so a kernel that reads a slot it should not shows
up as NaN in its output.
"""

from __future__ import annotations

import platform
import random
import subprocess
import sys

import pytest
import torch
from llmp_kernels_cpu.kernels import CpuKernels, PackedLinear, UpcastLinear, native_matmul, plan_attention
from llmp_kernels_torch.kernels import TorchKernels

from llmp import registry
from llmp.api import AttentionMetadata, KernelSet, PacksLinear

REF = TorchKernels()
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}
MKLDNN = torch.backends.mkldnn.is_available()


def test_registered_as_the_default_on_cpu():
    spec = registry.get_component("kernels", "cpu")
    assert spec.distribution == "llmp-kernels-cpu" and spec.devices == ("cpu",)
    assert registry.select_kernels(None, "cpu").name == "cpu"
    kernels = spec.load()()
    assert isinstance(kernels, KernelSet) and isinstance(kernels, PacksLinear) and kernels.name == "cpu"
    assert not isinstance(REF, PacksLinear)  # the reference leaves linear layers on F.linear


@pytest.mark.skipif(not MKLDNN, reason="torch built without oneDNN")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows", [1, 3, 32, 300])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_matches_f_linear(dtype, rows, bias):
    torch.manual_seed(rows)
    weight, x = torch.randn(96, 64).to(dtype), torch.randn(rows, 64).to(dtype)
    b = torch.randn(96).to(dtype) if bias else None
    packed = CpuKernels().pack_linear(weight, b)
    # native bfloat16/float16 matmuls where the CPU has them, a float32 copy where it has not
    assert type(packed) is (PackedLinear if native_matmul(dtype) else UpcastLinear)
    assert (packed.out_features, packed.in_features) == (96, 64)
    out = packed(x)
    assert out.dtype == dtype and out.shape == (rows, 96)
    expected = torch.nn.functional.linear(x.float(), weight.float(), None if b is None else b.float())
    torch.testing.assert_close(out.float(), expected, atol=0.1, rtol=2e-2)


@pytest.mark.skipif(not MKLDNN, reason="torch built without oneDNN")
@pytest.mark.parametrize("rows", [1, 5, 64])
def test_upcast_linear_rounds_a_float32_product_once(rows):
    # on any CPU: the float32 product of the same bf16 values, rounded once to bf16
    torch.manual_seed(rows)
    weight, x, b = torch.randn(80, 48).bfloat16(), torch.randn(rows, 48).bfloat16(), torch.randn(80).bfloat16()
    out = UpcastLinear(weight, b)(x)
    assert out.dtype == torch.bfloat16
    expected = torch.nn.functional.linear(x.float(), weight.float(), b.float())
    # float32 sums in another order differ in the last bits; after rounding to bf16 at most one step apart
    torch.testing.assert_close(out.float(), expected.bfloat16().float(), atol=1e-5, rtol=2**-7)
    assert (out.float() - expected).abs().max() <= expected.abs().max() * 2**-8 + 1e-6


def test_its_isa_path_says_how_half_precision_layers_multiply():
    """oneDNN's own bfloat16 matmul where it has one, else the float32 copies of UpcastLinear: never torch's
    "emulated", which this set does not run; nothing about matmuls for float32 (MKL, as torch)."""
    kernels, capability = CpuKernels(), torch.backends.cpu.get_cpu_capability()
    for dtype, half in (("bfloat16", torch.bfloat16), ("float16", torch.float16)):
        how = "native" if native_matmul(half) else "on float32 copies"
        path = kernels.isa_path("cpu", dtype)
        assert path.startswith(capability) and path.endswith(f", {dtype} matmul {how} (oneDNN)"), path
        packed = kernels.pack_linear(torch.randn(8, 16).to(half), None)
        assert isinstance(packed, UpcastLinear) == (how == "on float32 copies")
    assert "matmul" not in kernels.isa_path("cpu", "float32")


def test_float32_weights_stay_on_f_linear():
    assert CpuKernels().pack_linear(torch.randn(8, 4), None) is None


def _batch(
    dtype: torch.dtype,
    lens: list[int],
    qlens: list[int],
    window: int | None,
    block: int = 4,
    heads: int = 6,
    kv_heads: int = 2,
    dim: int = 16,
):
    """A mixed batch over a NaN-filled paged cache whose earlier positions are written."""
    gen = torch.Generator().manual_seed(sum(lens) + len(lens))
    num_blocks = sum(-(-n // block) for n in lens) + 4
    k_cache = torch.full((num_blocks, block, kv_heads, dim), float("nan"), dtype=dtype)
    v_cache = k_cache.clone()
    free = torch.randperm(num_blocks, generator=gen).tolist()
    tables, slots, starts = [], [], [0]
    for seq_len, q_len in zip(lens, qlens, strict=True):
        table = [free.pop() for _ in range(-(-seq_len // block))]
        tables.append(table)
        for pos in range(seq_len - q_len):
            k_cache[table[pos // block], pos % block] = torch.randn(kv_heads, dim, generator=gen).to(dtype)
            v_cache[table[pos // block], pos % block] = torch.randn(kv_heads, dim, generator=gen).to(dtype)
        slots += [table[p // block] * block + p % block for p in range(seq_len - q_len, seq_len)]
        starts.append(starts[-1] + q_len)
    block_tables = torch.zeros(len(lens), max(map(len, tables)), dtype=torch.int32)
    for i, table in enumerate(tables):
        block_tables[i, : len(table)] = torch.tensor(table)
    metadata = AttentionMetadata(
        torch.tensor(starts, dtype=torch.int32),
        torch.tensor(lens, dtype=torch.int32),
        block_tables,
        torch.tensor(slots),
        max(qlens),
        max(lens),
        window,
    )
    tokens = starts[-1]
    qkv = [torch.randn(tokens, n, dim, generator=gen).to(dtype) for n in (heads, kv_heads, kv_heads)]
    return metadata, k_cache, v_cache, qkv


BATCHES = {
    "decodes only": ([9, 17, 5, 30], [1, 1, 1, 1]),
    "one decode": ([23], [1]),
    "prefills only": ([7, 12], [7, 12]),
    "mixed with a cached-prefix chunk": ([9, 13, 7, 20], [1, 13, 1, 3]),
    "equal chunks after a shared prefix": ([21, 9, 21, 21, 6], [5, 1, 5, 5, 6]),
    "equal whole prompts": ([6, 6, 6], [6, 6, 6]),
    # enough decodes of spread lengths to split into length groups, with a prefill chunk between them
    "decodes in length groups": (
        [40, 3, 38, 7, 12, 33, 9, 25, 18, 30, 5, 22, 14, 36, 11, 27, 8, 20, 16, 31, 29],
        [1] * 10 + [4] + [1] * 10,
    ),
    "decodes in length groups only": (
        [40, 3, 38, 7, 12, 33, 9, 25, 18, 30, 5, 22, 14, 36, 11, 27, 8, 20, 16, 31],
        [1] * 20,
    ),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("batch", list(BATCHES))
def test_write_and_attend_match_the_reference(dtype, window, batch):
    lens, qlens = BATCHES[batch]
    metadata, k_cache, v_cache, (q, k, v) = _batch(dtype, lens, qlens, window)
    results = []
    for kernels in (REF, CpuKernels()):
        kc, vc = k_cache.clone(), v_cache.clone()
        kernels.write_kv(k, v, kc, vc, metadata.slot_mapping)
        out = kernels.paged_attention(q, kc, vc, metadata, scale=16**-0.5)
        results.append((kc, vc, out))
    (ref_k, ref_v, ref_out), (k_out, v_out, out) = results
    assert torch.equal(k_out.nan_to_num(7), ref_k.nan_to_num(7)) and torch.equal(
        v_out.nan_to_num(7), ref_v.nan_to_num(7)
    )
    assert not out.isnan().any()
    torch.testing.assert_close(out, ref_out, atol=TOL[dtype], rtol=TOL[dtype])


def test_padding_slots_are_skipped_on_write():
    metadata, k_cache, v_cache, (_, k, v) = _batch(torch.float32, [6, 3], [2, 3], None)
    slot_mapping = metadata.slot_mapping.clone()
    slot_mapping[1] = -1
    kc, vc = k_cache.clone(), v_cache.clone()
    CpuKernels().write_kv(k, v, kc, vc, slot_mapping)
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    REF.write_kv(k, v, ref_k, ref_v, slot_mapping)
    assert torch.equal(kc.nan_to_num(7), ref_k.nan_to_num(7)) and torch.equal(vc.nan_to_num(7), ref_v.nan_to_num(7))


def test_a_step_is_planned_once_for_every_layer(monkeypatch):
    metadata, k_cache, v_cache, (q, k, v) = _batch(torch.float32, [9, 17], [1, 1], None)
    calls = []
    import llmp_kernels_cpu.kernels as module

    def counting(*args):
        calls.append(1)
        return plan_attention(*args)

    monkeypatch.setattr(module, "plan_attention", counting)
    kernels = CpuKernels()
    fields = ("query_start_loc", "seq_lens", "block_tables", "slot_mapping", "max_query_len", "max_seq_len")
    for window in (None, 5, None):  # a windowed layer's metadata shares the step's tensors
        layer_metadata = AttentionMetadata(*[getattr(metadata, f) for f in fields], window)
        kernels.paged_attention(q, k_cache, v_cache, layer_metadata, scale=0.25)
    assert len(calls) == 1
    next_step = AttentionMetadata(
        *[
            getattr(metadata, f).clone() if f != "max_query_len" and f != "max_seq_len" else getattr(metadata, f)
            for f in fields
        ]
    )
    kernels.paged_attention(q, k_cache, v_cache, next_step, scale=0.25)
    assert len(calls) == 2  # a new step's metadata is planned again


@pytest.mark.skipif(not MKLDNN, reason="torch built without oneDNN")
def test_a_bfloat16_engine_packs_its_linears_and_agrees_with_the_reference(tmp_path):
    from llmp import LLM, SamplingParams
    from llmp.modeling.layers import PackableLinear
    from llmp.testing import save_tiny_llama

    save_tiny_llama(tmp_path, seed=3)
    rng = random.Random(0)
    prompts = [{"prompt_token_ids": [rng.randrange(3, 400) for _ in range(n)]} for n in (5, 17, 9)]
    params = SamplingParams(temperature=0, max_tokens=1, logprobs=5)
    logprobs = {}
    for kernels in ("torch", "cpu"):
        llm = LLM(str(tmp_path), dtype="bfloat16", kernels=kernels, block_size=4)
        model = llm.engine.executor.runner.model
        linears = [m for m in model.modules() if isinstance(m, PackableLinear)]
        if kernels == "cpu":
            assert linears and all(m.packed is not None for m in linears)
            assert model.lm_head.weight.numel() > 0 or not model.tie_word_embeddings
            assert all(m.weight.numel() == 0 for m in linears if m is not model.lm_head)  # the dense copies are gone
        else:
            assert all(m.packed is None for m in linears)
        outs = llm.generate(prompts, params)
        logprobs[kernels] = [
            dict(
                zip(
                    o.outputs[0].logprobs[0].keys(),
                    (lp.logprob for lp in o.outputs[0].logprobs[0].values()),
                    strict=True,
                )
            )
            for o in outs
        ]
        llm.shutdown() if hasattr(llm, "shutdown") else None
    for ref, got in zip(logprobs["torch"], logprobs["cpu"], strict=True):
        common = set(ref) & set(got)
        assert len(common) >= 4  # the same top tokens
        assert all(abs(ref[t] - got[t]) < 0.15 for t in common)


def _decode_steps(dtype: torch.dtype, lens: list[int], steps: int, leaves: dict[int, int], block: int = 4):
    """Metadata and q/k/v of ``steps`` decode steps over NaN-filled caches (two layers); request r
    is not in the batch from step ``leaves[r]`` on."""
    gen = torch.Generator().manual_seed(len(lens) + steps)
    heads, kv_heads, dim = 6, 2, 16
    tables = []
    free = torch.randperm(sum(-(-(n + steps) // block) for n in lens) + 4, generator=gen).tolist()
    caches = [torch.full((len(free), block, kv_heads, dim), float("nan"), dtype=dtype) for _ in range(4)]
    for seq_len in lens:
        tables.append([free.pop() for _ in range(-(-(seq_len + steps) // block))])
        for pos in range(seq_len - 1):
            for cache in caches:
                cache[tables[-1][pos // block], pos % block] = torch.randn(kv_heads, dim, generator=gen).to(dtype)
    batches = []
    for step in range(steps):
        alive = [r for r in range(len(lens)) if step < leaves.get(r, steps)]
        seq_lens = [lens[r] + step for r in alive]
        width = max(len(t) for t in tables)
        block_tables = torch.tensor([tables[r] + [0] * (width - len(tables[r])) for r in alive], dtype=torch.int32)
        slots = [tables[r][(n - 1) // block] * block + (n - 1) % block for r, n in zip(alive, seq_lens, strict=True)]
        metadata = AttentionMetadata(
            torch.arange(len(alive) + 1, dtype=torch.int32),
            torch.tensor(seq_lens, dtype=torch.int32),
            block_tables,
            torch.tensor(slots),
            1,
            max(seq_lens),
        )
        qkv = [torch.randn(len(alive), n, dim, generator=gen).to(dtype) for n in (heads, kv_heads, kv_heads)]
        batches.append((metadata, qkv))
    return caches, batches


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "lens", [[9, 17, 5, 30], [40, 3, 38, 7, 12, 33, 9, 25, 18, 30, 5, 22, 14, 36, 11, 27, 8, 20, 16, 31]]
)
def test_decode_steps_match_the_reference(dtype, lens):
    # request 1 leaves at step 3
    (ref_k0, ref_v0, ref_k1, ref_v1), batches = _decode_steps(dtype, lens, steps=7, leaves={1: 3})
    caches = [c.clone() for c in (ref_k0, ref_v0, ref_k1, ref_v1)]
    kernels = CpuKernels()
    for metadata, (q, k, v) in batches:
        for layer in range(2):
            ref_kc, ref_vc, kc, vc = (ref_k0, ref_v0, *caches[:2]) if layer == 0 else (ref_k1, ref_v1, *caches[2:])
            REF.write_kv(k, v + layer, ref_kc, ref_vc, metadata.slot_mapping)
            kernels.write_kv(k, v + layer, kc, vc, metadata.slot_mapping)
            expected = REF.paged_attention(q, ref_kc, ref_vc, metadata, scale=0.25)
            out = kernels.paged_attention(q, kc, vc, metadata, scale=0.25)
            torch.testing.assert_close(out, expected, atol=TOL[dtype], rtol=TOL[dtype])


def _layouts(total: int) -> list[list[tuple[int, int]]]:
    """Ways of computing positions of a ``total``-token sequence, as steps of (cached, new) chunks:
    whole, after cached prefixes (one ending on a block), in chunks, and one decode at a time."""
    return [
        [(0, total)],
        [(total - 3, 3)],
        [(32, total - 32)],
        [(0, 21), (21, 19), (40, total - 40)],
        [(0, total - 6), *[(n, 1) for n in range(total - 6, total)]],
    ]


@pytest.mark.parametrize("kernels", [REF, CpuKernels()], ids=["torch", "cpu"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_positions_attention_does_not_depend_on_how_it_is_batched(kernels, dtype):
    """Bit-identical output for a position whether computed in a whole prompt, after a cached prefix,
    in chunks, as a decode, alone or beside other requests of other lengths."""
    gen = torch.Generator().manual_seed(3)
    total, heads, kv_heads, dim, block = 77, 6, 2, 16, 4
    q_all, k_all, v_all = (torch.randn(total, n, dim, generator=gen).to(dtype) for n in (heads, kv_heads, kv_heads))
    others = [(torch.randn(n, kv_heads, dim, generator=gen).to(dtype), c) for n, c in ((50, 49), (130, 0), (9, 4))]
    results = []
    for layout in _layouts(total):
        for beside in (False, True):
            got = torch.full((total, heads, dim), float("nan"), dtype=dtype)
            k_cache = torch.full((80, block, kv_heads, dim), float("nan"), dtype=dtype)
            v_cache = k_cache.clone()
            seqs = [(k_all, v_all, q_all)] + ([(k, k.flip(0), k.repeat(1, 3, 1)) for k, _ in others] if beside else [])
            tables, first_free = [], 0
            for keys, *_ in seqs:
                tables.append(list(range(first_free, first_free + -(-keys.shape[0] // block))))
                first_free += len(tables[-1])
            prefix = [tables[0][p // block] * block + p % block for p in range(layout[0][0])]
            kernels.write_kv(
                k_all[: len(prefix)], v_all[: len(prefix)], k_cache, v_cache, torch.tensor(prefix, dtype=torch.long)
            )
            for cached, new in layout:
                # beside: the others' decodes (at their position ``c``) and whole prompts (``c == 0``)
                chunks = [(0, cached, new)] + (
                    [(i + 1, c, 1 if c else len(k)) for i, (k, c) in enumerate(others)] if beside else []
                )
                starts, lens, slots, qs, ks, vs = [0], [], [], [], [], []
                for index, start, count in chunks:
                    keys, values, queries = seqs[index]
                    positions = range(start, start + count)
                    slots += [tables[index][p // block] * block + p % block for p in positions]
                    qs.append(queries[start : start + count])
                    ks.append(keys[start : start + count])
                    vs.append(values[start : start + count])
                    starts.append(starts[-1] + count)
                    lens.append(start + count)
                width = max(map(len, tables))
                metadata = AttentionMetadata(
                    torch.tensor(starts, dtype=torch.int32),
                    torch.tensor(lens, dtype=torch.int32),
                    torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32),
                    torch.tensor(slots),
                    max(c for *_, c in chunks),
                    max(lens),
                )
                kernels.write_kv(torch.cat(ks), torch.cat(vs), k_cache, v_cache, metadata.slot_mapping)
                out = kernels.paged_attention(torch.cat(qs), k_cache, v_cache, metadata, scale=0.25)
                got[cached : cached + new] = out[:new]
            results.append(got)
    assert not results[0].isnan().any()
    for got in results[1:]:  # the positions each way computed (a cached prefix's are not)
        computed = ~got.isnan().flatten(1).any(1)
        assert computed.sum() >= 3 and torch.equal(got[computed], results[0][computed])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rotary_dim", [16, 8])  # whole heads, and a partial rotary (the reference's path)
def test_rotary_is_bit_identical_to_the_reference(dtype, rotary_dim):
    from llmp.modeling.rope import cos_sin_table

    table = cos_sin_table(rotary_dim, 64, 10000.0, None)
    qkv = torch.randn(5, (6 + 2 * 2) * 16).to(dtype)  # the fused projection's output, split as a model does
    q, k, _ = qkv.split([6 * 16, 2 * 16, 2 * 16], dim=-1)
    q, k = q.reshape(5, 6, 16), k.reshape(5, 2, 16)
    positions = torch.tensor([0, 3, 17, 40, 63])
    kernels = CpuKernels()
    for _layer in range(2):  # the second layer reuses the step's cos/sin rows
        out_q, out_k = kernels.rotary(positions, q, k, table)
        ref_q, ref_k = REF.rotary(positions, q, k, table)
        assert torch.equal(out_q, ref_q) and torch.equal(out_k, ref_k)


_FAULTS_PER_STEP = """
import resource, statistics, sys, torch
from llmp_kernels_cpu.kernels import keep_freed_memory
if sys.argv[1] == "kept":
    assert keep_freed_memory()
else:  # glibc's starting thresholds (128 KiB), held fixed: its own default raises them as it goes, by chance
    assert keep_freed_memory(128 << 10, 128 << 10)
def step():  # a step's activations: four 8 MiB tensors, written, then freed
    held = [torch.ones(1 << 21) for _ in range(4)]
    del held
faults = []
for _ in range(12):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    step()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(statistics.median(faults[2:]))
"""


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's allocator only")
def test_freed_activations_are_reused_without_page_faults():
    def faults_per_step(mode: str) -> float:
        run = subprocess.run([sys.executable, "-c", _FAULTS_PER_STEP, mode], capture_output=True, text=True, check=True)
        return float(run.stdout.split()[-1])

    # small thresholds: each 8 MiB tensor is mapped fresh and unmapped on free, so a step faults its 8192 pages in
    assert faults_per_step("untuned") > 6000
    # kept: the heap keeps the freed pages, a step reuses them (a median, so one growth of the heap does not count)
    assert faults_per_step("kept") < 500


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_matches_the_reference(dtype, with_residual):
    torch.manual_seed(0)
    x, residual = torch.randn(37, 96).to(dtype), torch.randn(37, 96).to(dtype)
    weight = (torch.rand(96) + 0.5).to(dtype)
    got = CpuKernels().rms_norm(x, weight, 1e-6, residual if with_residual else None)
    ref = REF.rms_norm(x, weight, 1e-6, residual if with_residual else None)
    got, ref = (got, ref) if with_residual else ((got,), (ref,))
    for g, r in zip(got, ref, strict=True):
        assert g.dtype == dtype and g.shape == r.shape
        if dtype == torch.float32:
            assert torch.equal(g, r)  # the reference's bits
        else:
            torch.testing.assert_close(g.float(), r.float(), atol=0, rtol=2**-7)  # a bfloat16 rounding apart
