"""``llmp plugins list`` and ``llmp plugins show``.

Reads records only: no component is imported, so torch, transformers and
triton stay out of the process.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from llmp import plugins, registry
from llmp.api import KINDS
from llmp.cli import ConfigOption
from llmp.config import CommandSettings, load_settings

app = typer.Typer(help="List and inspect plugins.", no_args_is_help=True)


class PluginsListSettings(CommandSettings):
    json_output: bool = False
    kind: str | None = None


class PluginsShowSettings(CommandSettings):
    json_output: bool = False


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
def list_plugins(
    ctx: typer.Context,
    json_output: bool = typer.Option(False, "--json/--no-json", help="Print JSON instead of a table."),
    kind: str | None = typer.Option(None, "--kind", help=f"Only plugins providing this kind: {', '.join(KINDS)}."),
    config: Path | None = ConfigOption,
) -> None:
    """List every plugin, its kinds, components, distribution, version and status."""
    settings = load_settings(PluginsListSettings, ctx)
    if settings.kind is not None and settings.kind not in KINDS:
        raise typer.BadParameter(f"unknown kind {settings.kind!r}; kinds are: {', '.join(KINDS)}", param_hint="--kind")
    rows = describe_plugins()
    if settings.kind:
        rows = [r for r in rows if settings.kind in r["kinds"]]
    if settings.json_output:
        typer.echo(json.dumps([{k: v for k, v in r.items() if k != "tracebacks"} for r in rows], indent=2))
        return
    _print_table(rows)


def _print_table(rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="llmp plugins")
    # names are never cut (they are what users type); the component list wraps instead
    for column in ("plugin", "components", "distribution", "version", "status"):
        table.add_column(column, no_wrap=column != "components", overflow="fold")
    for r in rows:
        components = "\n".join(f"{c['kind']} {c['name']}" for c in r["components"]) or "-"
        status = "[green]ok[/]" if r["status"] == "ok" else "[red]broken[/]"
        table.add_row(r["name"], components, r["distribution"], r["version"], status)
    Console().print(table)


@app.command("show")
def show_plugin(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="Plugin name, as in `llmp plugins list`."),
    json_output: bool = typer.Option(False, "--json/--no-json", help="Print JSON."),
    config: Path | None = ConfigOption,
) -> None:
    """Show one plugin: hooks, components, module path and, if broken, its error and traceback."""
    settings = load_settings(PluginsShowSettings, ctx)
    rows = {r["name"]: r for r in describe_plugins()}
    if name not in rows:
        known = ", ".join(sorted(rows)) or "none"
        raise typer.BadParameter(f"no plugin named {name!r}; plugins: {known}", param_hint="NAME")
    row = rows[name]
    if settings.json_output:
        typer.echo(json.dumps(row, indent=2))
        return
    from rich.console import Console

    console = Console()
    status = "[green]ok[/]" if row["status"] == "ok" else "[red]broken[/]"
    console.print(f"[bold]{row['name']}[/] {status}")
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
    for error, tb in zip(row["errors"], row["tracebacks"] + [""] * len(row["errors"]), strict=False):
        console.print("[red]error:[/]", end=" ")
        console.print(error, markup=False, highlight=False)
        if tb:
            console.print(tb, markup=False, highlight=False)
