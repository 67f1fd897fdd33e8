"""The triton set's ``pack_quantized``: x @ W.T from GGML blocks against ``llmp.quantization.matmul_reference``,
under Triton's interpreter without CUDA (conftest.py), on a GPU the compiled kernels.

Blocks are random bytes with their float16 fields (d, m, dmin) set to finite values, so every bit
pattern of the packed integers and sub-block scales is exercised, not only what a quantiser writes.

Tolerance (float32 accumulation): the kernel's sum of K products and the reference's each lie within
``K * u * sum_k |x_k w_k|`` of the exact value (u = 2^-24, float32's unit roundoff; the dequantised weights
are exact, the reference's bit for bit), so they differ by at most ``2 K u sum |x w|``. A half-precision
output is that float32 value rounded once more: plus the dtype's unit roundoff times |result|.
"""

from __future__ import annotations

import pytest
import torch
from llmp_kernels_triton import quant_matmul
from llmp_kernels_triton.kernels import TritonKernels

from llmp.api import PacksQuantized
from llmp.quantization import GGML_FORMATS, QuantizedWeight, dequantize, matmul_reference, quantize

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TRI = TritonKernels()
FORMATS = list(quant_matmul.FORMATS)
HALF_FIELDS = {  # byte offsets of the float16 fields in a block
    "Q4_0": (0,),
    "Q4_1": (0, 2),
    "Q5_0": (0,),
    "Q5_1": (0, 2),
    "Q8_0": (0,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
}
OUT = 40  # not a multiple of the column tiles (16, 64): the edge tiles are exercised
UNIT_ROUNDOFF = {torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}


def in_features(name: str) -> int:
    return 512 if GGML_FORMATS[name].block_size == 256 else 256  # two super-blocks, or eight blocks of 32


def random_weight(name: str, rows: int = OUT, seed: int = 0) -> QuantizedWeight:
    fmt, k = GGML_FORMATS[name], in_features(name)
    gen = torch.Generator().manual_seed(seed)
    n_blocks = k // fmt.block_size
    raw = torch.randint(0, 256, (rows, n_blocks, fmt.type_size), generator=gen, dtype=torch.uint8)
    for offset in HALF_FIELDS[name]:
        halves = ((torch.rand(rows, n_blocks, generator=gen) * 2 - 1) * 2.0**-6).to(torch.float16)
        raw[:, :, offset : offset + 2] = halves.view(torch.uint8).reshape(rows, n_blocks, 2)
    return QuantizedWeight(raw.reshape(rows, -1).to(DEVICE), fmt, k)


def rand_x(tokens: int, k: int, dtype: torch.dtype, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(tokens, k, generator=gen).to(DEVICE, dtype)


def assert_within_float32_accumulation(out: torch.Tensor, x: torch.Tensor, weight: QuantizedWeight) -> None:
    """``out`` against the float32 reference on the same x, within the bound of the module docstring."""
    assert out.dtype == x.dtype and out.shape == (x.shape[0], weight.out_features)
    expected = matmul_reference(x.float(), weight.blocks, weight.format)
    magnitude = x.float().abs() @ weight.dequantize().abs().T  # sum_k |x_k w_k|
    bound = 2 * weight.in_features * 2.0**-24 * magnitude
    if x.dtype != torch.float32:
        bound = bound * 1.5 + UNIT_ROUNDOFF[x.dtype] * expected.abs() + 2.0**-24  # one more rounding (and subnormals)
    error = (out.float() - expected).abs()
    worst = int((error - bound).argmax())
    assert bool((error <= bound).all()), (
        f"{weight.format.name}: error {error.flatten()[worst]:.3g} above the bound {bound.flatten()[worst]:.3g}"
    )


def test_the_set_computes_the_formats_it_knows_and_leaves_the_others():
    assert isinstance(TRI, PacksQuantized)
    for name, fmt in GGML_FORMATS.items():
        rows = torch.zeros(2, fmt.type_size * (256 // fmt.block_size), dtype=torch.uint8, device=DEVICE)
        packed = TRI.pack_quantized(QuantizedWeight(rows, fmt, 256))
        assert (packed is not None) == (name in quant_matmul.FORMATS), name  # Q2_K, Q3_K, F16 ...: None
    assert set(quant_matmul.FORMATS) >= {"Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q6_K"}


def test_blocks_off_cuda_are_left_to_the_layer_when_the_kernels_are_compiled(monkeypatch):
    monkeypatch.setattr(quant_matmul, "INTERPRET", False)  # as on a CUDA machine: CPU blocks are not computed
    assert TRI.pack_quantized(random_weight("Q4_K").to("cpu")) is None


@pytest.mark.parametrize("tokens", [1, 3, 17])  # a decode, a small decode batch (BLOCK_T 4), the prefill tile
@pytest.mark.parametrize("name", FORMATS)
def test_float32_matches_the_reference(name, tokens):
    weight = random_weight(name)
    x = rand_x(tokens, weight.in_features, torch.float32)
    assert_within_float32_accumulation(TRI.pack_quantized(weight)(x), x, weight)


@pytest.mark.parametrize(("dtype", "tokens"), [(torch.bfloat16, 3), (torch.float16, 17)])
@pytest.mark.parametrize("name", FORMATS)
def test_half_precision_inputs(name, dtype, tokens):
    weight = random_weight(name, seed=2)
    x = rand_x(tokens, weight.in_features, dtype, seed=3)
    assert_within_float32_accumulation(TRI.pack_quantized(weight)(x), x, weight)


@pytest.mark.parametrize("name", FORMATS)
def test_unpacks_every_weight_bit_for_bit(name):
    """One-hot rows pick single weights (exact: the other products are zeros), at positions covering every
    step of 16 and every lane, in both blocks: equal to ``dequantize``'s float32 to the bit."""
    weight = random_weight(name, seed=4)
    k = weight.in_features
    steps = k // 16
    positions = torch.tensor([(i % steps) * 16 + (i * 7 + i // steps) % 16 for i in range(32)])
    x = torch.zeros(32, k, device=DEVICE)
    x[torch.arange(32), positions.to(DEVICE)] = 1.0
    out = TRI.pack_quantized(weight)(x)
    assert torch.equal(out, dequantize(weight.blocks, weight.format)[:, positions.to(DEVICE)].T)


@pytest.mark.parametrize("name", ["Q4_K", "Q6_K", "Q4_0"])  # a Q4_K_M file's two formats, and a legacy one
def test_a_row_has_the_same_bits_alone_as_in_any_batch(name):
    """Rows computed alone (the decode tile), in decode batches of 3 and 8 and in prefill tiles at other
    offsets give the bits of the 17-row batch: the summation order does not follow the launch."""
    k = in_features(name)
    gen = torch.Generator().manual_seed(5)
    weight = QuantizedWeight(quantize(torch.randn(OUT, k, generator=gen), name).to(DEVICE), GGML_FORMATS[name], k)
    compute = TRI.pack_quantized(weight)
    x = rand_x(17, k, torch.bfloat16, seed=6)
    together = compute(x)
    for start, length in ((0, 1), (9, 1), (16, 1), (4, 3), (2, 8), (5, 12)):
        assert torch.equal(compute(x[start : start + length]), together[start : start + length]), (start, length)


def test_leading_dimensions_and_strided_rows():
    weight = random_weight("Q8_0")
    compute = TRI.pack_quantized(weight)
    wide = rand_x(6, weight.in_features + 32, torch.bfloat16)
    rows = wide[:, : weight.in_features]  # rows 32 apart: a split of a wider activation
    flat = compute(rows.contiguous())
    assert torch.equal(compute(rows), flat)
    assert torch.equal(compute(rows.contiguous().view(2, 3, -1)), flat.view(2, 3, -1))
    assert compute(rows[:0]).shape == (0, OUT)


def test_rejects_bad_inputs_clearly():
    compute = TRI.pack_quantized(random_weight("Q4_0"))
    with pytest.raises(ValueError, match=r"x must have shape \[\*, 256\]"):
        quant_matmul.quant_matmul(rand_x(2, 128, torch.float32), compute.blocks, "Q4_0", 256)
    with pytest.raises(ValueError, match="float32, float16 or bfloat16"):
        compute(torch.ones(2, 256, dtype=torch.int64, device=DEVICE))
