"""quant_matmul against llmp.quantization's reference: values, row invariance, threads, every ISA path."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from llmp_kernels_cpu_native.kernels import NativeKernels

from llmp.quantization import GGML_FORMATS, QuantizedWeight, dequantize, matmul_reference, quantize

FORMATS = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]
ROWS = (1, 2, 7, 8, 32, 100)  # 7 and 8: four inputs a row unpacked for (AVX-512), then two, then one


def shapes(fmt: str) -> list[tuple[int, int]]:
    """(out_features, in_features) as models have them: odd row counts, inputs of whole blocks; rows in a part
    tile and inputs longer than a slice (1024) but not a multiple of it."""
    if GGML_FORMATS[fmt].block_size == 32:
        return [(3, 32), (17, 96), (17, 1120), (576, 1536)]
    return [(3, 256), (17, 512), (17, 1280), (576, 2048)]


def weight(fmt: str, out_features: int, in_features: int, seed: int = 0) -> QuantizedWeight:
    generator = torch.Generator().manual_seed(seed)
    dense = torch.randn(out_features, in_features, generator=generator)
    return QuantizedWeight(quantize(dense, fmt), GGML_FORMATS[fmt], in_features)


def inputs(rows: int, in_features: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(rows, in_features, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def kernels() -> NativeKernels:
    return NativeKernels()


def test_every_format_is_computed(kernels):
    for fmt in FORMATS:
        assert kernels.pack_quantized(weight(fmt, 3, GGML_FORMATS[fmt].block_size)) is not None, fmt


@pytest.mark.parametrize("fmt", ["F32", "F16", "BF16"])
def test_dense_formats_are_left_to_the_layer(kernels, fmt):
    assert kernels.pack_quantized(weight(fmt, 3, 32)) is None


def test_a_weight_off_the_cpu_is_left_to_the_layer(kernels):
    blocks = torch.empty(3, 18, dtype=torch.uint8, device="meta")
    assert kernels.pack_quantized(QuantizedWeight(blocks, GGML_FORMATS["Q4_0"], 32)) is None


@pytest.mark.parametrize("fmt", FORMATS)
def test_float32_matches_the_reference(kernels, fmt):
    for out_features, in_features in shapes(fmt):
        w = weight(fmt, out_features, in_features)
        matmul = kernels.pack_quantized(w)
        for rows in ROWS:
            x = inputs(rows, in_features)
            expected = matmul_reference(x, w.blocks, w.format)
            got = matmul(x)
            assert got.dtype == torch.float32 and got.shape == (rows, out_features)
            # float32 sums in another order: within a few roundings of the output's scale
            torch.testing.assert_close(got, expected, rtol=0, atol=1e-5 * expected.abs().max().item())


@pytest.mark.parametrize("fmt", FORMATS)
def test_bfloat16_is_the_float32_result_rounded_once(kernels, fmt):
    out_features, in_features = shapes(fmt)[1]
    w = weight(fmt, out_features, in_features)
    x = inputs(32, in_features).bfloat16()
    got = kernels.pack_quantized(w)(x)
    expected = matmul_reference(x.float(), w.blocks, w.format)
    assert got.dtype == torch.bfloat16
    # one bfloat16 rounding (8 bits) of a float32 sum that may differ from the reference's in its last bits
    torch.testing.assert_close(got.float(), expected, rtol=2**-8, atol=1e-5 * expected.abs().max().item())


@pytest.mark.parametrize("fmt", FORMATS)
def test_dequantised_weights_are_the_reference_bit_for_bit(kernels, fmt):
    # x the identity: each output is one weight times 1 plus zeros, so the kernel's dequantised W.T exactly
    w = weight(fmt, 17, GGML_FORMATS[fmt].block_size * (1 if fmt.endswith("_K") else 8), seed=3)
    got = kernels.pack_quantized(w)(torch.eye(w.in_features))
    assert torch.equal(got, dequantize(w.blocks, w.format).T)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_row_does_not_depend_on_the_batch(kernels, fmt):
    out_features, in_features = 37, 512
    w = weight(fmt, out_features, in_features)
    matmul = kernels.pack_quantized(w)
    x = inputs(100, in_features)
    batch = matmul(x)
    for row in (0, 1, 41, 99):
        assert torch.equal(matmul(x[row : row + 1]), batch[row : row + 1]), row
        assert torch.equal(matmul(x[row : row + 7])[0], batch[row]), row
    assert torch.equal(matmul(x.bfloat16())[41], matmul(x[41:42].bfloat16())[0])


@pytest.mark.parametrize("fmt", ["Q4_1", "Q5_0", "Q4_K", "Q6_K"])
def test_inputs_taken_in_chunks_give_the_rows_of_one_pass(kernels, fmt):
    """Past 1 MiB of inputs (256 rows of 1024) the inputs are taken in chunks, each tile of rows dequantised
    again for each: the rows are still each input's alone, bit for bit, and the reference's values."""
    in_features = 1024
    w = weight(fmt, 45, in_features)
    matmul = kernels.pack_quantized(w)
    x = inputs(600, in_features)
    batch = matmul(x)
    for row in (0, 255, 256, 257, 511, 512, 599):  # chunk edges
        assert torch.equal(matmul(x[row : row + 1]), batch[row : row + 1]), row
        assert torch.equal(matmul(x[row : row + 9])[0], batch[row]), row
    expected = matmul_reference(x, w.blocks, w.format)
    torch.testing.assert_close(batch, expected, rtol=0, atol=1e-5 * expected.abs().max().item())


# T = 1 unpacks the weights in registers, larger T dequantises tiles to a buffer: the same bits either way
BATCH_SIZES = (1, 2, 3, 4, 5, 8, 33)


@pytest.mark.parametrize("fmt", FORMATS)
def test_small_batches_are_rows_of_a_large_one_bit_for_bit(kernels, fmt):
    block = GGML_FORMATS[fmt].block_size
    for out_features, in_features in ((37, 3 * block if block == 32 else block), (37, 512), (130, 1536)):
        w = weight(fmt, out_features, in_features)
        matmul = kernels.pack_quantized(w)
        x = inputs(64, in_features)
        batch = matmul(x)
        for rows in BATCH_SIZES:
            for start in (0, 64 - rows):
                assert torch.equal(matmul(x[start : start + rows]), batch[start : start + rows]), (fmt, rows, start)


@pytest.mark.parametrize("fmt", ["Q4_1", "Q8_0", "Q4_K", "Q6_K"])
def test_the_result_does_not_depend_on_the_thread_count(kernels, fmt, set_threads):
    # rows split over threads in whole groups of 16, small calls on one thread: shapes on both sides of that
    k = 1024 if fmt.endswith("_K") else 576
    for out_features in (37, 192, 576, 1537):
        matmul = kernels.pack_quantized(weight(fmt, out_features, k))
        for rows in (1, 2, 8, 33):
            x = inputs(rows, k)
            set_threads(1)
            alone = matmul(x)
            for count in (2, 3):
                set_threads(count)
                assert torch.equal(matmul(x), alone), (out_features, rows, count)


ONE_OPENMP = textwrap.dedent(
    """
    import torch
    from llmp.quantization import GGML_FORMATS, QuantizedWeight, quantize
    from llmp_kernels_cpu_native.kernels import NativeKernels
    from llmp_kernels_cpu_native.library import threads

    kernels = NativeKernels()
    torch.set_num_threads(2)
    w = QuantizedWeight(quantize(torch.randn(1536, 576), "Q4_1"), GGML_FORMATS["Q4_1"], 576)
    kernels.pack_quantized(w)(torch.randn(4, 576))
    with open("/proc/self/maps") as maps:
        print(threads(), sorted({line.split()[-1] for line in maps if "libgomp" in line}))
    """
)


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="reads /proc/self/maps")
def test_the_threads_are_torchs_openmp_runtime():
    # built with -fopenmp, the library needs libgomp.so.1: the copy torch loaded, never a second runtime
    result = subprocess.run([sys.executable, "-c", ONE_OPENMP], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    kind, mapped = result.stdout.strip().split(" ", 1)
    if kind != "openmp":
        pytest.skip(f"the library runs each call on the {kind}")
    torch_lib = os.path.dirname(torch.__file__)
    assert mapped.count("libgomp") <= 1 and (mapped == "[]" or torch_lib in mapped), mapped


def test_leading_dimensions_are_kept(kernels):
    w = weight("Q8_0", 5, 64)
    x = inputs(6, 64).reshape(2, 3, 64)
    got = kernels.pack_quantized(w)(x)
    assert got.shape == (2, 3, 5)
    assert torch.equal(got.reshape(6, 5), kernels.pack_quantized(w)(x.reshape(6, 64)))


# -- each instruction set path, forced in a fresh process -------------------------------------------------

ISAS = ("scalar", "avx2", "avx512")  # as conftest.ISAS

CHECK_PATH = textwrap.dedent(
    """
    import sys
    import torch
    from llmp.quantization import GGML_FORMATS, QuantizedWeight, dequantize, matmul_reference, quantize
    from llmp_kernels_cpu_native.kernels import NativeKernels

    kernels = NativeKernels()
    assert kernels.isa == sys.argv[1], kernels.isa
    torch.manual_seed(0)
    for fmt in GGML_FORMATS.values():
        if fmt.block_size == 1:
            continue
        k = 512
        w = QuantizedWeight(quantize(torch.randn(19, k), fmt), fmt, k)
        matmul = kernels.pack_quantized(w)
        x = torch.randn(33, k)
        got, expected = matmul(x), matmul_reference(x, w.blocks, fmt)
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-5 * expected.abs().max().item())
        assert torch.equal(matmul(x[5:6]), got[5:6]), fmt.name
        batch = matmul(torch.cat([x, x[:31]]))  # 64 rows
        for rows in (1, 2, 3, 4, 5, 8, 33):
            for start in (0, 64 - rows):
                rows_alone = matmul(torch.cat([x, x[:31]])[start : start + rows])
                assert torch.equal(rows_alone, batch[start : start + rows]), (fmt.name, rows, start)
        assert torch.equal(matmul(torch.eye(k)), dequantize(w.blocks, fmt).T), fmt.name
    print("ok")
    """
)


@pytest.mark.parametrize("isa", ISAS)
def test_each_instruction_set_path(isa, run_on_isa):
    run_on_isa(isa, CHECK_PATH)
