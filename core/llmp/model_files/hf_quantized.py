"""Hugging Face quantised checkpoints (AWQ, GPTQ, compressed-tensors int8): their ``quantization_config``
checked once at resolution, and their packed tensors turned back into each linear layer's ``weight``.

The layouts are those of the tools that write them (and of vLLM's loaders):

- **AWQ** (AutoAWQ, version ``gemm``): ``qweight`` int32 ``[in, out / 8]``, eight 4-bit output columns per
  word in AutoAWQ's interleaved order (word nibble ``i`` holds column ``AWQ_ORDER[i]`` of its eight);
  ``qzeros`` int32 ``[in / group, out / 8]`` packed the same way; ``scales`` fp16 ``[in / group, out]``.
  ``w = (q - zero) * scale``.
- **GPTQ** (AutoGPTQ, GPTQModel): ``qweight`` int32 ``[in * bits / 32, out]``, packed along the input
  dimension, value ``j`` of a word in bits ``j * bits``; ``qzeros`` int32 ``[groups, out * bits / 32]``
  packed along the output dimension; ``scales`` fp16 ``[groups, out]``; ``g_idx`` int32 ``[in]``, the group
  of each input row (act-order shuffles it). ``checkpoint_format`` ``gptq`` (v1, the default) stores each
  zero minus one, ``gptq_v2`` the zero itself. ``w = (q - zero[g_idx]) * scale[g_idx]``.
- **compressed-tensors** int8 weights, weight-only (``W8A16``) or with int8 inputs (``W8A8``): ``weight`` int8
  ``[out, in]`` (formats ``int-quantized``, ``naive-quantized``) or ``weight_packed`` int32 ``[out, in / 4]``
  (``pack-quantized``: four values per word, each stored plus 128), ``weight_scale`` ``[out, 1]`` (or ``[1]`` per
  tensor), ``weight_zero_point`` when asymmetric, ``input_scale`` ``[1]`` for static W8A8 inputs.
  ``w = (q - zero_point) * scale``; a W8A8 layer's weight carries :class:`~llmp.quantization.Int8Activations`.

:func:`iter_hf_quantized` wraps a checkpoint's ``(name, tensor)`` stream: it holds a layer's packed tensors
until the last arrives and yields ``<prefix>.weight``, dequantised to float32 (exact: the small integer times
the fp16 scale is exact in float32), or with ``quantized`` and where exact a
:class:`~llmp.quantization.QuantizedWeight` of GGML blocks for the kernel set. A matrix whose 32-column blocks
each lie in one group with fp16 scales is ``d * level`` per block, ``level = q - zero``: symmetric 4-bit GPTQ
fits ``Q4_0`` (-8..7), AWQ and asymmetric 4-bit GPTQ ``Q5_0`` (-15..15, 5.5 bits a weight), 8-bit GPTQ and
int8 compressed-tensors with fp16-exact scales ``Q8_0``; asymmetric 8-bit ones, whose levels do not fit, ``Q8_0``
of the stored integers with their zero points as ``QuantizedWeight.group_offsets``. Act-order GPTQ's shuffled
groups are made contiguous by storing the input rows sorted by group (``QuantizedWeight.input_order``; the layer
gathers x's columns to match).
"""

from __future__ import annotations

import json
import logging
import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmp.api import ModelLoadError

if TYPE_CHECKING:
    import torch

log = logging.getLogger("llmp.engine")

