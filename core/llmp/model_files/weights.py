"""A model directory's safetensors weights, read lazily."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from llmp.api import ModelLoadError


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


def iter_weights(model_dir: Path) -> Iterator[tuple[str, "torch.Tensor"]]:  # noqa: F821
    """``(name, tensor)`` for every tensor of every weight file, memory-mapped."""
    from safetensors import safe_open

    for file in weight_files(model_dir):
        try:
            with safe_open(file, framework="pt") as f:
                for name in f.keys():
                    yield name, f.get_tensor(name)
        except Exception as exc:  # safetensors' own error type is not importable by a stable name
            raise ModelLoadError(f"cannot read weight file {file}: {exc}") from exc
