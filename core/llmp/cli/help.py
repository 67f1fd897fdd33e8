"""``--help`` of every ``llmp`` command: options grouped in their panels, flag names never cut.

typer's rich help gives every flag form, the type and the help text columns of their own,
so at 80 columns rich squeezes the flag column and cuts long names. Here each option is one
entry: its flags (``--[no-]enable-prefix-caching``, ``--tensor-parallel-size, -tp N``) and,
beside them or below when they are long, the help text wrapped to the terminal. The
value's name is a closed set's values (``{fcfs,priority}``) or a short word (``N``, ``TEXT``).
Panels come from each option's ``panel`` (:func:`llmp.options.option`): llmp's own in the
order of :data:`llmp.options.PANELS`, then any other, then "Options" (``--config``, ``--help``).
"""

from __future__ import annotations

import io
import re
import shutil
import textwrap
import types
from typing import Any

from typer.core import TyperArgument

from llmp.options import PANELS

GAP = 2  # spaces between the flags and their help text
TRAILING = re.compile(r"(?:\s|\x1b\[[0-9;]*m)+$")  # rich pads lines with spaces, styled ones too
NBSP = "\u00a0"  # joins "[default: 8000]" so that wrapping never splits it; a plain space once wrapped
MIN_HELP_WIDTH = 24  # narrower than this, the help text goes below the flags
DEFAULT_PANEL, ARGUMENTS_PANEL, COMMANDS_PANEL = "Options", "Arguments", "Commands"


HELP_OPTION_NAMES = ["-h", "--help"]


def use_llmp_help(command: Any) -> None:
    """Render ``command``'s help, and that of its sub-commands, with :func:`format_help`, and
    take ``-h`` for ``--help`` as vLLM does. (typer's commands render their own; this replaces it
    on the commands llmp builds.)"""
    command.format_help = types.MethodType(format_help, command)
    command.context_settings.setdefault("help_option_names", HELP_OPTION_NAMES)
    for sub in getattr(command, "commands", {}).values():
        use_llmp_help(sub)


def format_help(command: Any, ctx: Any, formatter: Any) -> None:
    """Write ``command``'s help into ``formatter`` (a click ``HelpFormatter``), as click's own
    ``format_help`` does; colours are stripped when the output is no terminal."""
    formatter.write(render_help(command, ctx, shutil.get_terminal_size().columns))


def render_help(command: Any, ctx: Any, width: int) -> str:
    """The help text of ``command`` at ``width`` columns, with ANSI styles."""
    from rich.console import Console, Group
    from rich.padding import Padding
    from rich.panel import Panel
    from rich.text import Text

    width = max(width, 40)
    console = Console(file=io.StringIO(), width=width, force_terminal=True, color_system="standard", highlight=False)
    console.print(Padding(Text(_usage(command, ctx), style="bold"), (1, 1, 0, 1)))
    if command.help:
        for paragraph in textwrap.dedent(command.help).strip().split("\n\n"):
            console.print(Padding(Text(" ".join(paragraph.split())), (1, 1, 0, 1)))
    console.print()
    panels = _panels(command, ctx)
    inner = width - 4  # the panel's border and padding
    flags_width = _flags_width([left for rows in panels.values() for left, _ in rows], inner)
    for name, rows in panels.items():
        lines = [line for left, right in rows for line in _entry(left, right, flags_width, inner)]
        console.print(Panel(Group(*lines), title=name, title_align="left", border_style="dim", padding=(0, 1)))
    note = _settings_note(command.get_params(ctx))
    if note:
        console.print(Padding(Text(note, style="dim"), (0, 1, 1, 1)))
    text = console.file.getvalue()  # type: ignore[attr-defined]
    return "\n".join(TRAILING.sub(_reset, line) for line in text.rstrip().splitlines()) + "\n"


def _settings_note(params: list[Any]) -> str | None:
    """How else the options are set, for a command with ``--config``; the example is one of the
    command's own options (a number when it has one: ``LLMP_MAX_NUM_SEQS=256``, ``max-num-seqs: 256``)."""
    if not any(p.name == "config" for p in params):
        return None
    options = [p for p in params if not isinstance(p, TyperArgument) and p.name not in ("config", "help")]
    if not options:
        return None
    numbers = [p for p in options if isinstance(p.default, int | float) and not isinstance(p.default, bool)]
    example = (numbers or options)[0]
    if isinstance(example.default, bool):
        env_value, yaml_value = ("0", "false") if example.default else ("1", "true")
    elif example.default not in (None, "", (), []):
        env_value = yaml_value = f"{example.default:g}" if isinstance(example.default, float) else str(example.default)
    else:
        env_value = yaml_value = _metavar(example) or "VALUE"
    name = example.name or ""
    return (
        f"Each option can also be set as LLMP_<OPTION> (LLMP_{name.upper()}={env_value}) or as a key of the "
        f"--config file ({name.replace('_', '-')}: {yaml_value}); the command line wins, then LLMP_*, then the file."
    )


def _reset(trailing: re.Match) -> str:
    """What ends a line instead of its padding: a style reset, if a style was open."""
    return "\x1b[0m" if "\x1b" in trailing.group() else ""