METHODS = ("awq", "gptq", "compressed-tensors")
AWQ_SUPPORTED = "llmp runs AWQ version gemm, bits 4, zero_point true, group_size 32, 64 or 128"
GPTQ_SUPPORTED = (
    "llmp runs GPTQ bits 4 or 8, group_size 32, 64, 128 or -1, checkpoint_format gptq or gptq_v2, pack_dtype int32"
)
CT_SUPPORTED = (
    "llmp runs compressed-tensors int8 weights (num_bits 8, type int, strategy channel or tensor, format "
    "int-quantized, naive-quantized or pack-quantized), weight-only (W8A16) or with int8 activations (W8A8: "
    "symmetric, strategy token and dynamic, or strategy tensor and static)"
)
# compressed-tensors input_activations llmp applies: (strategy, dynamic) -> how the scale is had
CT_ACTIVATIONS = {("token", True): "token", ("tensor", False): "tensor"}
CT_FORMATS = ("int-quantized", "naive-quantized", "pack-quantized")
GROUP_SIZES = (32, 64, 128)
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # AutoAWQ's gemm pack: nibble i of a word holds column AWQ_ORDER[i]
AWQ_REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)  # column c of eight is nibble AWQ_REVERSE_ORDER[c]
BLOCK = 32  # weights per GGML block (Q4_0, Q5_0, Q8_0)


@dataclass(frozen=True)
class HFQuantization:
    """What the loader needs from a checkpoint's ``quantization_config``, checked."""

    method: str  # "awq", "gptq" or "compressed-tensors"
    bits: int
    group_size: int  # -1: one group over the whole input; 0: one scale per output channel (compressed-tensors)
    sym: bool = True
    desc_act: bool = False  # GPTQ act-order: a row's group is g_idx[row]
    zero_offset: int = 0  # GPTQ v1 stores each zero minus one
    packed: bool = False  # compressed-tensors pack-quantized: weight_packed int32
    activations: str | None = None  # compressed-tensors W8A8: int8 inputs, "token" (dynamic) or "tensor" (static)

    def describe(self) -> str:
        """The method and parameters, as the start-up line names them."""
        if self.method == "compressed-tensors":
            layout = "pack-quantized" if self.packed else "int8"
            scheme = {None: "W8A16", "token": "W8A8 (int8 inputs, dynamic per token)"}.get(
                self.activations, "W8A8 (int8 inputs, static per tensor)"
            )
            return f"compressed-tensors {scheme} ({layout}, {'symmetric' if self.sym else 'asymmetric'})"
        group = "one group" if self.group_size == -1 else f"group size {self.group_size}"
        extra = f", sym {str(self.sym).lower()}, desc_act {str(self.desc_act).lower()}" if self.method == "gptq" else ""
        return f"{self.method} {self.bits}-bit, {group}{extra}"


# a quantised layer's tensors that hold no weights of their own (scales, zero points, group indices)
_AUXILIARY = ("qzeros", "scales", "g_idx", "weight_scale", "weight_zero_point", "weight_shape", "input_scale")


