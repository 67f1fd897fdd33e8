"""The row-wise ops (RMSNorm with and without the residual, rotary in place, SiLU/GELU-and-mul) against the torch
reference set in float32, bfloat16 and float16: values within the dtype's rounding (float32: a few ulps), a row's
bits alone and in any batch, thread counts, float32 rotary bit for bit, each ISA path, and clear errors."""

from __future__ import annotations

import textwrap

import pytest
import torch
from llmp_kernels_cpu_native.kernels import NativeKernels
from llmp_kernels_torch.kernels import TorchKernels

from llmp.modeling.rope import cos_sin_table

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
WIDTHS = [896, 64, 37, 1, 4864]  # whole vectors, a tail, one value


@pytest.fixture(scope="module")
def kernels() -> NativeKernels:
    return NativeKernels()


def rand(*shape, dtype, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def close(got, expected, dtype):
    """Within two roundings of the dtype (the reference rounds in between where the kernel does not); float32
    within 8 ulps (another order of the RMS sum, another exponential)."""
    ulp = {torch.bfloat16: 2**-7, torch.float16: 2**-10, torch.float32: 4 * 2**-23}[dtype]
    assert got.dtype == dtype and got.shape == expected.shape
    torch.testing.assert_close(got.float(), expected.float(), rtol=2 * ulp, atol=2 * ulp)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", WIDTHS)
def test_rms_norm(kernels, dtype, width):
    x, w = rand(7, width, dtype=dtype), rand(width, dtype=dtype, seed=1)
    close(kernels.rms_norm(x, w, 1e-6), TorchKernels().rms_norm(x.float(), w.float(), 1e-6), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", WIDTHS)
def test_rms_norm_with_the_residual(kernels, dtype, width):
    x, res, w = rand(7, width, dtype=dtype), rand(7, width, dtype=dtype, seed=2), rand(width, dtype=dtype, seed=1)
    out, total = kernels.rms_norm(x, w, 1e-5, res)
    assert torch.equal(total, x + res)  # the residual stream is the dtype's sum, as the reference's
    close(out, TorchKernels().rms_norm(total.float(), w.float(), 1e-5), dtype)


def test_rms_norm_of_per_head_rows(kernels):
    x, w = rand(5, 3, 128, dtype=torch.bfloat16), rand(128, dtype=torch.bfloat16, seed=1)  # Qwen3's q/k norms
    out = kernels.rms_norm(x, w, 1e-6)
    assert out.shape == x.shape
    close(out, TorchKernels().rms_norm(x.float(), w.float(), 1e-6), torch.bfloat16)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["silu_and_mul", "gelu_tanh_and_mul"])
@pytest.mark.parametrize("half", [4864, 37, 1])
def test_act_and_mul(kernels, dtype, op, half):
    x = rand(6, 2 * half, dtype=dtype) * 4  # reaches both tails of the activation
    if dtype == torch.float32 and op == "gelu_tanh_and_mul":  # float32 GELU is the reference's own
        assert torch.equal(kernels.gelu_tanh_and_mul(x), TorchKernels().gelu_tanh_and_mul(x))
        return
    close(getattr(kernels, op)(x), getattr(TorchKernels(), op)(x.float()), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [64, 128, 80, 24])
def test_rotary_in_place_on_views_of_a_fused_projection(kernels, dtype, head_dim):
    heads, kv_heads, tokens = 6, 2, 9
    qkv = rand(tokens, (heads + 2 * kv_heads) * head_dim, dtype=dtype)
    q = qkv[:, : heads * head_dim].view(tokens, heads, head_dim)
    k = qkv[:, heads * head_dim : (heads + kv_heads) * head_dim].view(tokens, kv_heads, head_dim)
    v_before = qkv[:, (heads + kv_heads) * head_dim :].clone()
    positions = torch.tensor([0, 1, 2, 3, 100, 5, 4095, 7, 8])
    table = cos_sin_table(head_dim, 4096, 10000.0)
    q_ref, k_ref = TorchKernels().rotary(positions, q.float(), k.float(), table)
    q_out, k_out = kernels.rotary(positions, q, k, table)
    assert q_out.data_ptr() == q.data_ptr() and k_out.data_ptr() == k.data_ptr()  # in place
    close(q_out, q_ref, dtype)
    close(k_out, k_ref, dtype)
    assert torch.equal(qkv[:, (heads + kv_heads) * head_dim :], v_before)  # v untouched


def test_float32_rotary_has_the_reference_bits(kernels):
    q, k = rand(33, 5, 128, dtype=torch.float32), rand(33, 1, 128, dtype=torch.float32, seed=1)
    positions, table = torch.arange(33) * 31, cos_sin_table(128, 2048, 1e6)
    expected = TorchKernels().rotary(positions, q, k, table)
    got = kernels.rotary(positions, q.clone(), k.clone(), table)
    assert all(torch.equal(a, b) for a, b in zip(got, expected))


def test_float32_norms_and_activations_are_compiled(kernels, monkeypatch):
    """float32 rows take the compiled ops (one dispatch, not the reference's chain), not the cpu set's."""
    calls = []
    monkeypatch.setattr(torch.ops.llmp_native, "add_rms_norm", lambda *a: calls.append("add_rms_norm") or (a[0], a[1]))
    monkeypatch.setattr(torch.ops.llmp_native, "silu_and_mul", lambda x: calls.append("silu_and_mul") or x)
    x = rand(2, 32, dtype=torch.float32)
    kernels.rms_norm(x, x[0], 1e-6, residual=x)
    kernels.silu_and_mul(x)
    assert calls == ["add_rms_norm", "silu_and_mul"]


def test_partial_rotary_stays_on_the_reference(kernels):
    q, k = rand(3, 2, 64, dtype=torch.bfloat16), rand(3, 1, 64, dtype=torch.bfloat16)
    positions, partial = torch.arange(3), cos_sin_table(32, 16, 10000.0)  # rotary_dim 32 of 64
    got = kernels.rotary(positions, q.clone(), k.clone(), partial)
    expected = TorchKernels().rotary(positions, q, k, partial)
    assert all(torch.equal(a, b) for a, b in zip(got, expected))


def test_a_row_has_the_same_bits_alone_and_in_any_batch(kernels, set_threads):
    x, res, w = (
        rand(300, 896, dtype=torch.bfloat16),
        rand(300, 896, dtype=torch.bfloat16, seed=2),
        rand(896, dtype=torch.bfloat16),
    )
    gate_up = rand(300, 2 * 4864, dtype=torch.bfloat16, seed=3)
    full_norm, full_sum = kernels.rms_norm(x, w, 1e-6, res)
    full_act = kernels.silu_and_mul(gate_up)
    for threads in (1, 2, 3):
        set_threads(threads)
        for start, rows in ((0, 1), (17, 5), (0, 300)):
            part = slice(start, start + rows)
            norm, total = kernels.rms_norm(x[part], w, 1e-6, res[part])
            assert torch.equal(norm, full_norm[part]) and torch.equal(total, full_sum[part])
            assert torch.equal(kernels.silu_and_mul(gate_up[part]), full_act[part])


def test_bad_input_is_a_clear_error():
    ops = torch.ops.llmp_native
    with pytest.raises(RuntimeError, match="do not match"):
        ops.rms_norm(torch.randn(2, 8).bfloat16(), torch.randn(7).bfloat16(), 1e-6)
    with pytest.raises(RuntimeError, match="bfloat16 or float16"):
        ops.silu_and_mul(torch.randn(2, 8).double())
    q, k = torch.randn(2, 2, 8).bfloat16(), torch.randn(2, 1, 8).bfloat16()
    with pytest.raises(RuntimeError, match="outside the table"):
        ops.rotary_(torch.tensor([0, 16]), q, k, cos_sin_table(8, 16, 10000.0))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", [151936, 1000, 37, 16, 1])
def test_argmax_is_torch_s_first_largest(kernels, dtype, vocab):
    logits = rand(9, vocab, dtype=dtype)
    if vocab >= 37:
        logits[1, 5] = logits[1, vocab - 1] = 100.0  # a tie: the first
        logits[2, vocab - 2] = 100.0  # in a tail lane
        logits[3] = float("-inf")  # all -inf: index 0
        logits[4, 7] = logits[4, 30] = float("nan")  # a NaN is the largest: the first NaN
        logits[5, :] = 3.0  # all equal
        logits[6, vocab // 2] = float("inf")
    got = kernels.argmax(logits)
    assert got.dtype == torch.int64 and torch.equal(got, logits.argmax(-1)), (got, logits.argmax(-1))
    assert torch.equal(kernels.argmax(logits[4:5]), logits[4:5].argmax(-1))  # one row alone


@pytest.mark.parametrize("isa", ["scalar", "avx2", "avx512"])
def test_each_instruction_set_path(isa, run_on_isa):
    run_on_isa(
        isa,
        textwrap.dedent(
            """
            import torch
            from llmp_kernels_cpu_native.kernels import NativeKernels
            from llmp_kernels_torch.kernels import TorchKernels
            from llmp.modeling.rope import cos_sin_table
            native, ref = NativeKernels(), TorchKernels()
            tol = dict(rtol=2**-6, atol=2**-6)
            g = torch.Generator().manual_seed(0)
            x, res = (torch.randn(5, 200, generator=g).bfloat16() for _ in range(2))
            w = torch.randn(200, generator=g).bfloat16()
            out, total = native.rms_norm(x, w, 1e-6, res)
            torch.testing.assert_close(out.float(), ref.rms_norm(total.float(), w.float(), 1e-6), **tol)
            gu = torch.randn(5, 2 * 75, generator=g).bfloat16() * 4
            torch.testing.assert_close(native.silu_and_mul(gu).float(), ref.silu_and_mul(gu.float()), **tol)
            q, k = torch.randn(5, 3, 64, generator=g).bfloat16(), torch.randn(5, 1, 64, generator=g).bfloat16()
            table, pos = cos_sin_table(64, 64, 10000.0), torch.arange(5) * 7
            rq, rk = ref.rotary(pos, q.float(), k.float(), table)
            nq, nk = native.rotary(pos, q, k, table)
            torch.testing.assert_close(nq.float(), rq, **tol)
            logits = torch.randn(5, 1000, generator=g).bfloat16()
            logits[1, 3] = logits[1, 999] = 50.0
            assert torch.equal(native.argmax(logits), logits.argmax(-1))
            print("ok")
            """
        ),
    )


# the kernels each copy writes in intrinsics, with the portable code's operations in its order
INTRINSICS = {
    "avx512": "[(torch.bfloat16, 'rms')]",
    "avx2": "[(dt, op) for dt in (torch.bfloat16, torch.float32) for op in ('rms', 'silu', 'gelu')]",
}
ROW_CASES = """
import sys, torch
from llmp_kernels_cpu_native.kernels import NativeKernels
native, out = NativeKernels(), []
for dtype, op in {ops}:
    for rows, width in [(3, 896), (5, 37), (2, 4864), (4, 1)]:
        g = torch.Generator().manual_seed(rows * width)
        x, res = torch.randn(rows, 2 * width, generator=g) * 3, torch.randn(rows, width, generator=g) * 40
        w = torch.randn(width, generator=g)
        x[0, width - 1], res[-1, 0], x[-1, 0] = float("nan"), float("inf"), -200.0
        x, res, w = x.to(dtype), res.to(dtype), w.to(dtype)
        if op == "rms":
            out += [native.rms_norm(x[:, :width], w, 1e-6), *native.rms_norm(x[:, width:], w, 1e-5, res)]
        elif op == "silu":
            out.append(native.silu_and_mul(x))
        elif dtype != torch.float32:  # float32 GELU is the reference's
            out.append(native.gelu_tanh_and_mul(x))
if sys.argv[1] != "scalar":
    torch.save(out, sys.argv[2])
else:
    for a, b in zip(out, torch.load(sys.argv[2]), strict=True):
        assert a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8)), (a.shape, a, b)
print("ok")
"""


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
def test_the_intrinsics_have_the_portable_copys_bits(run_on_isa, tmp_path, isa):
    """The AVX-512 copy's bfloat16 RMSNorm and the AVX2 copy's RMSNorm and activations are written in intrinsics
    (GCC's generic vectors went through the stack), the scalar copy in generic vectors: the same operations in the
    same order, so the same bits (tails, a NaN and an infinity, an underflowing exponential, the residual's
    rounding)."""
    code = ROW_CASES.replace("{ops}", INTRINSICS[isa])
    run_on_isa(isa, code, str(tmp_path / "out.pt"))
    run_on_isa("scalar", code, str(tmp_path / "out.pt"))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_write_kv_matches_the_reference(kernels, dtype):
    blocks, block_size, kv_heads, head_dim, tokens = 6, 4, 2, 24, 5
    kv = rand(tokens, 3 * kv_heads * head_dim, dtype=dtype)  # k and v as views of a fused projection
    k = kv[:, : kv_heads * head_dim].view(tokens, kv_heads, head_dim)
    v = kv[:, kv_heads * head_dim : 2 * kv_heads * head_dim].view(tokens, kv_heads, head_dim)
    slots = torch.tensor([3, -1, 23, 0, 10])
    caches = [torch.zeros(blocks, block_size, kv_heads, head_dim, dtype=dtype) for _ in range(4)]
    kernels.write_kv(k, v, caches[0], caches[1], slots)
    TorchKernels().write_kv(k, v, caches[2], caches[3], slots)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3]) and caches[0].any()
    with pytest.raises(RuntimeError, match="outside the cache"):
        kernels.write_kv(k, v, caches[0], caches[1], torch.tensor([3, -1, 24, 0, 10]))


