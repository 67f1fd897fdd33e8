"""Command options read from their records: command line, then ``LLMP_*`` variables, then a YAML file.

A command's options are the :func:`llmp.options.option` fields of the records it
takes (``EngineConfig``, ``ServerOptions`` ...). An option's name is its field name
(``--max-num-seqs`` is ``max_num_seqs``) unless the field says otherwise, and its
value is taken from, in order of precedence:

1. the command line, when the option was given there;
2. the environment variable ``LLMP_<NAME>``, in any case (``LLMP_MAX_NUM_SEQS=8``; a repeatable
   option splits at commas: ``LLMP_API_KEY=a,b``);
3. the YAML file named by ``--config`` (or ``LLMP_CONFIG``), whose keys are option
   names with ``-`` or ``_`` (``max-num-seqs: 8``);
4. the field's default.

This module knows no CLI library: :mod:`llmp.cli.options` generates the commands
and turns an :class:`OptionError` into a usage error.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import types
import typing
from collections.abc import Mapping
from dataclasses import MISSING, dataclass
from pathlib import Path
from typing import Annotated, Any, Union

from llmp.options import EngineConfig, FrontendOptions, ServerOptions


class OptionError(ValueError):
    """A value from the command line, the environment or the YAML file that cannot be used."""

    def __init__(self, message: str, param_hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param_hint = param_hint


@dataclass(frozen=True)
class Select:
    """Which of a record's options a command takes, as ``Annotated[Record, Select(...)]``.

    ``only``: these fields alone; ``omit``: all but these; ``help``: the help text of
    a field where this command's use of it differs.
    """

    only: tuple[str, ...] | None = None
    omit: tuple[str, ...] = ()
    help: Mapping[str, str] = dataclasses.field(default_factory=dict)


@dataclass(frozen=True)
class OptionSpec:
    """One option of a command: its public name, and the record field it fills."""

    name: str  # the flag without "--" and with "_", the LLMP_* variable's tail, the YAML key
    record: str  # the command's parameter whose record holds the field
    field: str
    type: Any  # the field's type
    default: Any  # in the option's units (scaled); MISSING: required
    help: str
    flag: str | None = None
    short: str | None = None
    argument: bool = False
    scale: float | None = None  # the option's unit, in units of the field
    ge: float | None = None
    gt: float | None = None
    metavar: str | None = None

    @property
    def env(self) -> str:
        return "LLMP_" + self.name.upper()

    @property
    def value_type(self) -> Any:
        """The option's type without ``None``: ``float`` for a scaled option."""
        if self.scale is not None:
            return float
        args = typing.get_args(self.type)
        if _is_union(self.type):
            rest = [a for a in args if a is not type(None)]
            return rest[0] if len(rest) == 1 else Union[tuple(rest)]  # noqa: UP007
        return self.type

    @property
    def optional(self) -> bool:
        return _is_union(self.type) and type(None) in typing.get_args(self.type)

    @property
    def repeatable(self) -> bool:
        return typing.get_origin(self.value_type) in (tuple, list)


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (Union, types.UnionType)


def record_options(param: str, record: Any) -> list[OptionSpec]:
    """The options of ``record`` (a dataclass, or ``Annotated[dataclass, Select(...)]``) for parameter ``param``."""
    cls, select = record, Select()
    if typing.get_origin(record) is Annotated:
        cls, *extras = typing.get_args(record)
        select = next((e for e in extras if isinstance(e, Select)), select)
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{param}: {cls!r} is not an option record (a dataclass)")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = (set(select.only or ()) | set(select.omit) | set(select.help)) - known
    if unknown:
        raise TypeError(f"{param}: {cls.__name__} has no field {', '.join(sorted(unknown))}")
    specs = []
    for f in dataclasses.fields(cls):
        meta = f.metadata
        if not meta.get("help") or (select.only is not None and f.name not in select.only) or f.name in select.omit:
            continue
        default = f.default
        if default is MISSING and f.default_factory is not MISSING:
            default = f.default_factory()
        scale = meta.get("scale")
        if scale is not None and default is not MISSING:
            default = default / scale
        specs.append(
            OptionSpec(
                name=meta.get("name") or f.name,
                record=param,
                field=f.name,
                type=hints[f.name],
                default=default,
                help=select.help.get(f.name, meta["help"]),
                flag=meta.get("flag"),
                short=meta.get("short"),
                argument=meta.get("argument", False),
                scale=scale,
                ge=meta.get("ge"),
                gt=meta.get("gt"),
                metavar=meta.get("metavar"),
            )
        )
    return specs