def dequantized_parameter_count(model_dir: Path, quant: HFQuantization) -> int:
    """How many weights the checkpoint's safetensors files hold once dequantised, read from their headers:
    a packed int32 tensor (``qweight``, ``weight_packed``) holds ``32 / bits`` weights an element; scales,
    zero points and group indices none."""
    import struct

    count = 0
    for path in sorted(model_dir.glob("*.safetensors")):
        with open(path, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        for name, info in header.items():
            if name == "__metadata__" or name.rpartition(".")[2] in _AUXILIARY:
                continue
            numel = math.prod(info["shape"])
            packed = name.rpartition(".")[2] in ("qweight", "weight_packed") and info["dtype"] == "I32"
            count += numel * (32 // quant.bits) if packed else numel
    return count


def _refuse(method: str, parameter: str, value: Any, supported: str) -> ModelLoadError:
    return ModelLoadError(
        f"{method} quantization with {parameter} {value!r} is not supported (quantization_config in config.json): "
        f"{supported}"
    )


def parse_quantization_config(config: Any) -> HFQuantization:
    """The checked ``quantization_config`` of a config.json; ``ModelLoadError`` in one line naming the method,
    the parameter llmp does not run and what it runs."""
    if not isinstance(config, dict):
        raise ModelLoadError(f"quantization_config in config.json must be an object, got {config!r}")
    method = str(config.get("quant_method", "unnamed")).lower()
    if method == "awq":
        return _parse_awq(config)
    if method == "gptq":
        return _parse_gptq(config)
    if method == "compressed-tensors":
        return _parse_compressed_tensors(config)
    raise ModelLoadError(
        f"quantization method {method!r} (quantization_config in config.json) is not supported: llmp runs awq, gptq "
        "and compressed-tensors int8 checkpoints, and GGUF files"
    )


def _parse_awq(config: dict[str, Any]) -> HFQuantization:
    # AutoAWQ writes version "gemm" (older exports: "GEMM"); gemv, gemv_fast, marlin and exllama pack otherwise
    checks = (
        ("version", str(config.get("version", "gemm")).lower(), ("gemm",)),
        ("bits", config.get("bits", config.get("w_bit")), (4,)),
        ("zero_point", config.get("zero_point", True), (True,)),
        ("group_size", config.get("group_size", config.get("q_group_size")), GROUP_SIZES),
    )
    for name, value, allowed in checks:
        if value not in allowed:
            raise _refuse("awq", name, value, AWQ_SUPPORTED)
    return HFQuantization("awq", 4, int(config.get("group_size", config.get("q_group_size"))))


def _parse_gptq(config: dict[str, Any]) -> HFQuantization:
    checkpoint_format = config.get("checkpoint_format", "gptq")
    checks = (
        ("checkpoint_format", checkpoint_format, ("gptq", "gptq_v2")),
        ("bits", config.get("bits"), (4, 8)),
        ("group_size", config.get("group_size"), (*GROUP_SIZES, -1)),
        ("pack_dtype", config.get("pack_dtype", "int32"), ("int32",)),
        ("dynamic", config.get("dynamic") or None, (None,)),  # GPTQModel's per-module overrides
    )
    for name, value, allowed in checks:
        if value not in allowed:
            raise _refuse("gptq", name, value, GPTQ_SUPPORTED)
    return HFQuantization(
        "gptq",
        int(config["bits"]),
        int(config["group_size"]),
        sym=bool(config.get("sym", True)),
        desc_act=bool(config.get("desc_act", False)),
        zero_offset=1 if checkpoint_format == "gptq" else 0,
    )


def _parse_compressed_tensors(config: dict[str, Any]) -> HFQuantization:
    top_format = config.get("format")
    checks: list[tuple[str, Any, tuple]] = [
        ("quantization_status", config.get("quantization_status", "compressed"), ("compressed",)),
        ("sparsity_config", config.get("sparsity_config") or None, (None,)),
        ("transform_config", config.get("transform_config") or None, (None,)),
        ("kv_cache_scheme", config.get("kv_cache_scheme"), (None,)),
    ]
    groups = config.get("config_groups") or {}
    if not groups:
        checks.append(("config_groups", groups, ("a group of int8 weights",)))
    weights, inputs = [], []
    for scheme in groups.values():
        scheme = scheme or {}
        activations = scheme.get("input_activations") or {}
        inputs.append(None)
        if activations:  # W8A8: int8 inputs llmp applies, or one line naming what it does not
            key = (activations.get("strategy"), bool(activations.get("dynamic", False)))
            inputs[-1] = CT_ACTIVATIONS.get(key)
            described = (
                f"{activations.get('type')}{activations.get('num_bits')} {key[0]} {'dynamic' if key[1] else 'static'}"
            )
            checks += [
                ("input_activations", described, ("int8 token dynamic", "int8 tensor static")),
                ("input_activations.symmetric", activations.get("symmetric", True), (True,)),
                ("input_activations.group_size", activations.get("group_size"), (None,)),
            ]
        checks.append(("output_activations", scheme.get("output_activations"), (None,)))
        checks.append(("format", scheme.get("format") or top_format, CT_FORMATS))
        args = scheme.get("weights") or {}
        weights.append({k: args.get(k) for k in ("type", "num_bits", "strategy", "symmetric", "dynamic", "actorder")})
        checks += [
            ("weights.type", args.get("type"), ("int",)),
            ("weights.num_bits", args.get("num_bits"), (8,)),
            ("weights.strategy", args.get("strategy"), ("channel", "tensor")),
            ("weights.dynamic", args.get("dynamic", False), (False,)),
            ("weights.actorder", args.get("actorder"), (None,)),
        ]
    if any(w != weights[0] for w in weights) or any(i != inputs[0] for i in inputs):
        checks.append(("config_groups", "schemes differing between groups", ("one scheme",)))
    sym = bool(weights[0].get("symmetric", True)) if weights else True
    packed = top_format == "pack-quantized" or any((s or {}).get("format") == "pack-quantized" for s in groups.values())
    if packed and not sym:  # pack-quantized packs the zero points too, in a layout llmp does not read
        checks.append(("weights.symmetric", False, (True,)))
    for name, value, allowed in checks:
        if value not in allowed:
            raise _refuse("compressed-tensors", name, value, CT_SUPPORTED)
    return HFQuantization("compressed-tensors", 8, 0, sym=sym, packed=packed, activations=inputs[0] if inputs else None)


def checkpoint_quantization(model_dir: Path) -> dict[str, Any] | None:
    """The ``quantization_config`` of ``model_dir``'s config.json, or ``None`` (none, or no config.json)."""
    path = model_dir / "config.json"
    if not path.is_file():
        return None
    return json.loads(path.read_text()).get("quantization_config") or None


# -- the tensors of one layer -------------------------------------------------


def _parts(quant: HFQuantization) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The suffixes of a layer's tensors: those it needs, and those read and dropped (unused by the loader)."""
    if quant.method == "awq":
        return ("qweight", "qzeros", "scales"), ()
    if quant.method == "gptq" and quant.desc_act:
        return ("qweight", "qzeros", "scales", "g_idx"), ()
    if quant.method == "gptq":  # without act-order the groups are consecutive: row // group_size, not g_idx's word
        return ("qweight", "qzeros", "scales"), ("g_idx",)
    weight = "weight_packed" if quant.packed else "weight"
    needed = (weight, "weight_scale") if quant.sym else (weight, "weight_scale", "weight_zero_point")
    dropped = ("weight_shape",) + (("weight_zero_point",) if quant.sym else ())  # a symmetric zero point is 0
    if quant.activations == "tensor":
        needed += ("input_scale",)
    if quant.activations:
        dropped += ("input_zero_point",)  # symmetric inputs: 0
    return needed, dropped


def _unpack_columns(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """int32 ``[rows, words]`` -> ``[rows, words * 32 / bits]``: value ``j`` of a word in bits ``j * bits``."""
    import torch

    shifts = torch.arange(0, 32, bits, dtype=torch.int32)
    return ((packed.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)).reshape(packed.shape[0], -1)


def _unpack_rows(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """int32 ``[words, cols]`` -> ``[words * 32 / bits, cols]``: value ``j`` of a word is row ``word * n + j``."""
    import torch

    shifts = torch.arange(0, 32, bits, dtype=torch.int32).reshape(1, -1, 1)
    return ((packed.unsqueeze(1) >> shifts) & ((1 << bits) - 1)).reshape(-1, packed.shape[1])


def _awq_columns(values: torch.Tensor) -> torch.Tensor:
    """Unpacked AWQ columns back in output order (AutoAWQ's ``reverse_awq_order``)."""
    import torch

    order = torch.arange(values.shape[1]).reshape(-1, 8)[:, list(AWQ_REVERSE_ORDER)].reshape(-1)
    return values[:, order]


@dataclass
class _Integers:
    """A layer's integer weights ``q`` ``[in, out]``, zeros ``[groups, out]``, fp16-or-wider scales
    ``[groups, out]`` and each input row's group ``g`` ``[in]``: ``w[r, c] = (q[r, c] - zeros[g[r], c]) *
    scales[g[r], c]``."""

    q: torch.Tensor
    zeros: torch.Tensor
    scales: torch.Tensor
    g: torch.Tensor

    def dequantize(self) -> torch.Tensor:
        """The float32 ``[out, in]`` weight."""
        w = (self.q - self.zeros[self.g]).float().mul_(self.scales.float()[self.g])
        return w.t().contiguous()


def _packed_integers(quant: HFQuantization, parts: dict[str, torch.Tensor]) -> _Integers:
    import torch

    scales = parts["scales"]
    if quant.method == "awq":
        q = _awq_columns(_unpack_columns(parts["qweight"], 4))
        zeros = _awq_columns(_unpack_columns(parts["qzeros"], 4))
    else:
        q = _unpack_rows(parts["qweight"], quant.bits)
        zeros = _unpack_columns(parts["qzeros"], quant.bits) + quant.zero_offset
    q, zeros = q[:, : scales.shape[1]], zeros[:, : scales.shape[1]]
    rows = q.shape[0]
    groups = 1 if quant.group_size == -1 else -(-rows // quant.group_size)
    if scales.shape[0] != groups:  # the config's group size is not the one the tensors were packed with
        raise ValueError(
            f"{scales.shape[0]} groups of scales for {rows} input rows: group_size {quant.group_size} "
            f"of the quantization config needs {groups}"
        )
    if "g_idx" in parts:
        g = parts["g_idx"].long()
    elif quant.group_size == -1:
        g = torch.zeros(rows, dtype=torch.long)
    else:
        g = torch.arange(rows) // quant.group_size
    if g.shape != (rows,) or int(g.max()) >= scales.shape[0] or int(g.min()) < 0:
        raise ValueError(f"g_idx / group_size do not fit {rows} input rows and {scales.shape[0]} groups of scales")
    return _Integers(q, zeros, scales, g)


def _in_blocks(levels: torch.Tensor, d: torch.Tensor) -> Any:
    """``levels`` integers ``[out, in]`` and fp16 scales ``d`` ``[out, in / 32]`` (``w = d * level``, one scale per
    32-wide block) as GGML blocks of the narrowest format holding every level: ``Q4_0`` (a symmetric 4-bit
    checkpoint), ``Q5_0`` (4-bit with zero points: ``q - zero`` spans -15..15) or ``Q8_0``; exact in each.
    ``None`` where no format holds them."""
    from llmp.quantization import GGML_FORMATS, QuantizedWeight
    from llmp.quantization.ggml import LEVEL_RANGES, pack_levels

    low, high = int(levels.min()), int(levels.max())
    fmt = next((f for f, (lo, hi) in LEVEL_RANGES.items() if lo <= low and high <= hi), None)
    if fmt is None:
        return None
    out, rows = levels.shape
    blocks = pack_levels(levels.reshape(-1, BLOCK), d.reshape(-1), fmt)
    return QuantizedWeight(blocks.reshape(out, -1), GGML_FORMATS[fmt], rows)


def _integers_in_blocks(ints: _Integers) -> Any:
    """A GPTQ/AWQ weight as GGML blocks where that is exact: fp16 scales, and each 32-row run of input rows in
    one group; else ``None``. Act-order's shuffled groups are stored with their input rows sorted by group
    (``QuantizedWeight.input_order``): a group of a multiple of 32 rows then fills whole blocks."""
    import torch

    from llmp.quantization import QuantizedWeight

    rows, _ = ints.q.shape
    if ints.scales.dtype != torch.float16 or rows % BLOCK:
        return None
    natural = bool((ints.g[1:] >= ints.g[:-1]).all())
    order = None if natural else torch.sort(ints.g, stable=True).indices
    g = ints.g if order is None else ints.g[order]
    block_groups = g.reshape(-1, BLOCK)
    if not bool((block_groups == block_groups[:, :1]).all()):
        return None
    q = ints.q if order is None else ints.q[order]
    d = ints.scales[block_groups[:, 0]].t()  # [out, in / 32]
    weight = _in_blocks((q - ints.zeros[g]).t(), d)  # levels [out, in], inputs in stored order
    if weight is None:
        weight = _offset_blocks(q, ints.zeros, ints.scales, g, d)
    if weight is None or order is None:
        return weight
    return QuantizedWeight(weight.blocks, weight.format, weight.in_features, order, group_offsets=weight.group_offsets)


def _offset_blocks(q: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, g: torch.Tensor, d: torch.Tensor) -> Any:
    """An 8-bit asymmetric weight (levels ``q - zero`` spanning -255..255, more than ``Q8_0`` holds) as ``Q8_0``
    blocks of ``q - 128`` and ``group_offsets`` ``scale * (zero - 128)`` (exact: small integers times float16
    scales), where its groups are equal runs of the (stored) input rows; else ``None``."""
    import torch

    from llmp.quantization import QuantizedWeight

    rows, groups = q.shape[0], scales.shape[0]
    if rows % groups or not torch.equal(g, torch.arange(rows) // (rows // groups)) or int(q.min()) < 0:
        return None
    weight = _in_blocks((q - 128).t(), d)
    if weight is None:
        return None
    offsets = (scales.float() * (zeros - 128).float()).t().contiguous()  # [out, groups]
    return QuantizedWeight(weight.blocks, weight.format, rows, group_offsets=offsets)


def _compressed_tensors_weight(quant: HFQuantization, parts: dict[str, torch.Tensor], quantized: bool) -> Any:
    """The float32 weight, or (``quantized``) ``Q8_0`` blocks where exact: every ``q - zero_point`` an int8 and
    every scale a float16 value (a per-channel scale repeats in each of its row's blocks). A W8A8 layer's weight
    carries its :class:`~llmp.quantization.Int8Activations` (in ``F32`` rows where ``Q8_0`` is not exact)."""
    import dataclasses

    import torch

    from llmp.quantization import GGML_FORMATS, Int8Activations, QuantizedWeight

    weight = _compressed_tensors_values(quant, parts, quantized)
    if quant.activations is None:
        return weight
    if not quantized:
        raise ModelLoadError(
            "compressed-tensors W8A8 needs a model class that keeps quantised weights (its int8 inputs are "
            "applied by llmp's linear layers); this model's class loads dense weights only"
        )
    scale = None
    if quant.activations == "tensor":
        if parts["input_scale"].numel() != 1:
            raise ValueError(f"a static per-tensor input_scale has one value, not {parts['input_scale'].numel()}")
        scale = float(parts["input_scale"].float().reshape(()))
    activations = Int8Activations(scale)
    if isinstance(weight, QuantizedWeight):
        return dataclasses.replace(weight, activations=activations)
    rows = weight.float().contiguous()
    return QuantizedWeight(rows.view(torch.uint8), GGML_FORMATS["F32"], rows.shape[1], activations=activations)


def _compressed_tensors_values(quant: HFQuantization, parts: dict[str, torch.Tensor], quantized: bool) -> Any:
    """:func:`_compressed_tensors_weight`'s weight, without its activations."""
    import torch

    from llmp.quantization import QuantizedWeight

    if quant.packed:  # four int8 values per little-endian int32, each stored plus 128 (compressed-tensors' pack)
        packed = parts["weight_packed"]
        stored = packed.contiguous().view(torch.uint8).reshape(packed.shape[0], -1).int() - 128
    else:
        stored = parts["weight"].int()
    out, rows = stored.shape
    zero = parts["weight_zero_point"].int().reshape(-1, 1) if "weight_zero_point" in parts else None
    q = stored if zero is None else stored - zero
    scale = parts["weight_scale"].float()
    if quantized and rows % BLOCK == 0 and torch.equal(scale.half().float(), scale):
        d = scale.half().reshape(-1, 1).expand(out, rows // BLOCK).contiguous()
        blocks = _in_blocks(q, d)
        if blocks is not None:
            return blocks
        if zero is not None:  # q - zero spans -255..255: q in Q8_0 blocks, the zero points as one offset a row
            blocks = _in_blocks(stored, d)
            offsets = (scale.reshape(-1, 1) * zero.float()).expand(out, 1).contiguous()  # exact: int8 x fp16
            return QuantizedWeight(blocks.blocks, blocks.format, rows, group_offsets=offsets)
    return q.float().mul_(scale.reshape(-1, 1) if scale.numel() > 1 else scale.reshape(()))


def _is_part(quant: HFQuantization, suffix: str, tensor: torch.Tensor) -> bool:
    """Whether a tensor named ``<prefix>.<suffix>`` is a packed part (an unquantised layer's float ``weight``,
    AWQ's ``modules_to_not_convert`` or compressed-tensors' ``ignore``, is not)."""
    import torch

    needed, dropped = _parts(quant)
    if suffix == "weight" and quant.method == "compressed-tensors" and not quant.packed:
        return tensor.dtype == torch.int8
    return suffix in needed or suffix in dropped


def iter_hf_quantized(
    stream: Iterator[tuple[str, torch.Tensor]], config: Any, *, quantized: bool = False
) -> Iterator[tuple[str, Any]]:
    """``stream`` with each quantised layer's packed tensors replaced by ``<prefix>.weight``: a float32
    tensor, or (``quantized``, where exact) a :class:`~llmp.quantization.QuantizedWeight` of GGML blocks
    (``Q4_0``, ``Q5_0`` or ``Q8_0``). Other tensors pass as they are. One INFO line at the end: the method,
    how many matrices are kept in blocks of each format and how many dequantised."""
    import torch

    quant = parse_quantization_config(config)
    needed, _ = _parts(quant)
    pending: dict[str, dict[str, torch.Tensor]] = {}
    kept: Counter[str] = Counter()
    dense = 0
    for name, tensor in stream:
        prefix, _, suffix = name.rpartition(".")
        if not _is_part(quant, suffix, tensor):
            yield name, tensor
            continue
        if suffix not in needed:
            continue
        parts = pending.setdefault(prefix, {})
        parts[suffix] = tensor
        if len(parts) < len(needed):
            continue
        weight = _layer_weight(quant, pending.pop(prefix), prefix, quantized)
        if isinstance(weight, torch.Tensor):
            dense += 1
        else:
            kept[weight.format.name] += 1
        yield f"{prefix}.weight", weight
    if pending:
        prefix, parts = next(iter(pending.items()))
        missing = ", ".join(s for s in needed if s not in parts)
        raise ModelLoadError(f"{quant.method} checkpoint: layer {prefix} has no {missing} ({len(pending)} incomplete)")
    _log_load(quant, kept, dense)


def _layer_weight(quant: HFQuantization, parts: dict[str, torch.Tensor], prefix: str, quantized: bool) -> Any:
    try:
        if quant.method == "compressed-tensors":
            return _compressed_tensors_weight(quant, parts, quantized)
        ints = _packed_integers(quant, parts)
        blocks = _integers_in_blocks(ints) if quantized else None
        return blocks if blocks is not None else ints.dequantize()
    except (RuntimeError, ValueError, IndexError) as exc:  # shapes that do not fit the declared layout
        raise ModelLoadError(f"{quant.method} checkpoint: cannot unpack layer {prefix}: {exc}") from exc


def _log_load(quant: HFQuantization, kept: Counter[str], dense: int) -> None:
    from llmp.modeling.parallel import tp_rank

    if tp_rank() == 0:
        blocks = ", ".join(f"{n} in {fmt}" for fmt, n in sorted(kept.items())) or "none"
        log.info(
            "quantization_config: %s; matrices kept in blocks: %s; %d dequantised to float32 at load",
            quant.describe(),
            blocks,
            dense,
        )
