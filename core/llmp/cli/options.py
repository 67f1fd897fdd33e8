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
A command taking part of a shared record selects it with
``Annotated[EngineConfig, Select(omit=("task",))]`` (``EngineConfig`` from :mod:`llmp.options`).
"""

from __future__ import annotations

import inspect
import sys
import typing
from collections.abc import Callable
from dataclasses import MISSING
from pathlib import Path
from typing import Any, Literal

import typer

from llmp.config import OptionError, OptionSpec, Select, command_options, load_records

__all__ = ["OptionError", "Select", "options_command"]

ConfigOption: Any = typer.Option(
    None,
    "--config",
    envvar="LLMP_CONFIG",
    help="YAML file of option: value pairs (command line and LLMP_* variables win).",
    dir_okay=False,
)
_EXPLICIT = {"COMMANDLINE", "PROMPT"}  # ParameterSource names; the enum itself is not public in typer


def options_command(function: Callable | None = None, *, one_line_errors: bool = False) -> Any:
    """A typer command function generated from ``function``'s option-record parameters.

    ``one_line_errors``: a bad value is one ``llmp: error: ...`` line and status 2,
    rather than click's usage panel. The generated function keeps ``function`` as
    ``.function`` and the options as ``.options`` (a list of :class:`llmp.config.OptionSpec`).
    """

    def generate(function: Callable) -> Any:
        hints = typing.get_type_hints(function, include_extras=True)
        records = {name: hints[name] for name in inspect.signature(function).parameters}
        specs = command_options(records)
        panels = len(records) > 1

        def command(ctx: typer.Context, **params: Any) -> Any:
            given = {s.name: params[s.name] for s in specs if _source(ctx, s.name) in _EXPLICIT}
            config = params.get("config")
            try:
                built = load_records(records, given, Path(config) if config else None)
            except OptionError as exc:
                if one_line_errors:
                    print(f"llmp: error: {exc.message}", file=sys.stderr)
                    raise typer.Exit(2) from None
                raise typer.BadParameter(exc.message, ctx=ctx, param_hint=exc.param_hint) from None
            return function(**built)

        parameters = [inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)]
        parameters += [_parameter(spec, panels) for spec in specs]
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
        return command

    return generate(function) if function is not None else generate


def _source(ctx: typer.Context, name: str) -> str:
    source = ctx.get_parameter_source(name)
    return source.name if source is not None else ""


def _parameter(spec: OptionSpec, panels: bool) -> inspect.Parameter:
    """The typer parameter of one option."""
    value_type, metavar = spec.value_type, spec.metavar
    if spec.repeatable:
        annotation: Any = list[typing.get_args(value_type)[0]] | None
    elif typing.get_origin(value_type) is Literal:  # checked with the other values, for one kind of error
        annotation = type(typing.get_args(value_type)[0])
        metavar = metavar or "[" + "|".join(map(str, typing.get_args(value_type))) + "]"
    else:
        annotation = value_type
    if spec.optional and not spec.repeatable:
        annotation = annotation | None
    default = ... if spec.default is MISSING else None if spec.repeatable else spec.default
    if spec.argument:
        info = typer.Argument(default, help=spec.help, metavar=metavar)
    else:
        info = typer.Option(
            default,
            *_declarations(spec),
            help=spec.help,
            metavar=metavar,
            rich_help_panel=f"{spec.record.replace('_', ' ').capitalize()} options" if panels else None,
        )
    return inspect.Parameter(spec.name, inspect.Parameter.KEYWORD_ONLY, default=info, annotation=annotation)


def _declarations(spec: OptionSpec) -> list[str]:
    flag = spec.flag or "--" + spec.name.replace("_", "-")
    if spec.flag is None and spec.value_type is bool and spec.default is True:
        flag = f"{flag}/--no-{flag[2:]}"
    return [flag, spec.short] if spec.short else [flag]
