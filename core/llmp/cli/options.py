"""Commands generated from option records: the supported way for a command plugin to declare its options.

A command is a function whose parameters are option records (dataclasses whose
fields are declared with :func:`llmp.options.option`); :func:`options_command`
turns it into a typer command with one ``--flag`` per option, plus ``--config``,
and calls it with the records built from the command line, the ``LLMP_*``
variables and the YAML file (see :mod:`llmp.config`)::

    from dataclasses import dataclass

    from llmp.cli.options import options_command
    from llmp.options import option

    @dataclass(frozen=True, kw_only=True)
    class GreetOptions:
        name: str = option("world", "Whom to greet.")
        shout: bool = option(False, "Greet in capitals.")

    @options_command
    def greet(greeting: GreetOptions) -> None:
        \"\"\"Say hello.\"\"\"
        text = f"hello, {greeting.name}"
        print(text.upper() if greeting.shout else text)

Register ``greet`` with ``CommandSpec(name="greet", impl="my_plugin.cli:greet")``.
A repeatable option declared with ``nargs="+"`` also takes several values after one flag, as
vLLM's (``--lora-modules a=P b=Q``): its values run to the next token starting with ``-``, so a
positional argument goes before such a flag (``llmp serve MODEL --served-model-name a b``).
A command taking part of a shared record selects it with
``Annotated[EngineConfig, Select(omit=("task",))]`` (``EngineConfig`` from :mod:`llmp.options`).
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import sys
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING
from pathlib import Path
from typing import Annotated, Any

import typer

from llmp.cli.option_checks import option_problems
from llmp.config import OptionError, OptionSpec, Select, command_options, load_records

__all__ = ["OptionError", "Select", "options_command", "take_multiple_values", "usage_error"]

ConfigOption: Any = typer.Option(
    None,
    "--config",
    envvar="LLMP_CONFIG",
    help="YAML file of option: value pairs (command line and LLMP_* variables win).",
    dir_okay=False,
    metavar="FILE",
)
_EXPLICIT = {"COMMANDLINE", "PROMPT"}  # ParameterSource names; the enum itself is not public in typer


def usage_error(message: str) -> typer.Exit:
    """Print ``llmp: error: MESSAGE`` (one line, on stderr) and return the exit to raise (status 2):
    how every command refuses what it was given, before it starts anything."""
    print(f"llmp: error: {' '.join(message.split())}", file=sys.stderr)
    return typer.Exit(2)


def options_command(function: Callable) -> Any:
    """A typer command function generated from ``function``'s option-record parameters.

    Every value, from any source, is checked before ``function`` runs; a bad one is one
    ``llmp: error: ...`` line naming the option as it was given, and status 2. In
    ``--help`` each option is listed in its ``panel`` (see :func:`llmp.options.option`).
    The generated function keeps ``function`` as ``.function``, the options as
    ``.options`` (a list of :class:`llmp.config.OptionSpec`) and the flags of its ``nargs="+"``
    options as ``.multi_value_flags`` (see :func:`take_multiple_values`).
    """
    hints = typing.get_type_hints(function, include_extras=True)
    records = {name: hints[name] for name in inspect.signature(function).parameters}
    specs = command_options(records)
    record_panels = len(records) > 1

    def command(ctx: typer.Context, **params: Any) -> Any:
        given = {s.name: params[s.name] for s in specs if _source(ctx, s.name) in _EXPLICIT}
        config = params.get("config")
        try:
            built = load_records(records, given, Path(config) if config else None, check=option_problems)
        except OptionError as exc:
            raise usage_error(exc.message) from None
        return function(**built)

    parameters = [inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)]
    parameters += [_parameter(spec, record_panels) for spec in specs]
    parameters.append(
        inspect.Parameter("config", inspect.Parameter.KEYWORD_ONLY, default=ConfigOption, annotation=Path | None)
    )
    command.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in parameters}
    command.__name__ = command.__qualname__ = function.__name__
    command.__doc__ = function.__doc__
    command.__module__ = function.__module__
    command.function = function  # type: ignore[attr-defined]
    command.options = specs  # type: ignore[attr-defined]
    command.multi_value_flags = _multi_value_flags(records, specs)  # type: ignore[attr-defined]
    return command


def take_multiple_values(command: Any) -> None:
    """Let ``command`` (a click command llmp built) and its sub-commands take several values after
    one flag of an ``nargs="+"`` option: ``--lora-modules a=P b=Q`` is read as ``--lora-modules a=P
    --lora-modules b=Q``. Values run to the next token starting with ``-``. When a flag took several
    values and the command's positional argument was given nowhere, the last value was most likely
    meant for it (``--served-model-name a MODEL``): a usage error asks for the argument first."""
    flags = getattr(command.callback, "multi_value_flags", ())
    if flags:
        specs = command.callback.options
        parse_args = command.parse_args

        def parse_multiple_values(self: Any, ctx: typer.Context, args: list[str]) -> list[str]:
            expanded, several = expand_multiple_values(args, flags)
            rest = parse_args(ctx, expanded)
            if several:
                _check_argument_given(ctx, specs, several)
            return rest

        command.parse_args = types.MethodType(parse_multiple_values, command)
    for sub in getattr(command, "commands", {}).values():
        take_multiple_values(sub)


def expand_multiple_values(args: Sequence[str], flags: Sequence[str]) -> tuple[list[str], list[str]]:
    """``args`` with each run of values after one of ``flags`` split into one flag per value, and
    the flags given more than one value that way. Nothing after ``--`` is touched."""
    expanded: list[str] = []
    several: list[str] = []
    i = 0
    while i < len(args):
        token = args[i]
        if token == "--":
            expanded += args[i:]
            break
        expanded.append(token)
        i += 1
        if token not in flags:
            continue
        values = 0
        while i < len(args) and (values == 0 or not args[i].startswith("-")):
            if values:
                expanded.append(token)
            expanded.append(args[i])
            values += 1
            i += 1
        if values > 1:
            several.append(token)
    return expanded, several


def _check_argument_given(ctx: typer.Context, specs: Sequence[OptionSpec], several: Sequence[str]) -> None:
    for spec in specs:
        if not spec.argument or _source(ctx, spec.name) in _EXPLICIT or spec.env in os.environ:
            continue
        if ctx.params.get("config") or os.environ.get("LLMP_CONFIG"):
            continue  # the YAML file may give it
        flag = several[0]
        raise usage_error(
            f"{flag} took several values and {spec.flag_name} was not given: put {spec.flag_name} before "
            f"{flag} (its values run to the next option), or give {flag} once per value"
        )


def _multi_value_flags(records: Mapping[str, Any], specs: Sequence[OptionSpec]) -> tuple[str, ...]:
    """The flags (short ones too) of the options whose field says ``nargs="+"``."""
    metadata = {}
    for param, record in records.items():
        cls = typing.get_args(record)[0] if typing.get_origin(record) is Annotated else record
        metadata.update({(param, f.name): f.metadata for f in dataclasses.fields(cls)})
    return tuple(
        name
        for spec in specs
        if spec.repeatable and metadata[(spec.record, spec.field)].get("nargs") == "+"
        for name in _declarations(spec)
    )


def _source(ctx: typer.Context, name: str) -> str:
    source = ctx.get_parameter_source(name)
    return source.name if source is not None else ""


def _parameter(spec: OptionSpec, record_panels: bool) -> inspect.Parameter:
    """The typer parameter of one option. Values reach the command as text (a switch as a bool) and
    are converted and checked with those from ``LLMP_*`` and the YAML file, for one kind of message."""
    if spec.value_type is bool:
        annotation: Any = bool
    elif spec.repeatable:
        annotation = list[str] | None
    else:
        annotation = str | None
    default = ... if spec.default is MISSING else None if spec.repeatable else spec.default
    panel = spec.panel or (spec.record.replace("_", " ").capitalize() if record_panels else None)
    metavar = None if annotation is bool else spec.metavar or _metavar(spec)
    if spec.argument:
        info = typer.Argument(default, help=spec.help, metavar=metavar, rich_help_panel=panel)
    else:
        info = typer.Option(default, *_declarations(spec), help=spec.help, metavar=metavar, rich_help_panel=panel)
    return inspect.Parameter(spec.name, inspect.Parameter.KEYWORD_ONLY, default=info, annotation=annotation)


def _metavar(spec: OptionSpec) -> str:
    """The value's name in ``--help``: a closed set's values, ``N`` for a number, ``NAME`` for a
    plugin, else the option's last word (``--root-path PATH``, ``--host HOST``); never a type."""
    if spec.choices is not None:
        return "{" + ",".join(map(str, spec.choices)) + "}"
    if spec.argument:
        return spec.name.upper()
    if spec.component is not None:
        return "NAME"
    kind = typing.get_args(spec.value_type)[0] if spec.repeatable else spec.value_type
    if kind in (int, float):
        return "N"
    return "PATH" if kind is Path else spec.name.rpartition("_")[2].upper()


def _declarations(spec: OptionSpec) -> list[str]:
    flag = spec.flag or "--" + spec.name.replace("_", "-")
    if spec.flag is None and spec.value_type is bool and spec.default is True:
        flag = f"{flag}/--no-{flag[2:]}"
    return [flag, spec.short] if spec.short else [flag]
