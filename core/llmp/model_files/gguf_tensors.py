"""A GGUF file's tensors, read straight from the memory-mapped file at every load.

Which checkpoint weight each GGUF tensor is, and how transformers' GGUF loader reorders or changes it
(llama.cpp's q/k permutation, Gemma's norms less one), is worked out once, when the file's config and
tokenizer are written (:func:`write_tensor_plan`), and kept beside them (:data:`TENSOR_PLAN`). A load
then needs neither transformers nor ``gguf``'s reader (which decodes the whole vocabulary first): it reads
the tensor table from the header and hands each tensor over, quantised matrices in their blocks.
Tensors the loader does more to (Qwen-MoE's experts, merged into one) are processed as transformers
processes them.
"""

from __future__ import annotations

import json
import mmap
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmp.api import ModelLoadError

# Architectures transformers' GGUF tables lack, read with those of one llama.cpp writes alike: a Gemma (1) file has
# Gemma 2's metadata keys and tensor names (less the soft-caps and sliding window) and its norms stored plus one
READ_AS = {"gemma": "gemma2"}

if TYPE_CHECKING:
    import torch

    from llmp.progress import Bar

TENSOR_PLAN = "gguf-tensors.json"  # in a converted directory: GGUF tensor name -> how it loads
_PROCESSED = "processed"  # a tensor transformers' processor does more to than reorder rows and add a constant


@dataclass(frozen=True)
class TensorInfo:
    """One entry of a GGUF file's tensor table."""

    name: str
    shape: tuple[int, ...]  # outermost first (numpy's order; GGUF stores the reverse)
    ggml_type: int
    offset: int  # of its bytes from the start of the file