@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float16])
def test_write_kv_of_float32_into_a_16_bit_cache_rounds_as_torch(kernels, cache_dtype):
    # --kv-cache-dtype of a float32 model: each value rounded to nearest even, as .to() rounds it
    tokens, kv_heads, head_dim = 6, 3, 64
    # k and v views of a fused projection
    kv = rand(tokens, 3 * kv_heads * head_dim, dtype=torch.float32) * 1e4
    # inf, NaN, float16's largest value, ties rounding to it and past it (to inf), beyond it, subnormals
    kv[0, :9] = torch.tensor([float("inf"), float("nan"), 65504.0, 65519.0, 65520.0, 7e4, 3e-6, 1e-8, -2e-7])
    k = kv[:, : kv_heads * head_dim].view(tokens, kv_heads, head_dim)
    v = kv[:, kv_heads * head_dim : 2 * kv_heads * head_dim].view(tokens, kv_heads, head_dim)
    slots = torch.tensor([3, -1, 23, 0, 10, 17])
    caches = [torch.zeros(6, 4, kv_heads, head_dim, dtype=cache_dtype) for _ in range(4)]
    kernels.write_kv(k, v, caches[0], caches[1], slots)
    TorchKernels().write_kv(k, v, caches[2], caches[3], slots)
    for got, expected in ((caches[0], caches[2]), (caches[1], caches[3])):  # the same values (a NaN's payload aside)
        torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True)
    assert caches[0].view(-1, kv_heads, head_dim)[3].any()


def test_write_kv_into_a_cache_of_another_dtype_converts(kernels):
    k, v = rand(3, 1, 8, dtype=torch.bfloat16), rand(3, 1, 8, dtype=torch.bfloat16, seed=1)
    k_cache, v_cache = torch.zeros(2, 4, 1, 8), torch.zeros(2, 4, 1, 8)
    kernels.write_kv(k, v, k_cache, v_cache, torch.tensor([0, 5, 7]))
    assert torch.equal(k_cache.view(-1, 1, 8)[[0, 5, 7]], k.float())
