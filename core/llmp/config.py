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
import json
import math
import os
import sys
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass
from difflib import get_close_matches
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from llmp.options import EngineConfig, FrontendOptions, ServerOptions, alternatives, bounds_problem


class OptionError(ValueError):
    """A value from the command line, the environment or the YAML file that cannot be used;
    the message names the option as the user gave it (``--max-model-len``, ``LLMP_PORT``, a YAML key)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


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
    bounds: Mapping[str, float] = dataclasses.field(default_factory=dict)  # ge, gt, le, lt; in the option's units
    component: str | None = None  # the registry kind its value names
    check: Callable[[Any], str | None] | None = None  # a rule beyond bounds and choices
    panel: str | None = None
    metavar: str | None = None

    @property
    def env(self) -> str:
        return "LLMP_" + self.name.upper()

    @property
    def flag_name(self) -> str:
        """How the command line names it: ``--max-model-len`` (``MODEL`` for an argument)."""
        if self.argument:
            return self.metavar or self.name.upper()
        return (self.flag or "--" + self.name.replace("_", "-")).split("/")[0]

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
    def choices(self) -> tuple[Any, ...] | None:
        """The values of a closed set (a ``Literal`` type), else ``None``."""
        return typing.get_args(self.value_type) if typing.get_origin(self.value_type) is Literal else None

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
        if scale is not None and default not in (MISSING, None):
            default = default / scale
        specs.append(
            OptionSpec(
                name=meta.get("name") or _flag_option_name(meta.get("flag")) or f.name,
                record=param,
                field=f.name,
                type=hints[f.name],
                default=default,
                help=select.help.get(f.name, meta["help"]),
                flag=meta.get("flag"),
                short=meta.get("short"),
                argument=meta.get("argument", False),
                scale=scale,
                bounds={k: meta[k] for k in ("ge", "gt", "le", "lt") if meta.get(k) is not None},
                component=meta.get("component"),
                check=meta.get("check"),
                panel=meta.get("panel"),
                metavar=meta.get("metavar"),
            )
        )
    return specs


def _flag_option_name(flag: str | None) -> str | None:
    """The option name a declared flag gives (``--json/--no-json``: ``json``): ``LLMP_*`` and the
    YAML key follow the flag, not the field behind it."""
    return flag.split("/")[0].removeprefix("--").replace("-", "_") if flag else None


def command_options(records: Mapping[str, Any]) -> list[OptionSpec]:
    """The options of every record a command takes, keyed by its parameter name; names must not repeat."""
    specs = [spec for param, record in records.items() for spec in record_options(param, record)]
    seen: dict[str, str] = {}
    for spec in specs:
        if spec.name in seen:
            raise TypeError(f"option {spec.name!r} is declared by both {seen[spec.name]} and {spec.record}")
        seen[spec.name] = spec.record
    return specs


Check = Callable[[list["OptionSpec"], Mapping[str, "Setting"]], list[str]]


def load_records(
    records: Mapping[str, Any],
    given: Mapping[str, Any],
    config_file: Path | None = None,
    environ: Mapping[str, str] | None = None,
    check: Check | None = None,
) -> dict[str, Any]:
    """Each record of ``records`` built from its options' values.

    ``given`` holds the options given on the command line (by option name); the
    environment (``os.environ`` by default) and ``config_file`` fill in the rest.
    Every value is checked against its option's declaration (type, bounds, choices)
    before any record is built, then by ``check``, which returns what else is wrong
    (the commands check the plugins that options name: :mod:`llmp.cli.option_checks`).
    An :class:`OptionError` names each bad option as its source does.
    """
    specs = command_options(records)
    environ = os.environ if environ is None else environ
    variables = {key.upper(): value for key, value in environ.items() if key.upper().startswith("LLMP_")}
    values = resolve(specs, given, config_file, variables)
    problems = check(specs, values) if check is not None else []
    if problems:
        raise OptionError("; ".join(problems))
    built = {}
    for param, record in records.items():
        cls = typing.get_args(record)[0] if typing.get_origin(record) is Annotated else record
        fields = {s.field: values[s.name].value for s in specs if s.record == param and s.name in values}
        try:
            built[param] = cls(**fields)
        except (ValueError, TypeError) as exc:  # a rule of the record's own, beyond its options' declarations
            raise OptionError(str(exc)) from None
    return built


@dataclass(frozen=True)
class Setting:
    """An option's value, in the field's units, and where it was set (for messages)."""

    value: Any
    source: str  # "--max-model-len", "LLMP_MAX_MODEL_LEN", "max-model-len in llmp.yaml"
    # the setting as the user wrote it, value included: "--max-model-len 8", "LLMP_MAX_MODEL_LEN=8",
    # "max-model-len: 8 in llmp.yaml"
    written: str = ""

    @staticmethod
    def default(spec: OptionSpec) -> Setting:
        """An option set by no source: its default, named by its flag."""
        return Setting(spec.default, spec.flag_name, f"{spec.flag_name} {spec.default} (the default)")


def resolve(
    specs: list[OptionSpec], given: Mapping[str, Any], config_file: Path | None, environ: Mapping[str, str]
) -> dict[str, Setting]:
    """The checked value of every option set by a source, by option name; the others are left out.

    ``environ`` holds the ``LLMP_*`` variables with upper-case names. Raises
    :class:`OptionError` listing every problem, each naming its option as set.
    """
    from_file = read_yaml(config_file, {s.name for s in specs}) if config_file else {}
    values, problems = {}, []
    for spec in specs:
        if spec.name in given:
            raw, source = given[spec.name], spec.flag_name
            written = f"{source} {_written(raw)}"
        elif spec.env in environ:
            raw, source = environ[spec.env], spec.env
            written = f"{source}={raw}"
        elif spec.name in from_file:
            key, raw = from_file[spec.name]
            source = f"{key} in {config_file}"
            written = f"{key}: {_written(raw)} in {config_file}"
        else:
            continue
        try:
            values[spec.name] = Setting(convert(spec, raw), source, written)
        except ValueError as exc:
            problems.append(f"{source} {exc}")
    if problems:
        raise OptionError("; ".join(problems))
    return values


def _written(raw: Any) -> str:
    if isinstance(raw, list | tuple):
        return " ".join(map(str, raw))
    return str(raw).lower() if isinstance(raw, bool) else str(raw)


def convert(spec: OptionSpec, raw: Any) -> Any:
    """``raw`` (text from the command line or the environment, or a YAML value) as the option's
    value in the field's units; ``ValueError("must be ..., got ...")`` when it is not one.

    Text is taken without surrounding blanks, whatever its type (``--port ' 8000'`` is 8000,
    ``--api-key ' '`` is empty); a comma-separated ``LLMP_*`` value of a repeatable option gives
    its items."""
    if raw is None and spec.optional:
        return None
    if spec.repeatable:
        items = raw.split(",") if isinstance(raw, str) else raw  # LLMP_API_KEY= is an empty key, not none
        if not isinstance(items, list | tuple):
            raise ValueError(f"must be a list, got {raw!r}")
        return tuple(_checked(spec, _scalar(spec, item)) for item in items)
    value = _checked(spec, _scalar(spec, raw))
    if isinstance(value, float) and math.isinf(value) and not _infinite_default(spec):
        raise ValueError(f"must be a finite number, got {_shown(raw)}")  # JSON, timers and sampling have no inf
    if spec.choices is None:
        problem = bounds_problem(value, spec.bounds)
        if problem:
            raise ValueError(f"{problem}, got {value:g}" if isinstance(value, float) else f"{problem}, got {value}")
    return int(value * spec.scale) if spec.scale is not None else value


def _infinite_default(spec: OptionSpec) -> bool:
    """An option whose default is infinity (``--request-rate``: all at once) takes ``inf``."""
    return isinstance(spec.default, float) and math.isinf(spec.default)


def _checked(spec: OptionSpec, value: Any) -> Any:
    problem = spec.check(value) if spec.check is not None else None
    if problem:
        raise ValueError(problem)
    return value


def _scalar(spec: OptionSpec, raw: Any) -> Any:
    kind = typing.get_args(spec.value_type)[0] if spec.repeatable else spec.value_type
    text = str(raw).strip()
    if spec.choices is not None:
        for choice in spec.choices:
            if text == str(choice):
                return choice
        words = [c for c in spec.choices if isinstance(c, str)]  # a number near another is no typo
        close = get_close_matches(text, words, 1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        shown = repr(text) if words else text
        raise ValueError(f"must be {alternatives(spec.choices)}, got {shown}{hint}")
    if kind is bool:
        if isinstance(raw, bool):
            return raw
        if text.lower() in _TRUE | _FALSE:
            return text.lower() in _TRUE
        raise ValueError(f"must be true or false, got {_shown(raw)}")
    if kind is int:
        if isinstance(raw, bool) or isinstance(raw, float) or not isinstance(raw, int | str):
            raise ValueError(f"must be an integer, got {_shown(raw)}")
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"must be an integer, got {_shown(raw)}") from None
    if kind is float:
        try:
            value = float(text) if not isinstance(raw, bool) else math.nan
        except ValueError:
            value = math.nan
        if math.isnan(value):
            raise ValueError(f"must be a number, got {_shown(raw)}")
        return value
    if typing.get_origin(kind) is dict and isinstance(raw, dict):  # a YAML mapping (--hf-overrides)
        return raw
    if spec.name == "lora_modules" and isinstance(raw, dict):  # a YAML mapping as a list item: its JSON,
        return json.dumps(raw)  # one of the two forms --lora-modules takes ({"name", "path", "base_model_name"})
    if isinstance(raw, dict | list | tuple):
        raise ValueError(f"must be a single value, got {_shown(raw)}")
    return Path(text) if kind is Path else text


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _shown(raw: Any) -> str:
    return repr(raw) if isinstance(raw, str) else str(raw)


def read_yaml(path: Path, names: set[str]) -> dict[str, tuple[str, Any]]:
    """The YAML mapping in ``path`` by option name, each with its key as written, for a command
    taking ``names``; see below for other keys."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise OptionError(f"--config {path} cannot be read: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" (line {where.line + 1})" if where is not None else ""
        raise OptionError(f"--config {path} is not valid YAML{line}: {getattr(exc, 'problem', exc)}") from exc
    if not isinstance(data, dict):
        raise OptionError(f"--config {path} must hold a mapping of option: value")
    values = {str(key).replace("-", "_"): (str(key), value) for key, value in data.items()}
    unknown = sorted(set(values) - names - {"config"})
    # one file may serve several commands (LLMP_CONFIG): options of llmp's shared records that this
    # command does not take are passed over with a note; any other key is a typo, refused as vLLM does
    shared = {f.name for record in (EngineConfig, ServerOptions, FrontendOptions) for f in dataclasses.fields(record)}
    typos = [key for key in unknown if key not in shared]
    if typos:
        hints = [
            f"{values[key][0]} (did you mean {close[0].replace('_', '-')}?)"
            if (close := get_close_matches(key, names, 1))
            else values[key][0]
            for key in typos
        ]
        raise OptionError(f"--config {path} has unknown options: {', '.join(hints)}")
    if unknown:
        print(f"llmp: ignoring options not used by this command in {path}: {', '.join(unknown)}", file=sys.stderr)
    return {key: value for key, value in values.items() if key in names}
