"""``llmp plugins list`` and ``llmp plugins show``.

Reads records only: no component is imported, so torch, transformers and
triton stay out of the process.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import typer

from llmp import plugins, registry
from llmp.api import KINDS
from llmp.cli.options import options_command
from llmp.options import option

app = typer.Typer(help="List and inspect plugins.", no_args_is_help=True)


@dataclass(frozen=True, kw_only=True)
class PluginsListOptions:
    json_output: bool = option(False, "Print JSON instead of a table.", flag="--json/--no-json")
    kind: str | None = option(None, f"Only plugins providing this kind: {', '.join(KINDS)}.")


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
    """List every plugin, its kinds, components, distribution, version and status."""
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
@options_command
def show_plugin(settings: PluginsShowOptions) -> None:
    """Show one plugin: hooks, components, module path and, if broken, its error and traceback."""
    rows = {r["name"]: r for r in describe_plugins()}
    if settings.name not in rows:
        known = ", ".join(sorted(rows)) or "none"
        raise typer.BadParameter(f"no plugin named {settings.name!r}; plugins: {known}", param_hint="NAME")
    row = rows[settings.name]
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
