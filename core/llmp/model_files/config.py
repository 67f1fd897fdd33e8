"""A model's configuration without importing transformers' configuration classes on every start.

``AutoConfig.from_pretrained`` costs about 2 s of start-up on a small CPU:
transformers 5's configuration module imports ``torch.distributed.tensor`` and
sympy. Native models only read attributes, so they get a :class:`PlainConfig`:
every attribute of transformers' config object (the class defaults filled in),
dumped once per ``config.json`` and transformers version to llmp's cache and
read back as JSON afterwards. The transformers fallback gets the real object
(:func:`transformers_config`).
"""

from __future__ import annotations

import copy
import hashlib
import importlib.metadata
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from llmp.api import PoolingConfig
from llmp.model_files import cache_dir
from llmp.options import GENERATION_DEFAULTS


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
    config = transformers_config(model_dir)
    text = json.dumps({"values": config.to_dict(), "aliases": dict(getattr(config, "attribute_map", {}))}, default=str)
    if cached is not None:
        _write_atomically(cached, text)
    entry = json.loads(text)  # the same values a cache hit gives
    return PlainConfig(entry["values"], entry["aliases"])


def transformers_config(model_dir: str | os.PathLike, overrides: Mapping[str, Any] | None = None) -> Any:
    """transformers' own config object (what the transformers fallback hands its model classes), with
    ``overrides`` (``ResolvedModel.hf_overrides``) applied as :func:`with_overrides` applies them."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir)
    _override_object(config, overrides or {})
    return config


def with_overrides(config: PlainConfig, overrides: Mapping[str, Any] | None) -> PlainConfig:
    """``config`` with ``overrides`` (``EngineConfig.hf_overrides``) replacing its values, as vLLM's
    ``hf_overrides``: a value replaces the attribute (an alias sets its target), except that a dict
    given for a nested config (``text_config``) updates that config key by key."""
    if not overrides:
        return config
    values = copy.deepcopy(config.to_dict())
    aliases = config.__dict__.get("_aliases", {})
    _override_dict(values, {aliases.get(key, key): value for key, value in overrides.items()})
    return PlainConfig(values, aliases)


def _override_dict(values: dict[str, Any], overrides: Mapping[str, Any]) -> None:
    for key, value in overrides.items():
        nested = values.get(key)
        if isinstance(value, Mapping) and isinstance(nested, dict) and "model_type" in nested:  # a sub-config
            _override_dict(nested, value)
        else:
            values[key] = copy.deepcopy(value)


def _override_object(config: Any, overrides: Mapping[str, Any]) -> None:
    from transformers import PretrainedConfig

    for key, value in overrides.items():
        nested = getattr(config, key, None)
        if isinstance(value, Mapping) and isinstance(nested, PretrainedConfig):
            _override_object(nested, value)
        else:
            setattr(config, key, copy.deepcopy(value))


def architectures(config: Any) -> list[str]:
    """The config's architectures, or the causal LM class transformers maps its model_type to."""
    names = list(getattr(config, "architectures", None) or [])
    if not names:
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        fallback = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(getattr(config, "model_type", ""))
        names = [fallback] if isinstance(fallback, str) else []
    return names


def sentence_transformers_pooling(model_dir: Path, default: PoolingConfig) -> PoolingConfig:
    """The pooling that ``modules.json`` and its pooling module's config set; ``default`` without them.

    As in sentence-transformers, a directory with ``modules.json`` normalizes only when it lists a
    ``Normalize`` module."""
    try:
        modules = json.loads((model_dir / "modules.json").read_text())
    except OSError:
        return default
    pooling_type, normalize = default.pooling_type, False
    for module in modules:
        kind = module.get("type", "")
        if kind.endswith("Pooling"):
            settings = json.loads((model_dir / module["path"] / "config.json").read_text())
            if settings.get("pooling_mode_mean_tokens"):
                pooling_type = "mean"
            elif settings.get("pooling_mode_cls_token"):
                pooling_type = "cls"
            elif settings.get("pooling_mode_lasttoken"):
                pooling_type = "last"
        elif kind.endswith("Normalize"):
            normalize = True
    return PoolingConfig(pooling_type, normalize)


def has_sentence_transformers_config(model_dir: Path) -> bool:
    """Whether the directory is a sentence-transformers model (its ``modules.json`` has a pooling module)."""
    try:
        modules = json.loads((model_dir / "modules.json").read_text())
    except (OSError, ValueError):
        return False
    return any(str(m.get("type", "")).endswith("Pooling") for m in modules if isinstance(m, dict))


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


# the sampling fields a generation_config.json may set, as vLLM reads them (max_new_tokens: max_tokens)
def generation_defaults(
    model_dir: str | None, source: str, overrides: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Sampling defaults from the model's ``generation_config.json`` (``--generation-config auto``;
    ``LLM.get_default_sampling_params``), then ``overrides`` over them (vLLM's
    ``override_generation_config``, which applies with ``source`` ``"none"`` too)."""
    config: dict[str, Any] = {}
    if source == "auto" and model_dir:
        try:
            with open(f"{model_dir}/generation_config.json") as f:
                config = json.load(f)
        except (OSError, ValueError):
            config = {}
    found = {k: config[k] for k in GENERATION_DEFAULTS if isinstance(config.get(k), int | float)}
    return {**found, **(overrides or {})}