def command_options(records: Mapping[str, Any]) -> list[OptionSpec]:
    """The options of every record a command takes, keyed by its parameter name; names must not repeat."""
    specs = [spec for param, record in records.items() for spec in record_options(param, record)]
    seen: dict[str, str] = {}
    for spec in specs:
        if spec.name in seen:
            raise TypeError(f"option {spec.name!r} is declared by both {seen[spec.name]} and {spec.record}")
        seen[spec.name] = spec.record
    return specs


def load_records(
    records: Mapping[str, Any],
    given: Mapping[str, Any],
    config_file: Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Each record of ``records`` built from its options' values.

    ``given`` holds the options given on the command line (by option name); the
    environment (``os.environ`` by default) and ``config_file`` fill in the rest.
    Raises :class:`OptionError` for a value that cannot be used.
    """
    specs = command_options(records)
    environ = os.environ if environ is None else environ
    variables = {key.upper(): value for key, value in environ.items() if key.upper().startswith("LLMP_")}
    values = resolve(specs, given, config_file, variables)
    built = {}
    for param, record in records.items():
        cls = typing.get_args(record)[0] if typing.get_origin(record) is Annotated else record
        fields = {s.field: values[s.name] for s in specs if s.record == param and s.name in values}
        try:
            built[param] = cls(**fields)
        except (ValueError, TypeError) as exc:
            raise OptionError(f"invalid settings: {exc}") from None
    return built


def resolve(
    specs: list[OptionSpec], given: Mapping[str, Any], config_file: Path | None, environ: Mapping[str, str]
) -> dict[str, Any]:
    """The field value of every option set by a source, by option name; the others are left out.

    ``environ`` holds the ``LLMP_*`` variables with upper-case names.
    """
    from_file = read_yaml(config_file, {s.name for s in specs}) if config_file else {}
    values, problems = {}, []
    for spec in specs:
        if spec.name in given:
            raw = given[spec.name]
        elif spec.env in environ:
            raw = environ[spec.env]
        elif spec.name in from_file:
            raw = from_file[spec.name]
        else:
            continue
        try:
            values[spec.name] = _convert(spec, raw)
        except ValueError as exc:
            problems.append(f"{spec.name}: {exc}")
    if problems:
        raise OptionError(f"invalid settings: {'; '.join(problems)}")
    return values


def _convert(spec: OptionSpec, raw: Any) -> Any:
    """``raw`` checked against the option's type and bounds, in the field's units."""
    from pydantic import Field, TypeAdapter, ValidationError

    if raw is None and spec.optional:
        return None
    if spec.repeatable and isinstance(raw, str):
        raw = [part.strip() for part in raw.split(",") if part.strip()]
    try:
        value = TypeAdapter(Annotated[spec.value_type, Field(ge=spec.ge, gt=spec.gt)]).validate_python(raw)
    except ValidationError as exc:
        raise ValueError("; ".join(err["msg"] for err in exc.errors())) from None
    return int(value * spec.scale) if spec.scale is not None else value


def read_yaml(path: Path, names: set[str]) -> dict[str, Any]:
    """The YAML mapping in ``path`` by option name, for a command taking ``names``; see below for other keys."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise OptionError(f"cannot read config file {path}: {exc.strerror}", "--config") from exc
    except yaml.YAMLError as exc:
        raise OptionError(f"config file {path} is not valid YAML: {exc}", "--config") from exc
    if not isinstance(data, dict):
        raise OptionError(f"config file {path} must hold a mapping of option: value", "--config")
    values = {str(key).replace("-", "_"): value for key, value in data.items()}
    unknown = sorted(set(values) - names - {"config"})
    # one file may serve several commands (LLMP_CONFIG): options of llmp's shared records that this
    # command does not take are passed over with a note; any other key is a typo, refused as vLLM does
    shared = {f.name for record in (EngineConfig, ServerOptions, FrontendOptions) for f in dataclasses.fields(record)}
    typos = [key for key in unknown if key not in shared]
    if typos:
        from difflib import get_close_matches

        hints = [
            f"{key} (did you mean {close[0]}?)" if (close := get_close_matches(key, names, 1)) else key for key in typos
        ]
        raise OptionError(f"config file {path} has unknown options: {', '.join(hints)}", "--config")
    if unknown:
        print(f"llmp: ignoring options not used by this command in {path}: {', '.join(unknown)}", file=sys.stderr)
    return {key: value for key, value in values.items() if key in names}