def read_tensor_table(data: Any) -> list[TensorInfo]:
    """The tensor table of a GGUF file's bytes (a buffer: a memory map): the metadata is skipped, the
    alignment (``general.alignment``, 32 by default) read on the way."""
    view = memoryview(data)
    if bytes(view[:4]) != b"GGUF":
        raise ValueError("not a GGUF file")
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", view, 4)
    if version < 2:
        raise ValueError(f"GGUF version {version} is not read")
    position, alignment = 24, 32
    for _ in range(n_kv):
        key, position = _string_at(view, position)
        (kind,) = struct.unpack_from("<I", view, position)
        if key == "general.alignment":
            (alignment,) = struct.unpack_from("<I", view, position + 4)
        position = _skip_value(view, position + 4, kind)
    infos = []
    for _ in range(n_tensors):
        name, position = _string_at(view, position)
        (n_dims,) = struct.unpack_from("<I", view, position)
        dims = struct.unpack_from(f"<{n_dims}Q", view, position + 4)
        ggml_type, offset = struct.unpack_from("<IQ", view, position + 4 + 8 * n_dims)
        position += 4 + 8 * n_dims + 12
        infos.append(TensorInfo(name, tuple(int(d) for d in reversed(dims)), int(ggml_type), int(offset)))
    start = -(-position // alignment) * alignment
    return [TensorInfo(t.name, t.shape, t.ggml_type, start + t.offset) for t in infos]


_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9


def _string_at(view: memoryview, position: int) -> tuple[str, int]:
    (size,) = struct.unpack_from("<Q", view, position)
    end = position + 8 + size
    return bytes(view[position + 8 : end]).decode("utf-8", "replace"), end


def _skip_value(view: memoryview, position: int, kind: int) -> int:
    if kind in _SCALAR_SIZES:
        return position + _SCALAR_SIZES[kind]
    if kind == _STRING:
        return position + 8 + struct.unpack_from("<Q", view, position)[0]
    if kind == _ARRAY:
        item, count = struct.unpack_from("<IQ", view, position)
        position += 12
        if item in _SCALAR_SIZES:
            return position + count * _SCALAR_SIZES[item]
        for _ in range(count):
            position = _skip_value(view, position, item)
        return position
    raise ValueError(f"unknown GGUF value type {kind}")


# -- the plan: worked out once, with transformers ---------------------------------------------------


def write_tensor_plan(path: Path, out: Path, config: Any, architecture: str) -> None:
    """Work out how each tensor of the GGUF file ``path`` loads into ``config``'s model, as transformers'
    GGUF loader would load it, and write it to ``out`` / :data:`TENSOR_PLAN`: for each tensor its checkpoint
    name, its row order (when the loader reorders rows) and a constant the loader adds; ``null`` for one the
    model has no place for; ``"processed"`` for one the loader does more to. Found by giving the loader's
    tensor processor row numbers in place of the weights and reading back where it put them."""
    import numpy as np

    processor, model, hf_names = _transformers_loader(config, architecture)
    checkpoint_names = _checkpoint_names(model)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        table = read_tensor_table(data)
    plan: dict[str, Any] = {}
    for tensor in table:
        rows = tensor.shape[0]
        index = np.arange(rows, dtype=np.float64).reshape(rows, *([1] * (len(tensor.shape) - 1)))
        processed = processor.process(
            weights=index, name=tensor.name, tensor_key_mapping=hf_names, parsed_parameters={"tensors": {}}
        )
        if processed.name is None or len(tensor.shape) > 2:
            plan[tensor.name] = _PROCESSED
        elif processed.name not in hf_names:
            plan[tensor.name] = None  # no place in the model (a llama file's rope_freqs), as transformers leaves it
        else:
            plan[tensor.name] = _entry(hf_names[processed.name], index, processed.weights, checkpoint_names)
    (out / TENSOR_PLAN).write_text(json.dumps({"architecture": architecture, "tensors": plan}))


def _transformers_loader(config: Any, architecture: str) -> tuple[Any, Any, dict[str, str]]:
    """What transformers' GGUF loader reads a file of ``architecture`` with, for ``config``'s model: the tensor
    processor, the model (on the meta device: names without memory) and the GGUF name -> parameter name map."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor, get_gguf_hf_weights_map

    processor = TENSOR_PROCESSORS.get(READ_AS.get(architecture, architecture), TensorProcessor)(config=config.to_dict())
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    # GGUF names by the file's architecture: transformers goes by the model's, and a llama file it reads as
    # Mistral (one named "mistral") has no "mistral" names in gguf
    return processor, model, get_gguf_hf_weights_map(_TopLevelNames(model), processor, model_type=architecture)


class _TopLevelNames:
    """A causal LM as ``get_gguf_hf_weights_map`` reads it, without its submodules: the map of the whole model's
    parameter names is complete, and mapping each of its hundreds of submodules again (for models converted from
    a submodule, as Bloom) builds gguf's name table each time: seconds for a 30-layer model."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.config, self._state_dict = model.config, model.state_dict()

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self._state_dict

    def named_children(self) -> list[tuple[str, torch.nn.Module]]:
        return []


def _checkpoint_names(model: torch.nn.Module) -> set[str] | None:
    """The parameter names of ``model`` in memory that transformers' checkpoints use too: those its weight
    conversions leave alone (a MoE model's fused experts are renamed: those tensors are processed). None
    when the conversions cannot be reverted (every tensor is then processed)."""
    from transformers.core_model_loading import revert_weight_conversion

    state = model.state_dict()  # meta tensors of the real shapes: conversions that split them can run
    try:
        reverted = revert_weight_conversion(model, dict(state))
    except Exception:  # a conversion that needs real values
        return None
    return set(state) & set(reverted)


def _entry(name: str, index: Any, moved: Any, checkpoint_names: set[str] | None) -> Any:
    """The plan of one tensor: where the processor put row numbers ``index`` (``moved``) says how it reorders
    rows and what constant it adds; anything else is ``"processed"``."""
    import numpy as np

    if checkpoint_names is None or name not in checkpoint_names or moved.shape != index.shape:
        return _PROCESSED
    column = np.asarray(moved, dtype=np.float64).reshape(index.shape[0], -1)[:, 0]
    shift = float(np.round(column.min()))  # Gemma's norms: the weights less one
    order = column - shift
    if not np.array_equal(np.sort(order), index.reshape(-1)):
        return _PROCESSED
    rows = None if np.array_equal(order, index.reshape(-1)) else order.astype(np.int64).tolist()
    return {"name": name, "rows": rows, "add": shift}


# -- a load ---------------------------------------------------------------------------------------


def iter_gguf_weights(path: Path, model_dir: Path, bar: Bar, *, quantized: bool = True) -> Iterator[tuple[str, Any]]:
    """The GGUF file's tensors under their checkpoint names, as transformers' GGUF loader reads them, by the plan
    :func:`write_tensor_plan` wrote in ``model_dir``.

    With ``quantized``, a quantised matrix (``Q4_K``, ``Q8_0`` ...) comes as a
    :class:`llmp.quantization.QuantizedWeight` over the memory-mapped file (its rows reordered when the loader
    reorders them: a copy of that tensor only); the layers that compute from blocks keep it, the others
    dequantise it. Every other tensor is dequantised to float32 (bit for bit ``gguf``'s), one at a time.
    """
    import torch

    from llmp.quantization import QuantizedWeight, dequantize, format_of

    plan = json.loads((model_dir / TENSOR_PLAN).read_text())
    architecture, plan = plan["architecture"], plan["tensors"]
    with open(path, "rb") as f:
        # a private map: torch may view its pages without a copy (it refuses read-only memory quietly only
        # with a warning), and nothing writes to them
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    table = read_tensor_table(data)
    processed = []
    for tensor in table:
        entry = plan.get(tensor.name, _PROCESSED)
        if entry == _PROCESSED:
            processed.append(tensor)
            continue
        if entry is not None:
            try:
                fmt = format_of(tensor.ggml_type)
            except ValueError as exc:
                raise ModelLoadError(f"GGUF tensor {tensor.name} of {path}: {exc}") from None
            blocks = _blocks(data, tensor, fmt)
            rows = None if entry["rows"] is None else torch.tensor(entry["rows"])
            if quantized and fmt.block_size > 1 and len(tensor.shape) == 2 and not entry["add"]:
                weight = QuantizedWeight(blocks, fmt, tensor.shape[1])
                yield entry["name"], weight if rows is None else weight.take(rows)
            else:
                values = dequantize(blocks, fmt).reshape(tensor.shape)
                values = values if rows is None else values.index_select(0, rows)
                yield entry["name"], values + entry["add"] if entry["add"] else values
        bar.advance()
    if processed:
        yield from _processed_by_transformers(model_dir, architecture, processed, data, bar)


def _blocks(data: Any, tensor: TensorInfo, fmt: Any) -> torch.Tensor:
    """The tensor's bytes, uint8 ``[rows, row bytes]`` (``[row bytes]`` for a vector), over the map: no copy."""
    import torch

    row = tensor.shape[-1]
    if row % fmt.block_size:
        raise ModelLoadError(f"GGUF tensor {tensor.name} has rows of {row}, not whole {fmt.name} blocks")
    rows = 1
    for size in tensor.shape[:-1]:
        rows *= size
    row_bytes = row // fmt.block_size * fmt.type_size
    if tensor.offset + rows * row_bytes > len(data):
        raise ModelLoadError(f"GGUF tensor {tensor.name} runs past the end of the file: is it truncated?")
    flat = torch.frombuffer(data, dtype=torch.uint8, count=rows * row_bytes, offset=tensor.offset)
    return flat.view(*tensor.shape[:-1], row_bytes) if len(tensor.shape) > 1 else flat


def _processed_by_transformers(
    model_dir: Path, architecture: str, tensors: list[TensorInfo], data: Any, bar: Bar
) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors the plan leaves to transformers (Qwen-MoE's experts), processed and renamed as its GGUF
    loader does, dequantised."""
    import numpy as np
    import torch
    from transformers import AutoConfig
    from transformers.core_model_loading import revert_weight_conversion

    from llmp.quantization import dequantize, format_of

    processor, model, hf_names = _transformers_loader(AutoConfig.from_pretrained(model_dir), architecture)
    parsed: dict[str, dict[str, torch.Tensor]] = {"tensors": {}}  # a processor merging tensors puts them here
    for tensor in tensors:
        fmt = format_of(tensor.ggml_type)
        weights = dequantize(_blocks(data, tensor, fmt), fmt).reshape(tensor.shape).numpy()
        out = processor.process(
            weights=weights, name=tensor.name, tensor_key_mapping=hf_names, parsed_parameters=parsed
        )
        if out.name in hf_names:
            parsed["tensors"][hf_names[out.name]] = torch.from_numpy(np.require(out.weights, np.float32, "CW"))
        bar.advance()
    # transformers' names in memory -> the checkpoint's (a Qwen-MoE layer's stacked experts -> one matrix each)
    yield from revert_weight_conversion(model, parsed["tensors"]).items()
