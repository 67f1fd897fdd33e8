"""dense_matmul (bfloat16 linear layers) against float64 on each of its paths (the pairs' AVX2 form, which runs on
any AVX2 CPU; vdpbf16ps pairs and the tile path emulated in scalar code on AVX-512 BF16 CPUs; AMX tiles where the
CPU has them): values, each row alone bit for bit, thread counts, the layer calling it without 32-row blocks, the
path chosen by the CPU and LLMP_NATIVE_AMX, and the other dtypes left to the cpu set. On an AVX-512 BF16 CPU the
whole file runs again with LLMP_NATIVE_ISA=avx2, where every layer takes the AVX2 form."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from llmp_kernels_cpu.kernels import CpuKernels, PackedLinear, UpcastLinear
from llmp_kernels_cpu_native.kernels import DenseLinear, NativeKernels, gated_linear
from llmp_kernels_cpu_native.library import dense_on_pairs, dense_path, dense_supported

pytestmark = pytest.mark.skipif(not dense_supported(), reason="no AVX2: the library cannot run it here")

PAIRS, AVX2_PAIRS, TILES, EMULATED = "avx512-bf16 pairs", "avx2 pairs", "amx tiles", "emulated amx tiles"
# AVX-512 BF16 here and selected (not LLMP_NATIVE_ISA=avx2)
BF16 = dense_supported() and dense_path() != AVX2_PAIRS
PAIRS_HERE = PAIRS if BF16 else AVX2_PAIRS  # the pairs the gated epilogue and the decoder layer run on
# every path this CPU runs: the AVX2 form everywhere; with BF16 the vdpbf16ps pairs and the tile path in scalar
# code, and the AMX instructions where they are
USABLE_TILES = BF16 and torch.ops.llmp_native.amx_tiles_unusable() == ""
PATHS = [AVX2_PAIRS, *([PAIRS, EMULATED] if BF16 else []), *([TILES] if USABLE_TILES else [])]

SHAPES = [(1152, 896), (37, 70), (896, 4864), (5, 32), (100, 31)]  # K tails of 6, 0 and 31; N not a multiple of 6


class OnPath(DenseLinear):
    """A layer's packed weight multiplied on one named path (``dense_matmul_with``)."""

    def __init__(self, weight, bias, path: str) -> None:
        super().__init__(weight, bias)
        self.path = path

    def __call__(self, x):
        rows = x.reshape(-1, self.in_features)
        out = torch.ops.llmp_native.dense_matmul_with(rows, self.panels, self.out_features, self.bias, self.path)
        return out.reshape(*x.shape[:-1], self.out_features)


@pytest.fixture(scope="module")
def kernels() -> NativeKernels:
    return NativeKernels()


def test_bfloat16_layers_take_it_on_every_avx2_cpu():
    packed = NativeKernels().pack_linear(torch.randn(8, 64).bfloat16(), None)
    assert isinstance(packed, DenseLinear)
    # AMX tiles where the CPU has them (and Linux grants the tile state), vdpbf16ps pairs on other AVX-512 BF16
    # CPUs, their AVX2 form elsewhere; never pairs on an AMX CPU without the reason
    if not BF16:
        assert dense_path() == AVX2_PAIRS
    elif USABLE_TILES:
        assert dense_path() == TILES
    elif torch.ops.llmp_native.has_amx():
        assert dense_path() == f"{PAIRS} ({torch.ops.llmp_native.amx_tiles_unusable()})"
    else:
        assert dense_path() == PAIRS and torch.ops.llmp_native.amx_tiles_unusable() == "no AMX"


