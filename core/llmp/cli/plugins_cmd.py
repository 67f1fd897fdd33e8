"""``llmp plugins list``, ``show``, ``verify`` and ``new``.

Reads records only: no component is imported, so torch, transformers and
triton stay out of the process.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from difflib import get_close_matches
from typing import Any, Literal

import typer

from llmp import plugins, registry
from llmp.api import KINDS
from llmp.cli.options import options_command, usage_error
from llmp.options import option

app = typer.Typer(help="List and inspect plugins.", no_args_is_help=True)


@dataclass(frozen=True, kw_only=True)
class PluginsListOptions:
    json_output: bool = option(False, "Print JSON instead of a table.", flag="--json/--no-json")
    kind: Literal[KINDS] | None = option(  # type: ignore[valid-type]  # KINDS: a tuple of names
        None, f"Only plugins providing this kind: {', '.join(KINDS)}.", metavar="KIND"
    )


@dataclass(frozen=True, kw_only=True)
class PluginsShowOptions:
    name: str = option(help="Plugin name, as in `llmp plugins list`.", argument=True)
    json_output: bool = option(False, "Print JSON.", flag="--json/--no-json")


def _details(spec: Any) -> dict[str, Any]:
    """The kind-specific fields of a record (a model's tasks, a kernel set's devices ...)."""
    import dataclasses

    from llmp.api import ComponentSpec

    common = {f.name for f in dataclasses.fields(ComponentSpec)}
    values = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec) if f.name not in common}
    return {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}


def describe_plugins() -> list[dict[str, Any]]:
    """One dict per plugin: identity, status, hooks and the components it provides."""
    pm = plugins.load_plugins()
    provided: dict[str, list[dict[str, str]]] = {}
    for kind, specs in registry.all_components().items():
        for spec in specs.values():
            provided.setdefault(spec.plugin, []).append(
                {
                    "kind": kind,
                    "name": spec.name,
                    "impl": spec.impl,
                    "description": spec.description,
                    "details": _details(spec),
                }
            )
    for kind in KINDS:
        for error in registry.conflicts(kind).values():
            for plugin_name in error.plugins:
                record = plugins.get_record(plugin_name)
                if record is not None and str(error) not in record.errors:
                    record.errors.append(str(error))
    described = []
    for record in plugins.plugin_records():
        plugin = pm.get_plugin(record.name)
        hooks = sorted(hc.name for hc in pm.get_hookcallers(plugin) or []) if plugin is not None else []
        components = provided.get(record.name, [])
        described.append(
            {
                "name": record.name,
                "distribution": record.distribution,
                "version": record.version,
                "module": record.module,
                "path": getattr(plugin, "__file__", None),
                "builtin": record.builtin,
                "status": record.status,
                "kinds": sorted({c["kind"] for c in components}),
                "components": components,
                "hooks": hooks,
                "errors": list(record.errors),
                "tracebacks": list(record.tracebacks),
            }
        )
    return described


@app.command("list")
@options_command
def list_plugins(settings: PluginsListOptions) -> None:
    """List every component by kind (name, plugin, what it is) and any broken or incompatible plugin.

    `llmp plugins show NAME` gives one plugin's distribution, version, hooks and errors; --json gives
    every plugin with all of it."""
    rows = describe_plugins()
    if settings.kind:  # the plugins providing that kind, with only their components of it
        rows = [
            {**r, "components": [c for c in r["components"] if c["kind"] == settings.kind], "kinds": [settings.kind]}
            for r in rows
            if settings.kind in r["kinds"]
        ]
    if settings.json_output:
        typer.echo(json.dumps([{k: v for k, v in r.items() if k != "tracebacks"} for r in rows], indent=2))
        return
    _print_listing(rows, settings.kind)


@dataclass(frozen=True)
class _Row:
    kind: str
    name: str
    plugin: str
    ok: bool
    description: str


def _rows(plugins_described: list[dict[str, Any]], kind: str | None) -> list[_Row]:
    """One row per component, in KINDS order, then by name (a ``*`` wildcard last)."""
    rows = [
        _Row(c["kind"], c["name"], p["name"], p["status"] == "ok", _summary(c))
        for p in plugins_described
        for c in p["components"]
        if kind is None or c["kind"] == kind
    ]
    # fallbacks last, as the registry tries them: "*Suffix" patterns, then "*"
    return sorted(
        rows,
        key=lambda r: (KINDS.index(r.kind), r.name.startswith("*"), r.name == "*", r.name.casefold(), r.plugin),
    )


def _summary(component: dict[str, Any]) -> str:
    details = component.get("details", {})
    text = component.get("description") or details.get("help") or ""
    text = " ".join(text.split("\n\n", 1)[0].split())  # the first paragraph, on one line
    tasks = details.get("tasks")
    if tasks and "generate" not in tasks:
        text = f"[{'/'.join(tasks)}] {text}"
    return text


def _print_listing(plugins_described: list[dict[str, Any]], kind: str | None) -> None:
    """Kinds as headings, one component per line. Names and plugins are never cut (they are what
    users type); descriptions are cut to the terminal's width (``COLUMNS``) instead."""
    import shutil
    import textwrap

    from rich.console import Console
    from rich.text import Text

    console = Console(highlight=False, soft_wrap=True)
    rows = _rows(plugins_described, kind)
    broken = [p for p in plugins_described if p["status"] != "ok"]  # broken or incompatible
    if not rows and not broken:
        message = f"no plugins match --kind {kind}" if kind else "no plugins are loaded"
        limit = os.environ.get("LLMP_LOAD_PLUGINS")
        if limit is not None:
            message += f" (LLMP_LOAD_PLUGINS={limit!r} limits the plugins loaded)"
        console.print(message, markup=False)
        return
    width = shutil.get_terminal_size().columns
    name_width = max((len(r.name) for r in rows), default=0)
    plugin_width = max((len(r.plugin) for r in rows), default=0)
    room = width - 1 - (2 + name_width + 2 + plugin_width)  # one column spare: no wrap at the edge
    current = None
    for row in rows:
        if row.kind != current:
            if current is not None:
                console.print()
            console.print(Text(row.kind, style="bold"))
            current = row.kind
        line = Text("  " + row.name.ljust(name_width) + "  ")
        line.append(row.plugin.ljust(plugin_width), style=None if row.ok else "red")
        if row.description and room >= 14:  # narrower than that, a description says nothing
            description = Text("  " + row.description)
            description.truncate(room, overflow="ellipsis")
            line.append_text(description)
        line.rstrip()
        console.print(line)
    notes = [_wildcard_note(row, plugins_described) for row in rows if row.name.startswith("*")]
    shown = len({r.plugin for r in rows})
    statuses = [p["status"] for p in broken]
    status = ", ".join(f"{statuses.count(s)} {s}" for s in ("broken", "incompatible") if s in statuses) or "all ok"
    notes.append(
        f"{_count(len(rows), 'component')} from {_count(shown, 'plugin')}, {status}. `llmp plugins show NAME` "
        "gives a plugin's distribution, version, hooks and errors; --json gives all of it, --kind KIND one kind."
    )
    for note in notes:
        console.print()
        console.print(
            "\n".join(textwrap.wrap(note, max(width - 1, 40), break_on_hyphens=False, break_long_words=False)),
            markup=False,
        )
    for plugin in broken:
        error = (plugin["errors"] or ["no error recorded"])[0].splitlines()[0]
        if plugin["status"] == "incompatible":  # made for another plugin API: which one, and which release it is
            identity = f"{plugin['distribution']} {plugin['version']}".strip()
            label = Text(f"plugin {plugin['name']} ({identity}) is incompatible: ", style="red")
        else:
            label = Text(f"broken plugin {plugin['name']} ({plugin['distribution']}): ", style="red")
        console.print(label + Text(error))


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def _wildcard_note(row: _Row, plugins_described: list[dict[str, Any]]) -> str:
    """What a ``*`` (or ``*Suffix``) component stands for: every name (ending so) no other plugin of
    its kind claims."""
    component = next(
        c for p in plugins_described if p["name"] == row.plugin for c in p["components"] if c["name"] == row.name
    )
    suffix = row.name[1:]
    if row.kind == "model":
        via = " through transformers" if component["details"].get("model_impl") == "transformers" else ""
        if suffix:
            return (
                f"model {row.name}: a fallback. {row.plugin} serves any architecture ending in {suffix} "
                f"that no model plugin above names{via}."
            )
        return (
            f"model *: the fallback. {row.plugin} serves any architecture that no model plugin above "
            f"names{via} (--model-impl transformers uses it for every model)."
        )
    ending = f" ending in {suffix}" if suffix else ""
    return (
        f"{row.kind} {row.name}: the fallback. {row.plugin} serves any {row.kind} name{ending} "
        "no other plugin provides."
    )


