"""dense_matmul (bfloat16 linear layers on AVX-512 BF16) against float64: values, each row alone bit for bit,
thread counts, the layer calling it without 32-row blocks, and the other dtypes left to the cpu set."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from llmp_kernels_cpu.kernels import PackedLinear, UpcastLinear
from llmp_kernels_cpu_native.kernels import DenseLinear, NativeKernels
from llmp_kernels_cpu_native.library import dense_supported

pytestmark = pytest.mark.skipif(not dense_supported(), reason="no AVX-512 BF16: the library cannot run it here")

SHAPES = [(1152, 896), (37, 70), (896, 4864), (5, 32), (100, 31)]  # K tails of 6, 0 and 31; N not a multiple of 6


class DenseKernels(NativeKernels):
    """The set as it is where AMX is absent (on an AMX CPU bfloat16 layers stay on oneDNN: tested below)."""

    def pack_linear(self, weight, bias):
        if weight.dtype == torch.bfloat16:
            return DenseLinear(weight, bias)
        return super().pack_linear(weight, bias)


@pytest.fixture(scope="module")
def kernels() -> NativeKernels:
    return DenseKernels()


def test_bfloat16_layers_take_it_unless_the_cpu_has_amx():
    packed = NativeKernels().pack_linear(torch.randn(8, 64).bfloat16(), None)
    assert isinstance(packed, DenseLinear) == (dense_supported() and not torch.ops.llmp_native.has_amx())


def operands(n: int, k: int, rows: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(n, k, generator=generator).bfloat16()
    bias = torch.randn(n, generator=generator).bfloat16()
    x = torch.randn(rows, k, generator=generator).bfloat16()
    return weight, bias, x


@pytest.mark.parametrize("n, k", SHAPES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_matches_float64_within_one_rounding(kernels, n, k, with_bias):
    weight, bias, x = operands(n, k, 67)
    bias = bias if with_bias else None
    matmul = kernels.pack_linear(weight, bias)
    assert isinstance(matmul, DenseLinear) and matmul.row_invariant
    got = matmul(x)
    expected = F.linear(x.double(), weight.double(), None if bias is None else bias.double())
    assert got.dtype == torch.bfloat16 and got.shape == (67, n)
    # float32 accumulation of exact products, then one rounding to bfloat16 (relative 2^-8)
    bound = 2**-8 * expected.abs() + 1e-5 * (x.double().abs() @ weight.double().abs().T)
    assert ((got.double() - expected).abs() <= bound).all()


@pytest.mark.parametrize("n, k", SHAPES)
def test_a_row_has_the_same_bits_alone_and_in_any_batch(kernels, n, k):
    weight, bias, x = operands(n, k, 131)
    matmul = kernels.pack_linear(weight, bias)
    batch = matmul(x)
    for rows in (1, 2, 3, 5, 32, 64, 65):
        for start in (0, 131 - rows):
            assert torch.equal(matmul(x[start : start + rows]), batch[start : start + rows]), (rows, start)


def test_the_result_does_not_depend_on_the_thread_count(kernels, set_threads):
    for n, k in ((9728, 896), (896, 4864), (37, 70)):
        weight, bias, x = operands(n, k, 9)
        matmul = kernels.pack_linear(weight, bias)
        set_threads(1)
        alone = matmul(x)
        for count in (2, 3):
            set_threads(count)
            assert torch.equal(matmul(x), alone), (n, k, count)


def test_leading_dimensions_are_kept(kernels):
    weight, bias, x = operands(7, 64, 6)
    matmul = kernels.pack_linear(weight, bias)
    assert torch.equal(matmul(x.reshape(2, 3, 64)).reshape(6, 7), matmul(x))


def test_other_dtypes_stay_on_the_cpu_set():
    kernels = NativeKernels()
    assert kernels.pack_linear(torch.randn(8, 16), None) is None  # float32: F.linear, the reference's bits
    half = kernels.pack_linear(torch.randn(8, 16).half(), None)
    assert half is None or isinstance(half, (PackedLinear, UpcastLinear))


def test_a_layer_calls_it_on_its_rows_without_padding(kernels):
    from llmp.modeling.layers import PackableLinear, pack_linear_layers

    layer = PackableLinear()
    layer.weight = torch.nn.Parameter(torch.randn(12, 64).bfloat16(), requires_grad=False)
    seen = []
    assert pack_linear_layers(layer, kernels) == 1
    assert layer.packed_row_invariant
    packed = layer.packed
    layer.packed = lambda x: seen.append(x.shape[0]) or packed(x)
    layer.matmul(torch.randn(3, 64).bfloat16())
    assert seen == [3]  # not a 32-row block


def test_a_mismatched_input_is_a_clear_error(kernels):
    weight, bias, x = operands(40, 64, 3)
    matmul = kernels.pack_linear(weight, bias)
    with pytest.raises(RuntimeError, match="does not match the packed weight"):
        torch.ops.llmp_native.dense_matmul(torch.randn(3, 65).bfloat16(), matmul.panels, 40, None)
    with pytest.raises(RuntimeError, match="bfloat16"):
        torch.ops.llmp_native.dense_matmul(x.float(), matmul.panels, 40, None)


def test_the_packed_panels_hold_the_weight_zero_padded(kernels):
    weight, _, _ = operands(70, 33, 1)
    panels = torch.ops.llmp_native.dense_pack(weight)
    assert panels.shape == (2, 17, 64, 2)  # 70 columns in panels of 64; 33 values of K in 17 pairs
    unpacked = panels.permute(0, 2, 1, 3).reshape(128, 34)
    assert torch.equal(unpacked[:70, :33], weight)
    assert not unpacked[70:].any() and not unpacked[:, 33:].any()