def _usage(command: Any, ctx: Any) -> str:
    """``Usage: llmp serve [OPTIONS] [MODEL]``: a required argument bare, an optional one in brackets
    (typer writes a required one ``{NAME}``, which reads as a set of choices here)."""
    pieces = [f"Usage: {ctx.command_path}"]
    params = command.get_params(ctx)
    if any(not isinstance(p, TyperArgument) for p in params):
        pieces.append("[OPTIONS]")
    for param in params:
        if isinstance(param, TyperArgument):
            name = (param.metavar or (param.name or "").upper()) + ("..." if param.nargs != 1 else "")
            pieces.append(name if param.required else f"[{name}]")
    if hasattr(command, "list_commands"):
        pieces.append("COMMAND [ARGS]...")
    return " ".join(pieces)


def _panels(command: Any, ctx: Any) -> dict[str, list[tuple[Any, str]]]:
    """Panel name -> its (flags, help) rows: llmp's panels first, in order, then others, then Options."""
    found: dict[str, list[tuple[Any, str]]] = {}
    for param in command.get_params(ctx):
        if getattr(param, "hidden", False):
            continue
        default = ARGUMENTS_PANEL if isinstance(param, TyperArgument) else DEFAULT_PANEL
        panel = getattr(param, "rich_help_panel", None) or default
        found.setdefault(panel, []).append((_flags(param), _help(param, ctx)))
    if hasattr(command, "list_commands"):  # a group
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                summary = (sub.help or sub.short_help or "").strip().split("\n\n")[0]
                found.setdefault(COMMANDS_PANEL, []).append((_styled(name, "bold cyan"), " ".join(summary.split())))
    order = [ARGUMENTS_PANEL, *PANELS]
    ranked = sorted(found, key=lambda name: (name == DEFAULT_PANEL, name == COMMANDS_PANEL, _rank(order, name)))
    return {name: found[name] for name in ranked}


def _rank(order: list[str], name: str) -> int:
    return order.index(name) if name in order else len(order)


def _flags(param: Any) -> Any:
    """An option's flags and value name, styled: ``--[no-]json``, ``--tensor-parallel-size, -tp N``."""
    from rich.text import Text

    text = Text()
    if isinstance(param, TyperArgument):
        text.append(param.metavar or (param.name or "").upper(), style="bold cyan")
        return text
    opts, secondary = list(param.opts), list(param.secondary_opts)
    longs = [o for o in opts if o.startswith("--")]
    if len(secondary) == 1 and len(longs) == 1 and secondary[0] == "--no-" + longs[0][2:]:
        opts[opts.index(longs[0])], secondary = "--[no-]" + longs[0][2:], []
    text.append(", ".join(opts + secondary), style="bold cyan")
    metavar = _metavar(param)
    if metavar:
        text.append(" " + metavar, style="yellow")
    return text


def _metavar(param: Any) -> str | None:
    if getattr(param, "is_flag", False) or getattr(param, "count", False):
        return None
    if param.metavar:
        return param.metavar
    param_type = getattr(param, "type", None)  # a plain function's typer parameter may carry none
    choices = getattr(param_type, "choices", None)
    if choices:
        return "{" + ",".join(map(str, choices)) + "}"
    kind = getattr(param_type, "name", None) or ""
    return "N" if kind.startswith(("integer", "float")) else (param.name or "value").rpartition("_")[2].upper()


def _help(param: Any, ctx: Any) -> str:
    """The help text, then the default (when there is one worth saying) and the variable, if any."""
    parts = [" ".join((getattr(param, "help", None) or "").split())]
    default = param.default
    if getattr(param, "secondary_opts", None) and isinstance(default, bool):
        parts.append(f"[default:{NBSP}{'on' if default else 'off'}]")
    elif not getattr(param, "is_flag", False) and default not in (None, "", (), []) and not callable(default):
        shown = f"{default:g}" if isinstance(default, float) else str(default)
        parts.append(f"[default:{NBSP}{shown}]")
    envvar = getattr(param, "envvar", None)
    if isinstance(envvar, str):
        parts.append(f"[env:{NBSP}{envvar}]")
    if param.required:
        parts.append("[required]")
    return " ".join(p for p in parts if p)


def _flags_width(lefts: list[Any], inner: int) -> int:
    """The flags column: as wide as the flags that fit in about 2/5 of the panel; longer ones
    get a line of their own."""
    cap = max(16, min(36, inner * 2 // 5))
    fitting = [len(left) for left in lefts if len(left) <= cap]
    return max(fitting, default=cap)


def _entry(left: Any, right: str, flags_width: int, inner: int) -> list[Any]:
    """The lines of one entry: flags and help side by side, or the help below long flags."""
    from rich.text import Text

    help_width = inner - flags_width - GAP
    indent = flags_width + GAP
    if help_width < MIN_HELP_WIDTH:  # a narrow terminal: help below, indented a little
        indent, help_width = 4, inner - 4
    wrapped = [line.replace(NBSP, " ") for line in textwrap.wrap(right, help_width, break_on_hyphens=False)] or [""]
    lines = []
    if len(left) + GAP <= indent:
        first = left.copy()
        first.append(" " * (indent - len(left)) + wrapped.pop(0))
        lines.append(first)
    else:
        lines.append(left)
    lines += [Text(" " * indent + line) for line in wrapped if line]
    for line in lines:
        line.highlight_regex(r"\[(default|env|required)[^\]]*\]", "dim")
    return lines


def _styled(text: str, style: str) -> Any:
    from rich.text import Text

    return Text(text, style=style)
