"""A model's weights, read lazily: a directory's safetensors, or the GGUF file it was read from."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from llmp.api import ModelLoadError

if TYPE_CHECKING:
    from llmp.progress import Bar

log = logging.getLogger("llmp.engine")


def weight_files(model_dir: Path) -> list[Path]:
    """The safetensors files of a directory, following a sharded index when there is one."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError) as exc:
            raise ModelLoadError(f"{index} is not a valid safetensors index: {exc}") from exc
        files = [model_dir / shard for shard in shards]
    else:
        files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{model_dir} holds no *.safetensors weights")
    for file in files:
        if not file.is_file():
            raise ModelLoadError(f"weight file {file} named in {index.name} is missing")
    return files


def iter_weights(model_dir: Path, *, quantized: bool = False) -> Iterator[tuple[str, "torch.Tensor | QuantizedWeight"]]:  # noqa: F821
    """``(name, tensor)`` for every tensor of every weight file, memory-mapped: a directory's safetensors
    (a quantised checkpoint's layers unpacked by :mod:`llmp.model_files.hf_quantized`), or the GGUF file a
    GGUF model's directory names (:func:`llmp.model_files.gguf_tensors.iter_gguf_weights`). With
    ``quantized`` (a model whose layers keep blocks), matrices exactly held in GGML blocks come as
    :class:`llmp.quantization.QuantizedWeight`.

    The first tensor-parallel rank reports the loading: an INFO line with the size, a bar over the
    tensors (see :mod:`llmp.progress`), and the time it took once the last one is read."""
    from llmp.modeling.parallel import tp_rank
    from llmp.progress import Bar, human_bytes, progress_bar

    files, count, read = _weights_reader(model_dir, quantized)
    if tp_rank() != 0:
        yield from read(Bar())
        return
    started = time.perf_counter()
    size = sum(file.stat().st_size for file in files)
    where = files[0] if files[0].suffix == ".gguf" else model_dir
    log.info("loading weights from %s (%d file(s), %s)", where, len(files), human_bytes(size))
    with progress_bar("Loading weights", count, "tensors") as bar:
        yield from read(bar)
    log.info("weights loaded in %.1f s", time.perf_counter() - started)


def _weights_reader(model_dir: Path, quantized: bool) -> tuple[list[Path], int, Callable[[Bar], Iterator]]:
    """The files the weights come from, how many tensors they hold, and the reader of their tensors."""
    from llmp.model_files.gguf import gguf_source, gguf_tensor_count
    from llmp.model_files.gguf_tensors import iter_gguf_weights
    from llmp.model_files.hf_quantized import checkpoint_quantization, iter_hf_quantized

    if (source := gguf_source(model_dir)) is not None:
        return [source], gguf_tensor_count(source), partial(iter_gguf_weights, source, model_dir, quantized=quantized)
    files = weight_files(model_dir)
    if (quantization := checkpoint_quantization(model_dir)) is not None:  # AWQ, GPTQ, compressed-tensors

        def unpacked(bar: Bar) -> Iterator:
            return iter_hf_quantized(_read(files, bar), quantization, quantized=quantized)

        return files, _count_tensors(files), unpacked
    return files, _count_tensors(files), partial(_read, files)


def _read(files: list[Path], bar: Bar) -> Iterator[tuple[str, "torch.Tensor"]]:  # noqa: F821
    from safetensors import safe_open

    for file in files:
        try:
            with safe_open(file, framework="pt") as f:
                for name in f.keys():
                    yield name, f.get_tensor(name)
                    bar.advance()
        except Exception as exc:  # safetensors' own error type is not importable by a stable name
            raise ModelLoadError(f"cannot read weight file {file}: {exc}") from exc


def _count_tensors(files: list[Path]) -> int:
    """How many tensors the files hold (their headers only)."""
    from safetensors import safe_open

    total = 0
    for file in files:
        try:
            with safe_open(file, framework="pt") as f:
                total += len(f.keys())
        except Exception as exc:
            raise ModelLoadError(f"cannot read weight file {file}: {exc}") from exc
    return total
