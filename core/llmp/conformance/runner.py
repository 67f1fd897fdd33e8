"""Run the suite of each kind a plugin provides against the installed plugin."""

from __future__ import annotations

import importlib
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmp.conformance.report import CheckResult, Report

# kind -> "module:function" of its suite: suite(spec: ComponentSpec, context: Context) -> Iterable[Check]
SUITES: dict[str, str] = {
    "model": "llmp.conformance.models:suite",
    "kernels": "llmp.conformance.kernels:suite",
    "executor": "llmp.conformance.executors:suite",
    "frontend": "llmp.conformance.frontends:suite",
    "lora_resolver": "llmp.conformance.misc:lora_resolver_suite",
    "tool_parser": "llmp.conformance.parsers:tool_parser_suite",
    "reasoning_parser": "llmp.conformance.parsers:reasoning_parser_suite",
    "scheduler": "llmp.conformance.scheduling:scheduler_suite",
    "kv_manager": "llmp.conformance.scheduling:kv_manager_suite",
    "stat_logger": "llmp.conformance.misc:stat_logger_suite",
    "command": "llmp.conformance.misc:command_suite",
}


class SkipCheck(Exception):
    """Raised by a check that does not apply to this component; the message says why."""


@dataclass(frozen=True)
class Check:
    """A named check: ``run()`` returns on success, raises AssertionError (with a precise
    message) on failure, SkipCheck when it does not apply."""

    name: str
    run: Callable[[], Any]


@dataclass
class Context:
    """What the suites share for one ``verify``: a scratch directory (removed afterwards) and
    a cache for what several checks build once (a tiny model directory, a server)."""

    workdir: Path
    cache: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)  # verify(..., **options): per-suite knobs

    def once(self, key: str, build: Callable[[], Any]) -> Any:
        """``build()`` the first time ``key`` is asked for, the same value afterwards."""
        if key not in self.cache:
            self.cache[key] = build()
        return self.cache[key]


def _suite(kind: str) -> Callable[[Any, Context], Iterable[Check]]:
    module, _, attribute = SUITES[kind].partition(":")
    return getattr(importlib.import_module(module), attribute)


def _run_check(kind: str, component: str, check: Check) -> CheckResult:
    started = time.perf_counter()
    status, detail = "passed", ""
    try:
        check.run()
    except SkipCheck as skip:
        status, detail = "skipped", str(skip)
    except AssertionError as failure:
        status, detail = "failed", str(failure) or "assertion failed (no message)"
    except Exception as error:  # a check that crashes is a failure of the plugin, with where it crashed
        status = "failed"
        detail = f"{type(error).__name__}: {error}\n" + "".join(traceback.format_tb(error.__traceback__)[-3:])
    return CheckResult(kind, component, check.name, status, detail, time.perf_counter() - started)


def verify(plugin: str, *, kinds: Iterable[str] | None = None, **options: Any) -> Report:
    """Run the conformance suite of every component plugin ``plugin`` provides (of ``kinds`` only,
    when given). ``options`` are per-suite knobs (see each suite's docstring). Never raises for a
    plugin that fails: the report says what failed."""
    from llmp import plugins, registry
    from llmp.api import API_VERSION, KINDS

    record = plugins.get_record(plugin)
    report = Report(plugin, record.distribution if record else "?", record.version if record else "", API_VERSION)
    if record is None:
        installed = ", ".join(sorted(r.name for r in plugins.plugin_records())) or "none"
        report.error = f"no plugin named {plugin!r} is installed (installed: {installed})" + _no_entry_point(plugin)
        return report
    components = registry.all_components()  # first: a registration hook that fails breaks the plugin
    if record.status != "ok":
        report.error = f"the plugin is {record.status}: {'; '.join(record.errors)}"
        return report
    wanted = set(kinds) if kinds is not None else None
    specs = [
        spec
        for kind, by_name in components.items()
        for spec in by_name.values()
        if spec.plugin == plugin and (wanted is None or kind in wanted)
    ]
    # a component whose name another plugin also claims is in no registry: it fails here, by name
    for kind in [k for k in KINDS if wanted is None or k in wanted]:
        for name, conflict in registry.conflicts(kind).items():
            if plugin in conflict.plugins:
                report.results.append(CheckResult(kind, name, "its name is registered once", "failed", str(conflict)))
    if not specs:
        if not report.results:
            which = f" of kind {', '.join(sorted(wanted))}" if wanted else ""
            report.error = "the plugin provides no components" + which
        return report
    with tempfile.TemporaryDirectory(prefix=f"llmp-verify-{plugin}-") as workdir:
        context = Context(Path(workdir), options=options)
        try:
            for spec in specs:
                for check in _suite(spec.kind)(spec, context):
                    report.results.append(_run_check(spec.kind, spec.name, check))
        finally:
            for value in context.cache.values():  # servers and engines the suites kept: closed here
                close = getattr(value, "close", None) or getattr(value, "stop", None)
                if callable(close):
                    try:
                        close()
                    except Exception:
                        pass
    return report


def _no_entry_point(plugin: str) -> str:
    """A hint when a distribution of the plugin's name (``NAME`` or ``llmp-NAME``) is installed without
    an ``llmp`` entry point: what a plugin whose pyproject.toml lost it looks like."""
    from importlib.metadata import PackageNotFoundError, distribution

    for name in (f"llmp-{plugin}", plugin):
        try:
            found = distribution(name)
        except PackageNotFoundError:
            continue
        if not any(entry.group == "llmp" for entry in found.entry_points):
            return (
                f"; the distribution {found.metadata['Name']} is installed but declares no entry point in the "
                '"llmp" group ([project.entry-points.llmp] in its pyproject.toml)'
            )
    return ""


def assert_conforms(plugin: str, *, kinds: Iterable[str] | None = None, **options: Any) -> Report:
    """For a plugin's own tests: ``verify`` and raise AssertionError with the failures if any."""
    report = verify(plugin, kinds=kinds, **options)
    if not report.passed:
        lines = [report.summary()] + [f"{r.kind} {r.component}: {r.check}: {r.detail}" for r in report.failed]
        raise AssertionError("\n".join(lines))
    return report
