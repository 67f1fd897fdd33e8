"""The ``llmp`` command line: a typer app whose sub-commands come from plugins.

Every sub-command, the built-in ones included, is a ``CommandSpec`` from the
``llmp_register_commands`` hook. Only the command being run is imported, so
``llmp plugins list`` never pays for ``llmp serve``'s imports. A command plugin
declares its options as a record and builds its command with
:func:`llmp.cli.options.options_command`.
"""

from __future__ import annotations

import re
import sys
from typing import Any

import typer
from typer.core import TyperGroup

from llmp import __version__, plugins, registry
from llmp.api import API_VERSION, CommandSpec, LLMPError
from llmp.cli.help import HELP_OPTION_NAMES, format_help, use_llmp_help
from llmp.cli.options import take_multiple_values


class PluginCommandGroup(TyperGroup):
    """A click group that lists and builds sub-commands from the command registry."""

    def format_help(self, ctx: typer.Context, formatter: Any) -> None:
        format_help(self, ctx, formatter)

    def list_commands(self, ctx: typer.Context) -> list[str]:
        return sorted(registry.components("command"))

    def get_command(self, ctx: typer.Context, cmd_name: str) -> Any:
        spec = registry.components("command").get(cmd_name)
        if spec is None:
            return None
        try:
            command = _build_command(spec)
        except Exception as exc:  # a broken command must not break the others
            plugins.record_failure(spec.plugin, exc, f"building command {cmd_name!r}")
            command = _broken_command(spec, exc)
        use_llmp_help(command)
        take_multiple_values(command)
        return command


def _build_command(spec: CommandSpec) -> Any:
    obj = spec.load()
    if isinstance(obj, typer.Typer):
        command = typer.main.get_group(obj)
    elif callable(obj):
        command = _command_from_function(obj, spec.name, spec.help)
    else:
        raise TypeError(f"{spec.impl} is {type(obj).__name__}, not a typer.Typer or a function")
    command.name = spec.name
    if spec.help and not command.help:
        command.help = spec.help
    return command


def _command_from_function(function: Any, name: str, help_text: str) -> Any:
    holder = typer.Typer(add_completion=False)
    holder.command(name=name, help=help_text or None)(function)
    return typer.main.get_command(holder)


def _broken_command(spec: CommandSpec, exc: Exception) -> Any:
    def broken() -> None:
        print(f"llmp: command {spec.name!r} from {spec.distribution} is broken: {exc}", file=sys.stderr)
        raise typer.Exit(1)

    return _command_from_function(broken, spec.name, f"(broken) {spec.help}")


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"llmp {__version__} (plugin API {API_VERSION})")
        raise typer.Exit()


app = typer.Typer(
    cls=PluginCommandGroup,
    name="llmp",
    help="llmp: serve and run LLMs; every part is a plugin.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": HELP_OPTION_NAMES},  # as each command llmp builds
)

# vLLM flags that llmp has no option of that name for: the llmp option doing their job, and the hint
# given with the unknown-option error of a command that takes that option
VLLM_EQUIVALENTS = {
    "--kv-cache-memory": ("--kv-cache-memory-gib", "use --kv-cache-memory-gib: llmp sizes the KV cache in GiB"),
    "--num-gpu-blocks-override": ("--kv-cache-memory-gib", "use --kv-cache-memory-gib to size the KV cache"),
    "--swap-space": ("--kv-cache-memory-gib", "llmp does not swap the KV cache; --kv-cache-memory-gib sizes it"),
    "--pipeline-parallel-size": ("--tensor-parallel-size", "llmp splits a model by tensor: --tensor-parallel-size"),
    "--distributed-executor-backend": ("--executor", "use --executor"),
    "--uvicorn-log-level": ("--log-level", "use --log-level"),
    "--disable-log-requests": ("--disable-access-log", "use --disable-access-log"),
    "--enable-reasoning": ("--reasoning-parser", "--reasoning-parser NAME turns reasoning on"),
    "--model": ("MODEL", "the model is the first argument: {command} MODEL"),
}


# commands of Ollama (and words for them) that llmp names otherwise: the unknown-command line says which
OTHER_TOOLS_COMMANDS = {
    "list": "`llmp ls` lists the models on this machine",
    "models": "`llmp ls` lists the models on this machine",
    "run": "`llmp chat MODEL` runs a model here and chats with it",
    "remove": "`llmp rm` removes a model",
    "delete": "`llmp rm` removes a model",
    "download": "`llmp pull` downloads a model",
}


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """llmp: serve and run LLMs; every part is a plugin."""


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``llmp`` and ``python -m llmp``. A usage error, from click or from a
    command, is one ``llmp: error: ...`` line on stderr and status 2."""
    try:
        plugins.load_plugins()
        status = app(args=argv, prog_name="llmp", standalone_mode=False)
    except typer.TyperException as exc:  # click's errors (typer's copy of click)
        if type(exc).__name__ == "NoArgsIsHelpError":  # a bare group: its help, and status 2
            typer.echo(exc.format_message())
            sys.exit(2)
        ctx = getattr(exc, "ctx", None)
        hint = f" (see '{ctx.command_path} --help')" if ctx is not None and exc.exit_code == 2 else ""
        print(f"llmp: error: {' '.join(_usage_message(exc).split())}{hint}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except typer.Abort:
        print("Aborted!", file=sys.stderr)
        sys.exit(1)
    except LLMPError as exc:
        print(f"llmp: error: {exc}", file=sys.stderr)
        sys.exit(2)
    sys.exit(status if isinstance(status, int) else 0)


def _usage_message(exc: Any) -> str:
    """click's message in llmp's style (``--config file '/tmp' is a directory``: the option first),
    naming the llmp option to use for a vLLM flag llmp does not have."""
    ctx = getattr(exc, "ctx", None)
    kind = type(exc).__name__
    if kind == "NoSuchOption" and ctx is not None:
        equivalent = VLLM_EQUIVALENTS.get(exc.option_name)
        taken = {name for p in ctx.command.get_params(ctx) for name in (*p.opts, p.metavar)}
        if equivalent is not None and equivalent[0] in taken:
            return f"No such option: {exc.option_name} ({equivalent[1].format(command=ctx.command_path)})"
    unknown = re.fullmatch(r"No such command '(.+)'\.", exc.format_message())
    if unknown and unknown.group(1) in OTHER_TOOLS_COMMANDS:
        return f"No such command '{unknown.group(1)}': {OTHER_TOOLS_COMMANDS[unknown.group(1)]}"
    if isinstance(exc, typer.BadParameter) and kind == "BadParameter" and exc.param is not None:
        name = exc.param.opts[0] if exc.param.opts else exc.param.metavar or exc.param.name
        return f"{name} {exc.message.rstrip('.')}"
    return exc.format_message()
