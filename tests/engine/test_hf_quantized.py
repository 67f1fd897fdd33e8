"""Hugging Face quantised checkpoints (AWQ, GPTQ, compressed-tensors int8): tiny Llamas whose linear weights are
packed here as AutoAWQ, GPTQModel/AutoGPTQ and compressed-tensors pack them, with the quantization_config those
tools write. llmp's dequantisation equals the libraries' own unpacking (re-implemented below the way they write
it), greedy output equals transformers running the dequantised weights, a symmetric 4-bit GPTQ matrix stays in
GGML Q4_0 blocks, and what llmp does not run is refused at start-up in one line."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from llmp_kernels_torch.kernels import TorchKernels
from safetensors.torch import load_file, save_file

from llmp import LLM, hookimpl
from llmp.api import KernelSetSpec, ModelLoadError
from llmp.model_files.hf_quantized import iter_hf_quantized
from llmp.model_files.weights import iter_weights
from llmp.quantization import Int8Activations, QuantizedWeight, matmul_reference
from llmp.testing import (
    assert_greedy_parity,
    engine_greedy,
    mixed_prompts,
    registered,
    save_tiny_gguf,
    save_tiny_llama,
)

# hidden 128 so that every linear's input is a whole number of 128-row groups
WIDE = dict(hidden_size=128, intermediate_size=256)
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

# -- quantisation_config as the tools write it --------------------------------------------------------------------


def awq_config(group_size: int = 128) -> dict:
    """AutoAWQ 0.2's save_quantized (Qwen2.5-*-AWQ, TheBloke/*-AWQ)."""
    return {
        "bits": 4,
        "group_size": group_size,
        "modules_to_not_convert": None,
        "quant_method": "awq",
        "version": "gemm",
        "zero_point": True,
    }


def gptq_config(bits: int = 4, group_size: int = 128, sym: bool = True, desc_act: bool = False, **more) -> dict:
    """GPTQModel's save (AutoGPTQ's lacks checkpoint_format, meaning v1 "gptq")."""
    return {
        "bits": bits,
        "checkpoint_format": "gptq",
        "desc_act": desc_act,
        "group_size": group_size,
        "lm_head": False,
        "meta": {"damp_percent": 0.01, "quantizer": ["gptqmodel:2.2.0"], "static_groups": False},
        "pack_dtype": "int32",
        "quant_method": "gptq",
        "sym": sym,
        "true_sequential": True,
        **more,
    }


def ct_config(fmt: str = "pack-quantized", symmetric: bool = True, input_activations: dict | None = None) -> dict:
    """llm-compressor's W8A16 (neuralmagic/*-quantized.w8a16); with input_activations, its W8A8."""
    weights = {
        "actorder": None,
        "block_structure": None,
        "dynamic": False,
        "group_size": None,
        "num_bits": 8,
        "observer": "minmax",
        "observer_kwargs": {},
        "strategy": "channel",
        "symmetric": symmetric,
        "type": "int",
    }
    group = {"input_activations": input_activations, "output_activations": None, "targets": ["Linear"]}
    return {
        "config_groups": {"group_0": {**group, "weights": weights}},
        "format": fmt,
        "global_compression_ratio": 1.45,
        "ignore": ["lm_head"],
        "kv_cache_scheme": None,
        "quant_method": "compressed-tensors",
        "quantization_status": "compressed",
    }


W8A8_ACTIVATIONS = {
    "actorder": None,
    "block_structure": None,
    "dynamic": True,
    "group_size": None,
    "num_bits": 8,
    "observer": None,
    "observer_kwargs": {},
    "strategy": "token",
    "symmetric": True,
    "type": "int",
}

# -- packing, as the tools do it ------------------------------------------------------------------------------------


def _int32(words: torch.Tensor) -> torch.Tensor:
    """int64 words of 32 bits -> int32 (two's complement, as numpy's uint32 -> int32 view)."""
    return torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)