def operands(n: int, k: int, rows: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(n, k, generator=generator).bfloat16()
    bias = torch.randn(n, generator=generator).bfloat16()
    x = torch.randn(rows, k, generator=generator).bfloat16()
    return weight, bias, x


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("n, k", SHAPES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_matches_float64_within_one_rounding(path, n, k, with_bias):
    weight, bias, x = operands(n, k, 67)
    bias = bias if with_bias else None
    got = OnPath(weight, bias, path)(x)
    expected = F.linear(x.double(), weight.double(), None if bias is None else bias.double())
    assert got.dtype == torch.bfloat16 and got.shape == (67, n)
    # float32 accumulation of exact products, then one rounding to bfloat16 (relative 2^-8)
    bound = 2**-8 * expected.abs() + 1e-5 * (x.double().abs() @ weight.double().abs().T)
    assert ((got.double() - expected).abs() <= bound).all()


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("n, k", SHAPES)
def test_a_row_has_the_same_bits_alone_and_in_any_batch(path, n, k):
    weight, bias, x = operands(n, k, 131)
    matmul = OnPath(weight, bias, path)
    batch = matmul(x)
    for rows in (1, 2, 3, 5, 15, 16, 17, 32, 33, 64, 65):  # tiles of 16 rows and blocks of 32, full and partial
        for start in (0, 131 - rows):
            assert torch.equal(matmul(x[start : start + rows]), batch[start : start + rows]), (rows, start)


@pytest.mark.parametrize("path", PATHS)
def test_rows_in_every_chunk_of_a_long_prefill_have_their_own_bits(path):
    # 1100 rows of K = 896: the tile path's chunks of 512 rows that stay in L2 (the pairs path's of 96)
    weight, bias, x = operands(200, 896, 1100)
    matmul = OnPath(weight, bias, path)
    batch = matmul(x)
    for start, rows in ((0, 1), (511, 2), (1023, 77), (1099, 1), (500, 600)):
        assert torch.equal(matmul(x[start : start + rows]), batch[start : start + rows]), (rows, start)
    expected = F.linear(x.double(), weight.double(), bias.double())
    assert (
        (batch.double() - expected).abs()
        <= 2**-8 * expected.abs() + 1e-5 * (x.double().abs() @ weight.double().abs().T)
    ).all()


@pytest.mark.parametrize("path", PATHS)
def test_the_result_does_not_depend_on_the_thread_count(path, set_threads):
    for n, k in ((9728, 896), (896, 4864), (37, 70)):
        weight, bias, x = operands(n, k, 9)
        matmul = OnPath(weight, bias, path)
        set_threads(1)
        alone = matmul(x)
        for count in (2, 3):
            set_threads(count)
            assert torch.equal(matmul(x), alone), (n, k, count)


@pytest.mark.parametrize("gated", [False, True])
def test_panels_taken_from_a_thread_that_fell_behind_keep_their_bits(set_threads, gated):
    # more threads than cores: some are descheduled mid-call, and the others take what is left of their panels
    # (csrc/unit_range.h); each must still be computed once, with the instructions of its owner
    weight, bias, x = operands(2 * 4864, 896, 200)
    matmul = gated_linear(weight, bias)[1] if gated else OnPath(weight, bias, PAIRS_HERE)
    set_threads(1)
    alone = matmul(x)
    set_threads(3 * (os.cpu_count() or 1) + 3)
    for _ in range(10):
        assert torch.equal(matmul(x), alone)


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


@pytest.mark.parametrize("path", PATHS)
def test_the_start_up_check_s_product_is_exact_so_only_a_wrong_tile_fails_it(path):
    # the product the library checks the tile instructions on before it uses them (dense_matmul_check): every sum
    # exact in float32, so every correct path gives the float64 product's bits after the one rounding
    x = ((torch.arange(21 * 84).float() % 13 - 6) / 4).reshape(21, 84).bfloat16()
    weight = ((torch.arange(70 * 84).float() % 11 - 5) / 8).reshape(70, 84).bfloat16()
    bias = (torch.arange(70).float() % 7 - 3).bfloat16()
    expected = F.linear(x.double(), weight.double(), bias.double()).bfloat16()
    assert torch.equal(OnPath(weight, bias, path)(x), expected)
    assert torch.ops.llmp_native.dense_matmul_check(path)


def test_the_tile_instructions_are_checked_in_a_child_so_a_refused_one_is_a_reason_not_a_crash():
    # the start-up check runs the tile instructions in a child process; on a CPU without AMX they are refused
    # (SIGILL) there, and this process lives on to say why
    why = torch.ops.llmp_native.amx_tiles_check()
    if USABLE_TILES:
        assert why == ""
    elif not torch.ops.llmp_native.has_amx():  # (a compiler without the AMX intrinsics builds no tile path)
        assert why in ("the tiles' check died of signal 4 (Illegal instruction)", "built without the AMX tile path")
    assert torch.ops.llmp_native.dense_matmul_check(PAIRS_HERE)  # and the library still multiplies here


@pytest.mark.parametrize("path", PATHS)
def test_an_empty_inner_dimension_gives_the_bias(path):
    bias = torch.randn(70).bfloat16()
    panels = torch.ops.llmp_native.dense_pack(torch.empty(70, 0).bfloat16())
    got = torch.ops.llmp_native.dense_matmul_with(torch.empty(3, 0).bfloat16(), panels, 70, bias, path)
    assert torch.equal(got, bias.expand(3, 70))
    got = torch.ops.llmp_native.dense_matmul_with(torch.empty(3, 0).bfloat16(), panels, 70, None, path)
    assert torch.equal(got, torch.zeros(3, 70).bfloat16())


@pytest.mark.parametrize("path", [path for path in PATHS if path != AVX2_PAIRS])
def test_denormal_values_count_as_zero(path):
    # vdpbf16ps and the tile instructions read denormal bfloat16 values as zero (the emulation does as they do)
    weight, _, x = operands(64, 96, 20)
    weight = weight.abs() + 1  # every product of a denormal with it would be a nonzero denormal without the flush
    x[0] = torch.full((96,), 1e-39).bfloat16()  # a denormal in bfloat16 (and float32)
    assert 0 < x[0].float().abs().max() < torch.finfo(torch.float32).tiny
    x[1, ::3] = x[0, ::3]
    got = OnPath(weight, None, path)(x)
    assert torch.equal(got[0], torch.zeros(64).bfloat16())
    flushed = x.clone()
    flushed[1, ::3] = 0
    assert torch.equal(got[1:], OnPath(weight, None, path)(flushed)[1:])


def test_the_avx2_form_multiplies_denormal_values_as_float32_does():
    # plain float32 FMAs: a denormal input is a value, as in F.linear on float32 (no flush to zero)
    weight, _, x = operands(64, 96, 2)
    x[0] = torch.full((96,), 1e-39).bfloat16()
    got = OnPath(weight.abs() + 1, None, AVX2_PAIRS)(x)
    expected = F.linear(x.double(), (weight.abs() + 1).double())
    assert got[0].abs().min() > 0 and ((got.double() - expected).abs() <= 2**-8 * expected.abs()).all()


def test_an_unknown_or_absent_path_is_a_clear_error(kernels):
    weight, bias, x = operands(40, 64, 3)
    matmul = kernels.pack_linear(weight, bias)
    with pytest.raises(RuntimeError, match="no path named 'avx9'"):
        torch.ops.llmp_native.dense_matmul_with(x, matmul.panels, 40, None, "avx9")
    if not BF16:
        for path in (PAIRS, TILES, EMULATED):
            with pytest.raises(RuntimeError, match="need AVX-512 BF16"):
                torch.ops.llmp_native.dense_matmul_with(x, matmul.panels, 40, None, path)
    elif TILES not in PATHS:
        with pytest.raises(RuntimeError, match="no usable AMX tiles"):
            torch.ops.llmp_native.dense_matmul_with(x, matmul.panels, 40, None, TILES)


CHOSEN = """
import sys, torch
from llmp_kernels_cpu_native.kernels import DenseLinear, NativeKernels, gated_linear
from llmp_kernels_cpu_native.library import dense_path
packed = NativeKernels().pack_linear(torch.randn(8, 64).bfloat16(), None)
print(dense_path(), type(packed).__name__)
"""


@pytest.mark.parametrize(
    "variable, expected",
    [
        (None, (TILES if TILES in PATHS else PAIRS_HERE, "DenseLinear")),
        ("0", (PAIRS_HERE, "DenseLinear")),
        ("emulate", (EMULATED if BF16 else AVX2_PAIRS, "DenseLinear")),  # the emulation needs AVX-512 BF16
        # the cpu set's oneDNN matmul, in 32-row blocks (on a float32 copy where oneDNN has no bfloat16 products)
        ("onednn", (None, type(CpuKernels().pack_linear(torch.randn(8, 64).bfloat16(), None)).__name__)),
    ],
)
def test_llmp_native_amx_chooses_the_path(variable, expected):
    env = {key: value for key, value in os.environ.items() if key != "LLMP_NATIVE_AMX"}
    if variable is not None:
        env["LLMP_NATIVE_AMX"] = variable
    result = subprocess.run([sys.executable, "-c", CHOSEN], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    path, kind = result.stdout.split("\n")[-2].rsplit(" ", 1)
    assert kind == expected[1] and (expected[0] is None or path == expected[0]), result.stdout


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


# -- the gated MLP's gate|up matmul with SiLU-and-mul in its epilogue (pack_gated_linear) ----------------------------

GATED_SHAPES = [(4864, 896), (70, 33), (32, 64), (5, 31), (100, 1)]  # I: 152 panels, a partial one, one, ...


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16)  # NaNs compared by their bits


@pytest.mark.parametrize("half, k", GATED_SHAPES)
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("rows", [1, 7, 200])  # one tile's rows, a partial tile, chunks of 96 and a tail
def test_the_gated_epilogue_has_the_bits_of_the_matmul_then_silu_and_mul(kernels, half, k, with_bias, rows):
    weight, bias, x = operands(2 * half, k, rows, seed=half + k)
    bias = bias if with_bias else None
    x[0, : min(k, 3)] = torch.tensor([float("nan"), 1e-39, -0.0])[: min(k, 3)]  # a NaN row, a subnormal
    plain, gated = gated_linear(weight, bias)
    product = OnPath(weight, bias, PAIRS_HERE)(x)
    assert torch.equal(bits(plain(x)), bits(product))  # gate|up back in their order
    got = gated(x)
    assert got.shape == (rows, half)
    assert torch.equal(bits(got), bits(kernels.silu_and_mul(product)))
    assert torch.equal(bits(gated(x[-1:])), bits(got[-1:]))  # a row alone: its bits in the batch
    assert plain.row_invariant and gated.row_invariant


def test_the_gated_product_does_not_depend_on_the_thread_count(set_threads):
    weight, bias, x = operands(2 * 4864, 896, 9)
    _, gated = gated_linear(weight, bias)
    set_threads(1)
    alone = gated(x)
    for count in (2, 3):
        set_threads(count)
        assert torch.equal(gated(x), alone), count
    assert gated(x[:0]).shape == (0, 4864)


def test_gated_packing_is_offered_for_bfloat16_silu_on_the_pairs_alone(kernels):
    weight = torch.randn(64, 32)
    assert kernels.pack_gated_linear(weight, None, "silu") is None  # float32: the reference's matmul
    assert kernels.pack_gated_linear(weight.bfloat16(), None, "gelu_tanh") is None  # the row kernel after
    assert kernels.pack_gated_linear(weight[:63].bfloat16(), None, "silu") is None  # no gate|up halves
    offered = kernels.pack_gated_linear(weight.bfloat16(), None, "silu")
    assert (offered is not None) == dense_on_pairs()  # AMX tiles: the matmul, then the row kernel
    env = {**os.environ, "LLMP_NATIVE_AMX": "onednn"}  # bfloat16 layers left to oneDNN: nothing gated either
    code = (
        "import torch; from llmp_kernels_cpu_native.kernels import NativeKernels; "
        "print(NativeKernels().pack_gated_linear(torch.randn(64, 32).bfloat16(), None, 'silu'))"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "None"


def test_a_gated_mlp_runs_its_gate_up_and_silu_in_one_call(kernels):
    from llmp.modeling.layers import GatedMLP, pack_linear_layers

    mlp = GatedMLP(64, 96, False, kernels).bfloat16()
    generator = torch.Generator().manual_seed(3)
    for param in mlp.parameters():
        param.data.copy_(torch.randn(param.shape, generator=generator) * 0.2)
    x = torch.randn(5, 64, generator=generator).bfloat16()
    gate_up, down = mlp.gate_up_proj.weight.detach().clone(), mlp.down_proj.weight.detach().clone()
    assert pack_linear_layers(mlp, kernels) == 2
    expected = DenseLinear(down, None)(kernels.silu_and_mul(DenseLinear(gate_up, None)(x)))
    if not dense_on_pairs():
        assert mlp.gated is None
    else:
        assert mlp.gated is not None and mlp.gate_up_proj.weight.numel() == 0  # one packed copy, shared
        calls = []
        mlp.act_and_mul = lambda h: calls.append(h) or kernels.silu_and_mul(h)
        assert torch.equal(mlp(x), expected) and not calls  # the row kernel never ran
        assert torch.equal(mlp.gate_up_proj(x), DenseLinear(gate_up, None)(x))  # the plain product (LoRA's base)


def test_the_whole_file_passes_on_the_avx2_form_too():
    # where this CPU has AVX-512 BF16, every test above again with LLMP_NATIVE_ISA=avx2: every bfloat16 layer, the
    # gated epilogue and the paths' choice then on the AVX2 form (on an AVX2 CPU they already ran on it)
    if not BF16:
        pytest.skip("the file already ran on the AVX2 form")
    env = {**os.environ, "LLMP_NATIVE_ISA": "avx2"}
    command = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:xdist", "-p", "no:cacheprovider", __file__]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:]
