"""GGML's block formats in torch (``llmp.quantization``) against the ``gguf`` package's own numpy implementation."""

from __future__ import annotations

import time
import zlib

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants

from llmp.quantization import GGML_FORMATS, BlockFormat, dequantize, format_of, matmul_reference, quantize

LEGACY = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")
K_QUANTS = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
FLOATS = ("F32", "F16", "BF16")
# byte offsets of each block's float16 scales (d, and m or dmin): random bytes there could be inf or NaN
SCALE_OFFSETS = {
    "Q4_0": (0,),
    "Q4_1": (0, 2),
    "Q5_0": (0,),
    "Q5_1": (0, 2),
    "Q8_0": (0,),
    "Q2_K": (80, 82),
    "Q3_K": (108,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
}
# rows x blocks per row: one block, one row of many blocks, several rows, leading dimensions beyond one
SHAPES = [(1, 1), (1, 64), (7, 3), (2, 3, 5)]
# worst row's relative RMS error of quantize -> dequantize on rows of normal weights (1e-3..1e2, half of them
# off-centre), measured: F16 0.022 %, BF16 0.18 %, Q8_0 0.57 %, Q6_K 1.98 %, Q5_1 4.06 %, Q5_K 4.06 %,
# Q5_0 4.53 %, Q4_K 8.34 %, Q4_1 8.39 %, Q4_0 9.15 %, Q3_K 16.6 %, Q2_K 34.3 %
ERROR_BOUNDS = {
    "F32": 0.0,
    "F16": 0.0003,
    "BF16": 0.0025,
    "Q8_0": 0.007,
    "Q6_K": 0.025,
    "Q5_0": 0.055,
    "Q5_1": 0.05,
    "Q5_K": 0.05,
    "Q4_0": 0.11,
    "Q4_1": 0.10,
    "Q4_K": 0.10,
    "Q3_K": 0.20,
    "Q2_K": 0.40,
}


def gguf_type(name: str) -> GGMLQuantizationType:
    return GGMLQuantizationType[name]


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def finite_f16_bits(rng: np.random.Generator, n: int) -> np.ndarray:
    """Finite float16 bit patterns of either sign, a third of them subnormal (exponent field 0)."""
    bits = rng.integers(0, 0x7C00, size=n, dtype=np.uint16)
    bits[::3] = rng.integers(1, 0x0400, size=len(bits[::3]), dtype=np.uint16)
    return bits | (rng.integers(0, 2, size=n, dtype=np.uint16) << 15)


def random_blocks(rng: np.random.Generator, fmt: BlockFormat, shape: tuple[int, ...]) -> np.ndarray:
    """Random bytes ``[*shape[:-1], shape[-1] * type_size]`` whose float16 scales are finite."""
    *rows, n_blocks = shape
    blocks = rng.integers(0, 256, size=(*rows, n_blocks, fmt.type_size), dtype=np.uint8)
    for offset in SCALE_OFFSETS[fmt.name]:
        scales = finite_f16_bits(rng, blocks[..., 0].size).reshape(blocks.shape[:-1])
        blocks[..., offset : offset + 2] = scales[..., None].view(np.uint8)
    return blocks.reshape(*rows, n_blocks * fmt.type_size)


def weights(rows: int = 64, cols: int = 1024, seed: int = 0) -> torch.Tensor:
    """Normal rows of magnitudes 1e-3..1e2; the second half shifted off zero (a minimum that matters)."""
    generator = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=generator) * torch.logspace(-3, 2, rows).unsqueeze(1)
    w[rows // 2 :] += 0.5 * w[rows // 2 :].abs().mean(dim=1, keepdim=True)
    return w


# -- the table ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(GGML_FORMATS))
def test_the_table_is_gguf_s(name: str):
    fmt = GGML_FORMATS[name]
    assert fmt.name == name
    assert fmt.ggml_type == int(gguf_type(name))
    assert (fmt.block_size, fmt.type_size) == GGML_QUANT_SIZES[gguf_type(name)]
    assert format_of(int(gguf_type(name))) is fmt
    assert format_of(gguf_type(name)) is fmt  # the enum member itself is an int


def test_the_table_has_the_formats_llmp_reads():
    assert set(GGML_FORMATS) == {*FLOATS, *LEGACY, *K_QUANTS}


@pytest.mark.parametrize("qtype", [t for t in GGMLQuantizationType if t.name not in GGML_FORMATS], ids=str)
def test_an_unsupported_type_is_named(qtype: GGMLQuantizationType):
    supported = ", ".join(GGML_FORMATS)
    message = f"GGUF tensor type {qtype.name} is not supported; supported: {supported}"
    with pytest.raises(ValueError) as raised:
        format_of(int(qtype))
    assert str(raised.value) == message


def test_an_unknown_type_id_and_name_are_refused():
    with pytest.raises(ValueError, match="^GGUF tensor type 999 is not supported; supported: F32, F16, BF16, Q4_0"):
        format_of(999)
    with pytest.raises(ValueError, match="^GGUF tensor type IQ2_XS is not supported"):
        dequantize(torch.zeros(1, 74, dtype=torch.uint8), "IQ2_XS")
    with pytest.raises(ValueError, match="^GGUF tensor type MXFP4 is not supported"):
        quantize(torch.zeros(1, 32), "MXFP4")


# -- dequantize: gguf's numbers, bit for bit ----------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name", [*LEGACY, *K_QUANTS])
def test_dequantize_is_gguf_bit_for_bit(name: str, shape: tuple[int, ...]):
    fmt = GGML_FORMATS[name]
    rng = np.random.default_rng(zlib.crc32(f"{name} {shape}".encode()))
    raw = random_blocks(rng, fmt, shape)
    expected = quants.dequantize(raw, gguf_type(name))
    got = dequantize(torch.from_numpy(raw), name)
    assert got.dtype == torch.float32
    assert tuple(got.shape) == (*shape[:-1], shape[-1] * fmt.block_size)
    assert same_bits(got.numpy(), expected)


@pytest.mark.parametrize("name", [*LEGACY, *K_QUANTS])
def test_dequantize_is_exact_with_subnormal_and_negative_scales_only(name: str):
    fmt = GGML_FORMATS[name]
    rng = np.random.default_rng(7)
    raw = random_blocks(rng, fmt, (4, 16)).reshape(4, 16, fmt.type_size)
    for offset in SCALE_OFFSETS[name]:
        subnormal = rng.integers(1, 0x0400, size=(4, 16), dtype=np.uint16) | np.uint16(0x8000)
        raw[..., offset : offset + 2] = subnormal[..., None].view(np.uint8)
    raw = raw.reshape(4, -1)
    got = dequantize(torch.from_numpy(raw), name).numpy()
    assert same_bits(got, quants.dequantize(raw, gguf_type(name)))
    assert np.any(got != 0)  # the scales took effect: not all underflowed


def test_the_float_formats_are_gguf_bit_for_bit():
    every_16_bits = np.arange(2**16, dtype=np.uint16).view(np.uint8)
    # BF16 widens by a shift: every pattern, NaNs included, keeps its bits
    bf16 = dequantize(torch.from_numpy(every_16_bits.copy()), "BF16").numpy()
    assert same_bits(bf16, quants.dequantize(every_16_bits, GGMLQuantizationType.BF16))
    # F16: every non-NaN pattern (subnormals, infinities) exact; a signalling NaN may come back quiet
    f16 = dequantize(torch.from_numpy(every_16_bits.copy()), "F16").numpy()
    expected = quants.dequantize(every_16_bits, GGMLQuantizationType.F16)
    numbers = ~np.isnan(expected)
    assert numbers.sum() == 2**16 - 2046
    assert same_bits(f16[numbers], expected[numbers]) and np.isnan(f16[~numbers]).all()
    f32 = np.random.default_rng(3).integers(0, 256, size=(3, 4 * 50), dtype=np.uint8)
    assert same_bits(dequantize(torch.from_numpy(f32), "F32").numpy(), f32.view(np.float32))


def test_dequantize_reads_a_strided_slice():
    fmt = GGML_FORMATS["Q4_K"]
    raw = torch.from_numpy(random_blocks(np.random.default_rng(5), fmt, (5, 4)))
    part = raw[:, : 2 * fmt.type_size]  # not contiguous
    assert torch.equal(dequantize(part, fmt), dequantize(part.contiguous(), fmt))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_the_dtype_argument_casts_the_float32_result(dtype: torch.dtype):
    for name in ("Q8_0", "Q4_K", "F16"):
        raw = quantize(weights(4, 256), name)
        got = dequantize(raw, name, dtype=dtype)
        assert got.dtype == dtype
        assert torch.equal(got, dequantize(raw, name).to(dtype))


@pytest.mark.parametrize("name", ["Q8_0", "Q6_K", "F32"])
def test_a_misaligned_byte_count_is_refused(name: str):
    fmt = GGML_FORMATS[name]
    with pytest.raises(ValueError, match=f"{fmt.type_size + 1} bytes per row is not a whole number of {name} blocks"):
        dequantize(torch.zeros(2, fmt.type_size + 1, dtype=torch.uint8), name)
    with pytest.raises(ValueError, match="uint8"):
        dequantize(torch.zeros(2, fmt.type_size, dtype=torch.int8), name)
    if fmt.block_size > 1:
        with pytest.raises(ValueError, match=f"{fmt.block_size + 1} columns is not a whole number of {name} blocks"):
            quantize(torch.zeros(2, fmt.block_size + 1), name)


# -- quantize --------------------------------------------------------------------------------


def legacy_weights() -> torch.Tensor:
    """Rows of several magnitudes (float16 scales subnormal to large), with blocks that test the edges:
    all zero, constant, values on quarter steps, an extreme of either sign, and rounding ties."""
    w = weights(48, 512, seed=1) * torch.tensor([1e-6, 1.0, 100.0]).repeat(16).unsqueeze(1)
    w[:, 0:32] = 0.0
    w[:, 32:64] = 1.5
    w[:, 64:96] = torch.randint(-16, 17, (48, 32), generator=torch.Generator().manual_seed(2)) * 0.25
    w[:, 96:128] = torch.linspace(-1.0, 0.5, 32)
    w[:, 128:160] = torch.linspace(-0.5, 1.0, 32)
    w[:, 160:192] = torch.arange(-15.5, 16.5)  # Q8_0's scale is 1 (absmax 127/127): every value a tie, away from 0
    w[:, 160] = 127.0
    # +0.0 only: numpy's min/max may pick either of -0.0 and +0.0 (it depends on its SIMD path), and that sign
    # is the one byte that could differ, in a block of zeros whose values come back 0 either way
    return w + 0.0


@pytest.mark.parametrize("name", LEGACY)
def test_quantize_is_gguf_byte_for_byte(name: str):
    w = legacy_weights()
    got = quantize(w, name)
    assert got.dtype == torch.uint8 and tuple(got.shape) == (48, 512 // 32 * GGML_FORMATS[name].type_size)
    assert np.array_equal(got.numpy(), quants.quantize(w.numpy(), gguf_type(name)))


@pytest.mark.parametrize("name", list(GGML_FORMATS))
def test_quantize_then_dequantize_is_close(name: str):
    w = weights()
    back = dequantize(quantize(w, name), name)
    row_error = (back - w).pow(2).mean(dim=1).sqrt() / w.pow(2).mean(dim=1).sqrt()
    assert row_error.max().item() <= ERROR_BOUNDS[name], f"{name}: {row_error.max().item():.4%}"


@pytest.mark.parametrize("name", list(GGML_FORMATS))
def test_zero_rows_come_back_zero(name: str):
    assert torch.equal(dequantize(quantize(torch.zeros(2, 512), name), name), torch.zeros(2, 512))


@pytest.mark.parametrize("name", K_QUANTS)
def test_gguf_reads_the_k_quants_written(name: str):
    raw = quantize(weights(8, 512), name)
    assert same_bits(dequantize(raw, name).numpy(), quants.dequantize(raw.numpy(), gguf_type(name)))


def test_quantize_is_fast_enough_for_test_files():
    w = weights(576, 1536)
    for name in GGML_FORMATS:
        start = time.perf_counter()
        quantize(w, name)
        assert time.perf_counter() - start < 1.0, name  # about 10-30 ms each on one core


# -- the matmul reference ----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["Q4_0", "Q4_K", "Q6_K"])
def test_matmul_reference_is_x_times_the_dequantised_weight(name: str):
    w = weights(24, 512)
    raw = quantize(w, name)
    x = torch.randn(3, 512, generator=torch.Generator().manual_seed(4))
    out = matmul_reference(x, raw, name)
    assert out.dtype == torch.float32 and torch.equal(out, x @ dequantize(raw, name).T)
    assert torch.equal(matmul_reference(x, raw.reshape(-1), name, out_features=24), out)
    x16 = x.to(torch.bfloat16)
    out16 = matmul_reference(x16, raw, name)
    assert out16.dtype == torch.bfloat16 and torch.equal(out16, x16 @ dequantize(raw, name, torch.bfloat16).T)
    with pytest.raises(ValueError, match="not 25 rows"):
        matmul_reference(x, raw, name, out_features=25)
