"""Command settings: command line, then ``LLMP_*`` variables, then a YAML file.

Each command keeps its options in a ``CommandSettings`` subclass whose field
names are the option names (``--max-num-seqs`` is ``max_num_seqs``). A value
is taken from, in order of precedence:

1. the command line, when the option was given there;
2. the environment variable ``LLMP_<FIELD>`` (``LLMP_MAX_NUM_SEQS=8``);
3. the YAML file named by ``--config`` (or ``LLMP_CONFIG``), whose keys are
   option names with ``-`` or ``_`` (``max-num-seqs: 8``);
4. the field's default.
"""

from __future__ import annotations

import contextvars
import sys
from pathlib import Path
from typing import Any, TypeVar

import typer
from pydantic import ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

_config_file: contextvars.ContextVar[Path | None] = contextvars.ContextVar("llmp_config_file", default=None)


class YamlFileSource(PydanticBaseSettingsSource):
    """Settings from a YAML mapping; keys may use ``-`` or ``_``."""

    def __init__(self, settings_cls: type[BaseSettings], path: Path | None) -> None:
        super().__init__(settings_cls)
        self.values = _read_yaml(path, settings_cls) if path else {}

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self.values.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self.values)


def _read_yaml(path: Path, settings_cls: type[BaseSettings]) -> dict[str, Any]:
    import yaml

    try:
        data = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise typer.BadParameter(f"cannot read config file {path}: {exc.strerror}", param_hint="--config") from exc
    except yaml.YAMLError as exc:
        raise typer.BadParameter(f"config file {path} is not valid YAML: {exc}", param_hint="--config") from exc
    if not isinstance(data, dict):
        raise typer.BadParameter(f"config file {path} must hold a mapping of option: value", param_hint="--config")
    values = {str(key).replace("-", "_"): value for key, value in data.items()}
    unknown = sorted(set(values) - set(settings_cls.model_fields) - {"config"})
    if unknown:
        print(f"llmp: ignoring options not used by this command in {path}: {', '.join(unknown)}", file=sys.stderr)
    return {k: v for k, v in values.items() if k in settings_cls.model_fields}


class CommandSettings(BaseSettings):
    """Base class of every command's settings (see the module docstring)."""

    model_config = SettingsConfigDict(env_prefix="LLMP_", extra="ignore", protected_namespaces=())

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, env_settings, YamlFileSource(settings_cls, _config_file.get())


S = TypeVar("S", bound=CommandSettings)

_EXPLICIT = {"COMMANDLINE", "PROMPT"}  # ParameterSource names; the enum itself is not public in typer


def _source_name(ctx: typer.Context, name: str) -> str:
    source = ctx.get_parameter_source(name)
    return source.name if source is not None else ""


def load_settings(settings_cls: type[S], ctx: typer.Context) -> S:
    """Build ``settings_cls`` for the running command from all three sources.

    Only options actually given on the command line override the environment
    and the file; an option left at its default does not.
    """
    explicit = {
        name: value for name, value in ctx.params.items() if name != "config" and _source_name(ctx, name) in _EXPLICIT
    }
    config = ctx.params.get("config")
    token = _config_file.set(Path(config) if config else None)
    try:
        return settings_cls(**explicit)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in err['loc']) or 'value'}: {err['msg']}" for err in exc.errors())
        raise typer.BadParameter(f"invalid settings: {problems}", ctx=ctx) from None
    finally:
        _config_file.reset(token)