def min_max_integers(weight: torch.Tensor, bits: int, g: torch.Tensor, sym: bool):
    """Integers ``q`` ``[in, out]``, zeros and fp16 scales ``[groups, out]`` of a float ``[out, in]`` weight whose
    input rows fall in groups ``g`` (GPTQ's quantizer without the error feedback: min/max per group)."""
    wt, maxq = weight.t().float(), (1 << bits) - 1
    groups = int(g.max()) + 1
    lo = torch.stack([wt[g == k].amin(0) for k in range(groups)]).clamp(max=0)
    hi = torch.stack([wt[g == k].amax(0) for k in range(groups)]).clamp(min=0)
    if sym:
        scales = (torch.maximum(-lo, hi) * 2 / maxq).half()
        zeros = torch.full_like(scales, (maxq + 1) // 2, dtype=torch.int64)
    else:
        scales = ((hi - lo) / maxq).half()
        zeros = torch.round(-lo / scales.float()).long().clamp(0, maxq)
    q = (torch.round(wt / scales.float()[g]) + zeros[g]).clamp(0, maxq).long()
    return q, zeros, scales


def awq_pack(values: torch.Tensor) -> torch.Tensor:
    """AutoAWQ's WQLinear_GEMM.from_linear: eight 4-bit columns per int32, column order_map[i] in nibble i."""
    order_map = [0, 2, 4, 6, 1, 3, 5, 7]
    packed = torch.zeros(values.shape[0], values.shape[1] // 8, dtype=torch.int64)
    for col in range(values.shape[1] // 8):
        for i in range(8):
            packed[:, col] |= values[:, col * 8 + order_map[i]] << (i * 4)
    return _int32(packed)


def gptq_pack_rows(q: torch.Tensor, bits: int) -> torch.Tensor:
    """GPTQModel's pack_original: ``qweight[row] |= int_weight[row * pack_factor + j] << (bits * j)``."""
    factor = 32 // bits
    packed = torch.zeros(q.shape[0] // factor, q.shape[1], dtype=torch.int64)
    for row in range(packed.shape[0]):
        for j in range(factor):
            packed[row] |= q[row * factor + j] << (bits * j)
    return _int32(packed)


def gptq_pack_zeros(zeros: torch.Tensor, bits: int, v1: bool) -> torch.Tensor:
    """AutoGPTQ's pack: zeros minus one (the v1 format), ``qzeros[:, col] |= zeros[:, i] << (bits * j)``."""
    factor, mask = 32 // bits, (1 << bits) - 1
    stored = (zeros - 1 if v1 else zeros) & mask
    packed = torch.zeros(zeros.shape[0], zeros.shape[1] // factor, dtype=torch.int64)
    for col in range(packed.shape[1]):
        for j in range(factor):
            packed[:, col] |= stored[:, col * factor + j] << (bits * j)
    return _int32(packed)


def awq_tensors(weight: torch.Tensor, group_size: int) -> dict[str, torch.Tensor]:
    g = torch.arange(weight.shape[1]) // group_size
    q, zeros, scales = min_max_integers(weight, 4, g, sym=False)
    return {"qweight": awq_pack(q), "qzeros": awq_pack(zeros), "scales": scales}


def gptq_tensors(
    weight: torch.Tensor, bits: int = 4, group_size: int = 128, sym: bool = True, g_idx=None, v1: bool = True
) -> dict[str, torch.Tensor]:
    rows = weight.shape[1]
    if g_idx is None:
        g_idx = torch.zeros(rows, dtype=torch.long) if group_size == -1 else torch.arange(rows) // group_size
    q, zeros, scales = min_max_integers(weight, bits, g_idx, sym)
    return {
        "qweight": gptq_pack_rows(q, bits),
        "qzeros": gptq_pack_zeros(zeros, bits, v1),
        "scales": scales,
        "g_idx": g_idx.to(torch.int32),
    }


def shuffled_g_idx(rows: int, group_size: int, seed: int) -> torch.Tensor:
    """Act-order's g_idx: groups of consecutive quantisation order, the rows visited in a random order."""
    order = torch.randperm(rows, generator=torch.Generator().manual_seed(seed))
    g_idx = torch.empty(rows, dtype=torch.long)
    g_idx[order] = torch.arange(rows) // group_size
    return g_idx


def ct_tensors(weight: torch.Tensor, packed: bool = True, symmetric: bool = True) -> dict[str, torch.Tensor]:
    """compressed-tensors' int8 per-channel quantisation; pack-quantized's pack_to_int32 (each value plus 128,
    four to a little-endian int32) and its weight_shape."""
    w = weight.float()
    if symmetric:
        scale, zero = (w.abs().amax(1, keepdim=True) / 127).half(), torch.zeros(w.shape[0], 1)
    else:
        lo, hi = w.amin(1, keepdim=True).clamp(max=0), w.amax(1, keepdim=True).clamp(min=0)
        scale = ((hi - lo) / 255).half()
        zero = torch.round(-128 - lo / scale.float()).clamp(-128, 127)
    q = (torch.round(w / scale.float()) + zero).clamp(-128, 127).to(torch.int8)
    tensors = {"weight_scale": scale}
    if not symmetric:
        tensors["weight_zero_point"] = zero.to(torch.int8)
    if packed:
        tensors["weight_packed"] = (q.int() + 128).to(torch.uint8).view(torch.int32)
        tensors["weight_shape"] = torch.tensor(list(w.shape), dtype=torch.int64)
    else:
        tensors["weight"] = q
    return tensors


# -- the libraries' dequantisation, re-implemented as they write it ------------------------------------------------


def awq_reference(t: dict[str, torch.Tensor], group_size: int) -> torch.Tensor:
    """AutoAWQ's packing_utils.dequantize_gemm (unpack_awq, reverse_awq_order, repeat_interleave), in float32."""
    shifts = torch.arange(0, 32, 4)
    reverse = torch.arange(t["qweight"].shape[1] * 8).view(-1, 8)[:, [0, 4, 1, 5, 2, 6, 3, 7]].view(-1)
    iweight = (t["qweight"][:, :, None] >> shifts[None, None, :]).view(t["qweight"].shape[0], -1)[:, reverse] & 15
    izeros = (t["qzeros"][:, :, None] >> shifts[None, None, :]).view(t["qzeros"].shape[0], -1)[:, reverse] & 15
    scales = t["scales"].float().repeat_interleave(group_size, dim=0)
    return ((iweight - izeros.repeat_interleave(group_size, dim=0)) * scales).t()


def gptq_reference(t: dict[str, torch.Tensor], bits: int, v1: bool = True) -> torch.Tensor:
    """GPTQModel's dequantize_weight (wf shifts along qzeros' columns and qweight's rows), the v1 zeros plus one
    as AutoGPTQ's and vLLM's kernels add it, then ``scales[g_idx] * (weight - zeros[g_idx])``."""
    factor, maxq = 32 // bits, (1 << bits) - 1
    wf = torch.arange(0, 32, bits, dtype=torch.int32)
    zeros = torch.bitwise_and(torch.unsqueeze(t["qzeros"], 2).expand(-1, -1, factor) >> wf.unsqueeze(0), maxq)
    zeros = zeros.reshape(t["qzeros"].shape[0], -1) + (1 if v1 else 0)
    weight = torch.bitwise_and(torch.unsqueeze(t["qweight"], 1).expand(-1, factor, -1) >> wf.unsqueeze(-1), maxq)
    weight = weight.reshape(weight.shape[0] * weight.shape[1], weight.shape[2])
    g_idx = t["g_idx"].long()
    return (t["scales"].float()[g_idx] * (weight - zeros[g_idx])).t()


def ct_reference(t: dict[str, torch.Tensor]) -> torch.Tensor:
    """compressed-tensors' unpack_from_int32 (minus the 128 offset) and _dequantize: (x_q - zero_point) * scale."""
    if "weight_packed" in t:
        shape = t["weight_shape"].tolist()
        q = t["weight_packed"].view(torch.uint8).reshape(shape).to(torch.int32) - 128
    else:
        q = t["weight"].to(torch.int32)
    zero = t.get("weight_zero_point", torch.zeros(1, dtype=torch.int8)).float()
    return (q.float() - zero) * t["weight_scale"].float()


# -- checkpoints -----------------------------------------------------------------------------------------------------


def save_quantized(
    path: Path, config: dict, pack: Callable[[str, torch.Tensor], dict[str, torch.Tensor]], seed: int = 0
) -> tuple[object, dict[str, torch.Tensor]]:
    """A tiny Llama with its linear weights packed by ``pack`` and ``config`` as its quantization_config; returns
    transformers' model holding the dequantised weights (of llmp's independent reference) and those weights."""
    model = save_tiny_llama(path, seed=seed, qk_scale=2.0, **WIDE)
    state = load_file(path / "model.safetensors")
    dense = {}
    for name in [n for n in state if n.endswith(".weight") and n.split(".")[-2] in LINEARS]:
        prefix = name.removesuffix(".weight")
        tensors = pack(prefix, state.pop(name))
        state.update({f"{prefix}.{suffix}": tensor for suffix, tensor in tensors.items()})
        dense[name] = reference(config, tensors)
        model.get_parameter(name).data.copy_(dense[name])
    save_file(state, path / "model.safetensors", metadata={"format": "pt"})
    hf_config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**hf_config, "quantization_config": config}))
    return model, dense


def reference(config: dict, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    if config["quant_method"] == "awq":
        return awq_reference(tensors, config["group_size"])
    if config["quant_method"] == "gptq":
        return gptq_reference(tensors, config["bits"], config.get("checkpoint_format", "gptq") == "gptq")
    return ct_reference(tensors)


def _seeded(prefix: str) -> int:
    return sum(map(ord, prefix))


# (config, packer) of each layout the loader reads
LAYOUTS = {
    "awq-g32": (awq_config(32), lambda p, w: awq_tensors(w, 32)),
    "awq-g64": (awq_config(64), lambda p, w: awq_tensors(w, 64)),
    "awq-g128": (awq_config(128), lambda p, w: awq_tensors(w, 128)),
    "gptq-sym-g32": (gptq_config(group_size=32), lambda p, w: gptq_tensors(w, group_size=32)),
    "gptq-asym-g64": (gptq_config(group_size=64, sym=False), lambda p, w: gptq_tensors(w, group_size=64, sym=False)),
    "gptq-sym-one-group": (gptq_config(group_size=-1), lambda p, w: gptq_tensors(w, group_size=-1)),
    "gptq-act-order": (
        gptq_config(group_size=32, sym=False, desc_act=True),
        lambda p, w: gptq_tensors(w, group_size=32, sym=False, g_idx=shuffled_g_idx(w.shape[1], 32, _seeded(p))),
    ),
    "gptq-8bit-v2": (
        gptq_config(bits=8, group_size=128, sym=False, checkpoint_format="gptq_v2"),
        lambda p, w: gptq_tensors(w, bits=8, group_size=128, sym=False, v1=False),
    ),
    "ct-w8a16-packed": (ct_config(), lambda p, w: ct_tensors(w)),
    "ct-w8a16-int-asym": (ct_config("int-quantized", symmetric=False), lambda p, w: ct_tensors(w, False, False)),
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_each_matrix_is_the_librarys_own_dequantisation(tmp_path, layout):
    config, pack = LAYOUTS[layout]
    model, dense = save_quantized(tmp_path, config, pack)
    weights = dict(iter_weights(tmp_path))
    assert set(weights) == set(model.state_dict())  # the packed parts became weights; nothing else is left over
    for name, expected in dense.items():
        assert weights[name].dtype == torch.float32
        assert torch.equal(weights[name], expected), name


def test_the_packing_round_trips_the_float_weight_to_within_a_step():
    """The packers above are right only if unpacking gives back each weight to within one step of its scale
    (half a step of rounding, and the zero point rounded too)."""
    weight = torch.randn(64, 128)
    awq, gptq, ct = awq_tensors(weight, 32), gptq_tensors(weight, 4, 64, False), ct_tensors(weight, True, False)
    for got, step in (
        (awq_reference(awq, 32), awq["scales"].float().repeat_interleave(32, 0).t()),
        (gptq_reference(gptq, 4), gptq["scales"].float().repeat_interleave(64, 0).t()),
        (ct_reference(ct), ct["weight_scale"].float()),
    ):
        assert ((got - weight).abs() <= step).all()


@pytest.mark.parametrize(
    "layout", ["awq-g64", "gptq-act-order", "gptq-8bit-v2", "ct-w8a16-packed", "ct-w8a16-int-asym"]
)
def test_greedy_output_is_transformers_with_the_dequantised_weights(tmp_path, layout, caplog):
    """On the default kernel set: the matrices a GGML format holds are computed in its blocks."""
    config, pack = LAYOUTS[layout]
    model, _ = save_quantized(tmp_path, config, pack, seed=5)
    prompts = mixed_prompts(3, seed=2)
    with caplog.at_level("INFO", logger="llmp.engine"):
        got, _ = engine_greedy(tmp_path, prompts, max_tokens=8)
    fmt = BLOCK_FORMATS[layout]
    kept = f"matrices kept in blocks: 14 in {fmt}; 0 dequantised" if fmt else "matrices kept in blocks: none; 14"
    assert kept in caplog.text
    assert_greedy_parity(model, prompts, got, max_tokens=8)


BLOCK_FORMATS = {  # the GGML format each layout's matrices stay in (None: dequantised)
    "awq-g32": "Q5_0",  # q - zero spans -15..15
    "awq-g64": "Q5_0",
    "awq-g128": "Q5_0",
    "gptq-sym-g32": "Q4_0",  # zero 8: -8..7
    "gptq-asym-g64": "Q5_0",
    "gptq-sym-one-group": "Q4_0",
    "gptq-act-order": "Q5_0",  # its inputs stored sorted by group (input_order)
    "gptq-8bit-v2": "Q8_0",  # asymmetric 8-bit: q - 128 in the blocks, the zero points as group_offsets
    "ct-w8a16-packed": "Q8_0",  # fp16 scales, one a row, repeated in each block
    "ct-w8a16-int-asym": "Q8_0",  # the stored int8 in the blocks, each row's zero point as its offset
}


OFFSET_LAYOUTS = ("gptq-8bit-v2", "ct-w8a16-int-asym")  # their levels span -255..255: zero points as offsets


@pytest.mark.parametrize("layout", LAYOUTS)
def test_each_integer_matrix_stays_in_exact_ggml_blocks_where_a_format_holds_it(tmp_path, layout):
    config, pack = LAYOUTS[layout]
    _, dense = save_quantized(tmp_path, config, pack)
    blocks = dict(iter_weights(tmp_path, quantized=True))
    fmt = BLOCK_FORMATS[layout]
    for name, expected in dense.items():
        got = blocks[name]
        if fmt is None:
            assert isinstance(got, torch.Tensor) and torch.equal(got, expected), name
            continue
        assert isinstance(got, QuantizedWeight) and got.format.name == fmt, (name, got)
        assert (got.group_offsets is not None) == (layout in OFFSET_LAYOUTS), name
        assert got.shape == expected.shape
        assert torch.equal(got.dequantize(), expected), name


def test_offsets_follow_the_rows_they_belong_to():
    weight = torch.randn(64, 128)
    tensors = gptq_tensors(weight, bits=8, group_size=32, sym=False, v1=False)
    config = gptq_config(bits=8, group_size=32, sym=False, checkpoint_format="gptq_v2")
    stream = [(f"a.{s}", t) for s, t in tensors.items()]
    got = dict(iter_hf_quantized(iter(stream), config, quantized=True))["a.weight"]
    dense = gptq_reference(tensors, 8, v1=False)
    assert got.group_offsets.shape == (64, 4)
    assert torch.equal(got.narrow(10, 5).dequantize(), dense[10:15])
    rows = torch.tensor([63, 0, 7])
    assert torch.equal(got.take(rows).dequantize(), dense[rows])
    stacked = QuantizedWeight.stack([got.narrow(40, 24), got.narrow(0, 40)])
    assert torch.equal(stacked.dequantize(), torch.cat([dense[40:], dense[:40]]))
    assert got.narrow_columns(0, 64) is None  # a row-parallel share is dequantised by its layer
    assert got.narrow_columns(0, 128) is got  # one rank's share is the whole weight
    assert not got.stacks_with(got.in_stored_order())


def test_a_layer_of_offset_reordered_int8_input_blocks_computes_its_weight():
    """The layer's wrappers around the set's matmul (input order, offsets, int8 inputs), T = 0 and T > 0."""
    from llmp.modeling.layers import RowParallelLinear, pack_quantized_layers

    weight = torch.randn(24, 128)
    tensors = gptq_tensors(weight, bits=8, group_size=32, sym=False, g_idx=shuffled_g_idx(128, 32, seed=4))
    config = gptq_config(bits=8, group_size=32, sym=False, desc_act=True)
    stream = [(f"a.{s}", t) for s, t in tensors.items()]
    blocks = dict(iter_hf_quantized(iter(stream), config, quantized=True))["a.weight"]
    assert blocks.input_order is not None and blocks.group_offsets is not None
    dense = gptq_reference(tensors, 8)

    class BlockKernels(TorchKernels):  # every format from its blocks as stored, as the reference computes it
        def pack_quantized(self, weight: QuantizedWeight) -> Callable[[torch.Tensor], torch.Tensor]:
            assert weight.input_order is None and weight.group_offsets is None
            return lambda x: matmul_reference(x, weight.blocks, weight.format)

    for kernels, activations in ((BlockKernels(), None), (BlockKernels(), Int8Activations()), (TorchKernels(), None)):
        layer = RowParallelLinear(128, 24, bias=False)
        layer.load_weight("weight", dataclasses.replace(blocks, activations=activations))
        pack_quantized_layers(layer, kernels, torch.float32)
        x = torch.randn(5, 128)
        inputs = x if activations is None else int8_inputs_reference(x, None)
        torch.testing.assert_close(layer(x), inputs @ dense.T, rtol=1e-5, atol=1e-4)
        assert layer(x[:0]).shape == (0, 24)


def test_int8_with_scales_float16_cannot_hold_is_dequantised():
    weight = torch.randn(64, 128)
    tensors = ct_tensors(weight)
    tensors["weight_scale"] = tensors["weight_scale"].float() * (1 + 2**-20)  # not a float16 value
    stream = [(f"a.{s}", t) for s, t in tensors.items()]
    got = dict(iter_hf_quantized(iter(stream), ct_config(), quantized=True))["a.weight"]
    assert isinstance(got, torch.Tensor)
    assert torch.equal(got, ct_reference(tensors))


def test_act_order_stores_shuffled_groups_sorted_and_plain_ones_as_they_are():
    weight = torch.randn(64, 128)
    plain = gptq_tensors(weight, group_size=32, g_idx=torch.arange(128) // 32)
    shuffled_groups = shuffled_g_idx(128, 32, seed=1)
    shuffled = gptq_tensors(weight, group_size=32, g_idx=shuffled_groups)
    uneven = torch.tensor([0] * 48 + [1] * 16 + [2] * 32 + [3] * 32)[
        torch.randperm(128, generator=torch.Generator().manual_seed(2))
    ]
    straddling = gptq_tensors(torch.randn(64, 128), group_size=32, g_idx=uneven)  # 4 groups, not of 32 rows each
    config = gptq_config(group_size=32, desc_act=True)
    layers = (("a", plain), ("b", shuffled), ("c", straddling))
    stream = [(f"{name}.{s}", t) for name, tensors in layers for s, t in tensors.items()]
    got = dict(iter_hf_quantized(iter(stream), config, quantized=True))
    assert isinstance(got["a.weight"], QuantizedWeight) and got["a.weight"].input_order is None
    assert torch.equal(got["a.weight"].dequantize(), gptq_reference(plain, 4))
    b = got["b.weight"]
    assert isinstance(b, QuantizedWeight) and b.format.name == "Q4_0"
    assert torch.equal(shuffled_groups[b.input_order], torch.sort(shuffled_groups).values)
    assert torch.equal(b.dequantize(), gptq_reference(shuffled, 4))
    # the layer's product: x's columns gathered in the stored order, times the blocks as stored
    x = torch.randn(5, 128)
    stored = b.in_stored_order()
    expected = x @ gptq_reference(shuffled, 4).T
    torch.testing.assert_close(matmul_reference(x[:, b.input_order], stored.blocks, stored.format), expected)
    # groups of 48 and 16 rows sorted straddle 32-row blocks: dequantised
    assert isinstance(got["c.weight"], torch.Tensor)
    assert torch.equal(got["c.weight"], gptq_reference(straddling, 4))


# -- W8A8: int8 weights and int8 inputs ------------------------------------------------------------------------------

W8A8_STATIC = {**W8A8_ACTIVATIONS, "dynamic": False, "strategy": "tensor", "observer": "minmax"}
INPUT_SCALE = 2**-5  # a static per-tensor scale (float32-exact): inputs beyond 127 / 32 clip, as an int8 kernel's
W8A8_LAYOUTS = {
    "dynamic-token": (ct_config(input_activations=W8A8_ACTIVATIONS), {}),
    "static-tensor": (
        ct_config("int-quantized", input_activations=W8A8_STATIC),
        {"input_scale": torch.tensor([INPUT_SCALE]), "input_zero_point": torch.tensor([0], dtype=torch.int8)},
    ),
}


def int8_inputs_reference(x: torch.Tensor, scale: float | None) -> torch.Tensor:
    """compressed-tensors' quantize-dequantize of a layer's input: symmetric int8, the scale per token (dynamic:
    its max |x| / 127) or the static one."""
    xf = x.float()
    s = xf.abs().amax(-1, keepdim=True) / 127 if scale is None else torch.full((), scale)
    s = torch.where(s == 0, torch.ones_like(s), s)
    return (torch.clamp(torch.round(xf / s), -128, 127) * s).to(x.dtype)


def save_w8a8(path: Path, layout: str, seed: int = 0) -> tuple[object, dict[str, torch.Tensor]]:
    config, extra = W8A8_LAYOUTS[layout]
    packed = config["format"] == "pack-quantized"
    tensors = lambda p, w: {**ct_tensors(w, packed), **{k: v.clone() for k, v in extra.items()}}  # noqa: E731
    model, dense = save_quantized(path, config, tensors, seed=seed)
    scale = None if layout == "dynamic-token" else INPUT_SCALE
    for name, module in model.named_modules():  # transformers' run quantises each linear input as compressed-tensors
        if isinstance(module, torch.nn.Linear) and name.rpartition(".")[2] in LINEARS:
            module.register_forward_pre_hook(lambda _, args: (int8_inputs_reference(args[0], scale),))
    return model, dense


@pytest.mark.parametrize("layout", W8A8_LAYOUTS)
def test_a_w8a8_weight_is_its_int8_blocks_carrying_its_input_scheme(tmp_path, layout):
    _, dense = save_w8a8(tmp_path, layout)
    weights = dict(iter_weights(tmp_path, quantized=True))
    for name, expected in dense.items():
        got = weights[name]
        assert isinstance(got, QuantizedWeight) and got.format.name == "Q8_0", name
        assert got.activations == Int8Activations(None if layout == "dynamic-token" else INPUT_SCALE)
        assert torch.equal(got.dequantize(), expected), name


@pytest.mark.parametrize("layout", W8A8_LAYOUTS)
def test_w8a8_greedy_output_is_transformers_quantising_each_linear_input(tmp_path, layout, caplog):
    model, _ = save_w8a8(tmp_path, layout, seed=6)
    prompts = mixed_prompts(3, seed=3)
    with caplog.at_level("INFO", logger="llmp.engine"):
        got, _ = engine_greedy(tmp_path, prompts, max_tokens=8)
    scheme = "dynamic per token" if layout == "dynamic-token" else "static per tensor"
    assert f"compressed-tensors W8A8 (int8 inputs, {scheme})" in caplog.text
    assert "matrices kept in blocks: 14 in Q8_0; 0 dequantised" in caplog.text
    assert_greedy_parity(model, prompts, got, max_tokens=8)


def test_int8_inputs_are_whole_steps_of_the_rows_scale_and_row_invariant():
    x = torch.randn(6, 64) * torch.tensor([0.01, 1, 10, 100, 0, 3]).reshape(-1, 1)
    got = Int8Activations()(x)
    assert torch.equal(got, int8_inputs_reference(x, None))
    step = x.abs().amax(-1, keepdim=True) / 127
    assert (got[4] == 0).all()  # an all-zero row stays zero
    nonzero = step.squeeze(1) > 0
    assert ((got - x).abs()[nonzero] <= step[nonzero] / 2 * (1 + 1e-6)).all()
    assert torch.equal(Int8Activations()(x[2:3]), got[2:3])
    clipped = Int8Activations(0.01)(torch.tensor([[5.0, -5.0, 0.004, 0.006]]))
    assert torch.equal(clipped, torch.tensor([[1.27, -1.28, 0.0, 0.01]]))


def test_w8a8_needs_a_model_class_that_keeps_quantised_weights(tmp_path):
    save_w8a8(tmp_path, "dynamic-token")
    with pytest.raises(ModelLoadError, match="W8A8 needs a model class that keeps quantised weights"):
        dict(iter_weights(tmp_path, quantized=False))


def test_a_w8a8_weight_a_layer_would_hold_dense_is_refused():
    """Its int8 inputs are applied only around its blocks: dequantised into a plain parameter they would be lost."""
    from llmp.modeling.layers import load_weights
    from llmp.quantization import GGML_FORMATS, quantize

    model = torch.nn.Module()
    model.proj = torch.nn.Linear(64, 8, bias=False)
    weight = QuantizedWeight(
        quantize(torch.randn(8, 64), "Q8_0"), GGML_FORMATS["Q8_0"], 64, activations=Int8Activations()
    )
    with pytest.raises(ModelLoadError, match="a W8A8 weight .* must stay in its blocks"):
        load_weights(model, iter([("proj.weight", weight)]))
    load_weights(model, iter([("proj.weight", QuantizedWeight(weight.blocks, weight.format, 64))]))  # W8A16: dense
    assert torch.equal(model.proj.weight.data, weight.dequantize())


class Q4Kernels(TorchKernels):
    """The torch set computing Q4_0 from its blocks (the reference matmul); counts the matrices it gets."""

    name = "q4"
    packed: list[int] = []

    def pack_quantized(self, weight: QuantizedWeight) -> Callable[[torch.Tensor], torch.Tensor] | None:
        if weight.format.name != "Q4_0":
            return None
        Q4Kernels.packed.append(weight.out_features)
        return lambda x: matmul_reference(x, weight.blocks, weight.format)


class Q4KernelsPlugin:
    @hookimpl
    def llmp_register_kernels(self) -> Iterator[KernelSetSpec]:
        yield KernelSetSpec(name="q4", impl=f"{__name__}:Q4Kernels", devices=("cpu",))


def test_a_symmetric_gptq_checkpoint_runs_in_q4_0_blocks_greedy_as_transformers(tmp_path, caplog):
    config, pack = LAYOUTS["gptq-sym-g32"]
    model, _ = save_quantized(tmp_path, config, pack, seed=3)
    prompts = mixed_prompts(3, seed=4)
    Q4Kernels.packed.clear()
    with registered(Q4KernelsPlugin()), caplog.at_level("INFO", logger="llmp.engine"):
        got, _ = engine_greedy(tmp_path, prompts, max_tokens=8, kernels="q4")
    assert Q4Kernels.packed == [256, 128, 512, 128] * 2  # each layer's fused q|k|v, o, fused gate|up, down
    assert (
        "quantization_config: gptq 4-bit, group size 32, sym true, desc_act false; "
        "matrices kept in blocks: 14 in Q4_0; 0 dequantised" in caplog.text
    )
    assert "computed in their blocks by kernel set 'q4'" in caplog.text
    assert_greedy_parity(model, prompts, got, max_tokens=8)


@pytest.mark.parametrize(
    "config, words",
    [
        ({**awq_config(), "version": "gemv"}, "awq quantization with version 'gemv' is not supported"),
        ({**awq_config(), "bits": 8}, "awq quantization with bits 8 is not supported"),
        (awq_config(256), "awq quantization with group_size 256 is not supported"),
        ({**awq_config(), "zero_point": False}, "awq quantization with zero_point False is not supported"),
        (gptq_config(bits=3), "gptq quantization with bits 3 is not supported"),
        (gptq_config(group_size=16), "gptq quantization with group_size 16 is not supported"),
        (gptq_config(checkpoint_format="marlin"), "gptq quantization with checkpoint_format 'marlin' is not supported"),
        (
            ct_config("int-quantized", input_activations={**W8A8_ACTIVATIONS, "dynamic": False}),
            "compressed-tensors quantization with input_activations 'int8 token static' is not supported",
        ),
        (
            ct_config("int-quantized", input_activations={**W8A8_ACTIVATIONS, "symmetric": False}),
            "compressed-tensors quantization with input_activations.symmetric False is not supported",
        ),
        (ct_config("float-quantized"), "compressed-tensors quantization with format 'float-quantized'"),
        ({"quant_method": "fp8", "activation_scheme": "dynamic"}, "quantization method 'fp8' .* is not supported"),
        ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "quantization method 'bitsandbytes'"),
    ],
)
def test_what_llmp_does_not_run_is_refused_in_one_line(tmp_path, config, words):
    save_tiny_llama(tmp_path)
    hf_config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**hf_config, "quantization_config": config}))
    with pytest.raises(ModelLoadError, match=words) as raised:
        LLM(str(tmp_path), dtype="float32")
    assert "\n" not in str(raised.value) and "llmp runs" in str(raised.value)


def test_quantization_must_match_the_checkpoints_method(tmp_path):
    awq = tmp_path / "awq"
    save_quantized(awq, *LAYOUTS["awq-g128"])
    with pytest.raises(ValueError, match=r"model config \(awq\) does not match .* `quantization` argument \(gptq\)\."):
        LLM(str(awq), quantization="gptq")
    plain = tmp_path / "plain"
    save_tiny_llama(plain)
    with pytest.raises(ValueError, match="quantization 'awq' was asked for, but .* holds unquantised weights"):
        LLM(str(plain), quantization="awq")
    with pytest.raises(ValueError, match="quantization 'gguf' was asked for"):
        LLM(str(plain), quantization="gguf")
    gguf = tmp_path / "tiny.gguf"
    save_tiny_gguf(gguf)
    with pytest.raises(ValueError, match=r"model config \(gguf\) does not match .* argument \(compressed-tensors\)"):
        LLM(str(gguf), quantization="compressed-tensors")
    LLM(str(gguf), quantization="gguf", max_model_len=64)
    LLM(str(awq), quantization="awq", dtype="float32", max_model_len=64)
    LLM(str(awq), quantization="awq_marlin", dtype="float32", max_model_len=64)  # vLLM's GPU kernel's name
    with pytest.raises(ValueError, match=r"model config \(awq\) does not match .* argument \(gptq_marlin\)\."):
        LLM(str(awq), quantization="gptq_marlin")


def test_a_layer_missing_a_packed_tensor_is_one_line_naming_it():
    tensors = gptq_tensors(torch.randn(64, 128), group_size=32)
    stream = iter([("l.qweight", tensors["qweight"]), ("l.qzeros", tensors["qzeros"])])
    with pytest.raises(ModelLoadError, match=r"^gptq checkpoint: layer l has no scales \(1 incomplete\)$"):
        list(iter_hf_quantized(stream, gptq_config(group_size=32)))


@pytest.mark.parametrize(
    "config, tensors",
    [
        (awq_config(128), awq_tensors(torch.randn(64, 256), 64)),
        (gptq_config(group_size=128), gptq_tensors(torch.randn(64, 256), group_size=64)),  # its g_idx says 64 too
        (gptq_config(group_size=-1), gptq_tensors(torch.randn(64, 256), group_size=64)),
    ],
    ids=["awq", "gptq", "gptq-one-group"],
)
def test_a_group_size_the_tensors_were_not_packed_with_is_refused(config, tensors):
    """A config whose group size is larger than the tensors' took every group's scales from the first
    ones (silently wrong weights): the scales' rows must be the groups the config implies."""
    needs = 1 if config["group_size"] == -1 else 2
    stream = iter([(f"l.{suffix}", tensor) for suffix, tensor in tensors.items()])
    with pytest.raises(ModelLoadError, match=f"4 groups of scales for 256 input rows: group_size .* needs {needs}"):
        list(iter_hf_quantized(stream, config))


@pytest.mark.parametrize("layout", ["awq-g64", "gptq-8bit-v2", "ct-w8a16-packed"])
def test_a_small_quantised_checkpoint_computes_in_float32_unless_a_dtype_is_asked(tmp_path, layout, monkeypatch):
    """As a GGUF file: answers match the checkpoint's float32 reference, whatever float16 its config names."""
    from llmp.model_files import gguf
    from llmp.model_files.hf_quantized import dequantized_parameter_count, parse_quantization_config
    from llmp.model_files.resolve import resolve_model
    from llmp.options import EngineConfig

    config, pack = LAYOUTS[layout]
    model, _ = save_quantized(tmp_path, config, pack)
    hf_config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**hf_config, "dtype": "float16", "torch_dtype": "float16"}))
    weights = dequantized_parameter_count(tmp_path, parse_quantization_config(config))
    assert weights == sum(t.numel() for t in model.state_dict().values())  # the dense checkpoint's
    assert resolve_model(EngineConfig(model=str(tmp_path))).dtype == "float32"
    assert resolve_model(EngineConfig(model=str(tmp_path), dtype="bfloat16")).dtype == "bfloat16"
    monkeypatch.setattr(gguf, "FLOAT32_COMPUTE_BYTES", 4 * weights - 1)  # a larger model: its config's dtype
    assert resolve_model(EngineConfig(model=str(tmp_path))).dtype == "float16"
