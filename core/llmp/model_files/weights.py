"""A model's weights, read lazily: a directory's safetensors, or the GGUF file it was read from."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
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
    """``(name, tensor)`` for every tensor of every weight file, memory-mapped; for a GGUF model, its
    file's tensors (:func:`llmp.model_files.gguf.iter_gguf_weights`; with ``quantized``, for a model
    whose layers keep blocks, quantised matrices as :class:`llmp.quantization.QuantizedWeight`).

    The first tensor-parallel rank reports the loading: an INFO line with the size, a bar over the
    tensors (see :mod:`llmp.progress`), and the time it took once the last one is read."""
    from llmp.model_files.gguf import gguf_source, gguf_tensor_count
    from llmp.model_files.gguf_tensors import iter_gguf_weights
    from llmp.model_files.hf_quantized import checkpoint_quantization, iter_hf_quantized
    from llmp.modeling.parallel import tp_rank
    from llmp.progress import Bar, human_bytes, progress_bar

    source = gguf_source(model_dir)
    files = [source] if source is not None else weight_files(model_dir)
    if source is not None:
        count, read = (
            gguf_tensor_count(source),
            lambda bar: iter_gguf_weights(source, model_dir, bar, quantized=quantized),
        )
    else:
        count, read = _count_tensors(files), lambda bar: _read(files, bar)
        if (hf_quantization := checkpoint_quantization(model_dir)) is not None:  # AWQ, GPTQ, compressed-tensors
            read = lambda bar: iter_hf_quantized(_read(files, bar), hf_quantization, quantized=quantized)  # noqa: E731
    if tp_rank() != 0:
        yield from read(Bar())
        return
    started = time.perf_counter()
    size = sum(file.stat().st_size for file in files)
    log.info(
        "loading weights from %s (%d file(s), %s)", files[0] if source else model_dir, len(files), human_bytes(size)
    )
    with progress_bar("Loading weights", count, "tensors") as bar:
        yield from read(bar)
    log.info("weights loaded in %.1f s", time.perf_counter() - started)


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
