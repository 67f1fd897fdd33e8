"""A model's configuration without importing transformers' configuration classes on every start.

``AutoConfig.from_pretrained`` costs about 2 s of start-up on a small CPU:
transformers 5's configuration module imports ``torch.distributed.tensor`` and
sympy. Native models only read attributes, so they get a :class:`PlainConfig`:
every attribute of transformers' config object (the class defaults filled in),
dumped once per ``config.json`` and transformers version to llmp's cache and
read back as JSON afterwards. The transformers fallback gets the real object.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
from pathlib import Path
from typing import Any

from llmp.modeling.files import cache_dir


class PlainConfig:
    """The attributes of a transformers config (``to_dict()``), read as attributes.

    The config class's aliases (``attribute_map``: Mixtral's ``num_experts`` for
    ``num_local_experts``, say) read the same value. An attribute the config does
    not have raises ``AttributeError``, so ``getattr(config, name, default)``
    behaves as it does on transformers' object.
    """

    def __init__(self, values: dict[str, Any], aliases: dict[str, str] | None = None) -> None:
        self.__dict__.update(values)
        self._aliases = dict(aliases or {})

    def __getattr__(self, name: str) -> Any:  # only called for names not set on the object
        aliases = self.__dict__.get("_aliases", {})
        if name in aliases and aliases[name] in self.__dict__:
            return self.__dict__[aliases[name]]
        raise AttributeError(f"the model config has no attribute {name!r}")

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_aliases"}

    def __repr__(self) -> str:
        return f"PlainConfig({self.__dict__.get('model_type', '?')}, {len(self.__dict__)} attributes)"


def load_plain_config(model_dir: str | os.PathLike) -> PlainConfig:
    """The model's configuration as transformers reads it, from llmp's cache when it has it."""
    model_dir = Path(model_dir)
    cached = _cache_file(model_dir)
    if cached is not None:
        try:
            entry = json.loads(cached.read_text())
            return PlainConfig(entry["values"], entry["aliases"])
        except (OSError, ValueError, KeyError, TypeError):
            pass  # not cached yet, or a damaged entry: read it through transformers
    config = _transformers_config(model_dir)
    text = json.dumps({"values": config.to_dict(), "aliases": dict(getattr(config, "attribute_map", {}))}, default=str)
    if cached is not None:
        _write_atomically(cached, text)
    entry = json.loads(text)  # the same values a cache hit gives
    return PlainConfig(entry["values"], entry["aliases"])


def load_model_config(model_dir: str | os.PathLike, model_impl: str = "auto") -> tuple[Any, Any]:
    """``(model_spec, config)``: the model plugin that serves the directory and the config it gets.

    Native models get a :class:`PlainConfig`; the transformers fallback gets
    transformers' own config object, which it hands to transformers' model classes.
    """
    from llmp import registry
    from llmp.engine.model_runner import architectures

    config = load_plain_config(model_dir)
    spec = registry.select_model(architectures(config), model_impl)
    if spec.model_impl != "native":
        config = _transformers_config(Path(model_dir))
    return spec, config


def _transformers_config(model_dir: Path) -> Any:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(model_dir)


def _cache_file(model_dir: Path) -> Path | None:
    # keyed by config.json itself (path, size, mtime) and the transformers version that filled in the defaults
    try:
        stat = (model_dir / "config.json").stat()
        version = importlib.metadata.version("transformers")
    except (OSError, importlib.metadata.PackageNotFoundError):
        return None
    source = f"{(model_dir / 'config.json').resolve()}:{stat.st_size}:{stat.st_mtime_ns}:{version}"
    return cache_dir() / "configs" / f"{hashlib.sha256(source.encode()).hexdigest()[:24]}.json"


def _write_atomically(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.partial-{os.getpid()}")
        partial.write_text(text)
        os.replace(partial, path)
    except OSError:
        pass  # a read-only cache only costs the next start its two seconds