@app.command("show")
@options_command
def show_plugin(settings: PluginsShowOptions) -> None:
    """Show one plugin: hooks, components, module path and, if broken, its error and traceback (if
    incompatible, the plugin API range it needs)."""
    rows = {r["name"]: r for r in describe_plugins()}
    if settings.name not in rows:
        close = get_close_matches(settings.name, rows, 1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        installed = ", ".join(sorted(rows)) or "none"
        raise usage_error(f"NAME must be an installed plugin ({installed}), got {settings.name!r}{hint}")
    row = rows[settings.name]
    if settings.json_output:
        typer.echo(json.dumps(row, indent=2))
        return
    from rich.console import Console

    console = Console()
    errors, tracebacks = row["errors"], row["tracebacks"]
    if row["status"] == "incompatible":  # its first error is the reason: shown as its status, without a traceback
        console.print(f"[bold]{row['name']}[/] [red]incompatible[/]: {errors[0]}", highlight=False)
        errors, tracebacks = errors[1:], tracebacks[1:]
    else:
        console.print(f"[bold]{row['name']}[/] {'[green]ok[/]' if row['status'] == 'ok' else '[red]broken[/]'}")
    console.print(f"distribution: {row['distribution']} {row['version']}")
    console.print(f"module: {row['module']}  ({row['path'] or 'no file'})", soft_wrap=True)
    console.print(f"hooks: {', '.join(row['hooks']) or 'none'}")
    console.print("components:")
    for c in row["components"]:
        details = ", ".join(
            f"{k}={','.join(map(str, v)) if isinstance(v, list) else v}" for k, v in c.get("details", {}).items()
        )
        console.print(
            f"  {c['kind']}: {c['name']} -> {c['impl']}" + (f" ({details})" if details else ""),
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        if c.get("description"):
            console.print(f"      {c['description']}", markup=False, highlight=False, soft_wrap=True)
    for error, tb in zip(errors, tracebacks + [""] * len(errors), strict=False):
        console.print("[red]error:[/]", end=" ")
        console.print(error, markup=False, highlight=False)
        if tb:
            console.print(tb, markup=False, highlight=False)


@dataclass(frozen=True, kw_only=True)
class PluginsVerifyOptions:
    name: str = option(help="Plugin name, as in `llmp plugins list`.", argument=True)
    json_output: bool = option(False, "Print the report as JSON.", flag="--json/--no-json")
    kind: Literal[KINDS] | None = option(  # type: ignore[valid-type]  # KINDS: a tuple of names
        None, "Verify only the plugin's components of this kind.", metavar="KIND"
    )


@app.command("verify")
@options_command
def verify_plugin(settings: PluginsVerifyOptions) -> None:
    """Run the conformance suite of each kind the plugin provides against the installed plugin.

    Exits 0 when every check passed or was skipped (with its reason), 1 when one failed, 2 when the
    plugin is not installed, broken or incompatible."""
    from llmp.conformance import verify
    from llmp.conformance.report import print_report

    if plugins.get_record(settings.name) is None:
        rows = [r.name for r in plugins.plugin_records()]
        close = get_close_matches(settings.name, rows, 1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise usage_error(
            f"NAME must be an installed plugin ({', '.join(sorted(rows)) or 'none'}), got {settings.name!r}{hint}"
        )
    report = verify(settings.name, kinds=[settings.kind] if settings.kind else None)
    if settings.json_output:
        typer.echo(json.dumps(report.to_json(), indent=2))
    else:
        print_report(report)
    if report.error:
        raise typer.Exit(2)
    if not report.passed:
        raise typer.Exit(1)


@dataclass(frozen=True, kw_only=True)
class PluginsNewOptions:
    kind: Literal[KINDS] = option(  # type: ignore[valid-type]  # KINDS: a tuple of names
        help=f"What the plugin provides: {', '.join(KINDS)}.", argument=True, metavar="KIND"
    )
    name: str = option(
        help="The plugin's name: lowercase letters, digits and hyphens (the distribution is llmp-NAME).",
        argument=True,
    )
    dir: str | None = option(None, "Where to write it (default: ./llmp-NAME); must not exist or be empty.")


@app.command("new")
@options_command
def new_plugin(settings: PluginsNewOptions) -> None:
    """Write a complete, installable plugin distribution of KIND: pyproject.toml with the entry point,
    the package, a README, tests that run the conformance kit, and a CI workflow."""
    from llmp.scaffold import ScaffoldError
    from llmp.scaffold import new_plugin as write_plugin

    try:
        path = write_plugin(settings.kind, settings.name, settings.dir)
    except ScaffoldError as error:
        raise usage_error(str(error)) from None
    typer.echo(f"wrote {path}: pip install -e {path} && pytest {path}/tests")
