"""Discover, load and register plugins: one loader for every process.

Installed plugins are the entry points of group ``llmp``. stevedore loads
them, its load-failure callback isolates a plugin that fails to import, and
every module that loads is registered into one pluggy ``PluginManager``,
which dispatches the hooks of ``llmp.hookspecs``. The kernel's own defaults
are entry points of the ``llmp`` distribution and load the same way.

Environment switches:

* ``LLMP_LOAD_PLUGINS``: unset = every installed plugin; empty = none but
  the kernel's own; otherwise a comma list of distribution names to load.
* ``LLMP_STRICT_PLUGINS=1``: a plugin that fails to load raises
  :class:`llmp.api.PluginLoadError` instead of being reported and skipped
  (:class:`llmp.api.IncompatiblePluginError` for one made for another plugin API).
* ``LLMP_TRACE_PLUGINS=1``: print every hook call to stderr.
"""

from __future__ import annotations

import importlib.metadata
import itertools
import logging
import os
import sys
import traceback
from dataclasses import dataclass, field
from typing import Any

import pluggy

from llmp import hookspecs
from llmp.api import IncompatiblePluginError, PluginLoadError

__all__ = ["PluginRecord", "get_record", "load_plugins", "plugin_records", "register", "unregister"]

log = logging.getLogger("llmp.plugins")

ENTRY_POINT_GROUP = "llmp"
KERNEL_DISTRIBUTION = "llmp"
IN_PROCESS = "(in-process)"


@dataclass
class PluginRecord:
    """What the kernel knows about one plugin, loaded or not."""

    name: str
    distribution: str
    version: str
    module: str
    builtin: bool = False
    errors: list[str] = field(default_factory=list)
    tracebacks: list[str] = field(default_factory=list)
    #: why the plugin was refused, when its ``require_api`` range excludes this llmp's API:
    #: ``needs llmp API >=0.6 (this llmp has 0.5)`` (also its first error)
    incompatible: str = ""

    @property
    def status(self) -> str:
        """``ok``, ``broken`` (it failed to load: see ``errors``) or ``incompatible`` (made for another API)."""
        if self.incompatible:
            return "incompatible"
        return "broken" if self.errors else "ok"


@dataclass
class _State:
    pm: pluggy.PluginManager | None = None
    pid: int | None = None
    records: dict[str, PluginRecord] = field(default_factory=dict)
    generation: int = 0  # bumped on every (un)registration; registries cache by it


_state = _State()
_generations = itertools.count(1)  # process-wide, so a fresh _State never reuses a number


def _bump() -> None:
    _state.generation = next(_generations)


def is_strict() -> bool:
    return os.environ.get("LLMP_STRICT_PLUGINS", "").strip().lower() in {"1", "true", "yes", "on"}


def _normalize(distribution: str) -> str:
    return distribution.lower().replace("_", "-").replace(".", "-")


def _allowed_distributions() -> set[str] | None:
    raw = os.environ.get("LLMP_LOAD_PLUGINS")
    if raw is None:
        return None
    return {_normalize(d) for d in raw.split(",") if d.strip()} | {KERNEL_DISTRIBUTION}


def record_failure(name: str, exc: BaseException, during: str) -> None:
    """Mark plugin ``name`` broken (incompatible, for an ``IncompatiblePluginError``); in strict
    mode raise ``PluginLoadError``."""
    record = _state.records.setdefault(name, PluginRecord(name, "?", "", "?"))
    if isinstance(exc, IncompatiblePluginError):
        _record_incompatible(record, exc)
        return
    message = f"{during}: {type(exc).__name__}: {exc}"
    record.errors.append(message)
    record.tracebacks.append("".join(traceback.format_exception(exc)))
    _bump()
    if is_strict():
        raise PluginLoadError(f"plugin {name!r} ({record.distribution}) failed while {message}") from exc
    log.warning("plugin %r (%s) is broken, %s; see `llmp plugins show %s`", name, record.distribution, message, name)


def _record_incompatible(record: PluginRecord, exc: IncompatiblePluginError) -> None:
    """A plugin made for another API: listed with the range it needs, none of it registered, no traceback
    (nothing is wrong with it but the version)."""
    if _state.pm is not None and _state.pm.get_plugin(record.name) is not None:  # refused by a hook, not at import
        _state.pm.unregister(name=record.name)
    record.incompatible = exc.reason
    record.errors.append(exc.reason)
    record.tracebacks.append("")
    _bump()
    if is_strict():
        raise IncompatiblePluginError(
            exc.specifier, exc.api_version, f"{record.name!r} ({record.distribution})"
        ) from exc
    log.warning(
        "plugin %r (%s) is incompatible: %s; install a release of it made for this llmp, or uninstall it",
        record.name,
        record.distribution,
        exc.reason,
    )


def get_plugin_manager() -> pluggy.PluginManager:
    """The process's plugin manager, loading plugins first if needed."""
    return load_plugins()


def load_plugins() -> pluggy.PluginManager:
    """Load every allowed plugin once per process; later calls return the same manager.

    Every process entry point calls this (CLI, server, engine process, each
    worker). After a ``fork`` the child starts afresh, because the parent's
    in-process registrations are not the child's to assume.
    """
    if _state.pm is not None and _state.pid == os.getpid():
        return _state.pm
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    if os.environ.get("LLMP_TRACE_PLUGINS"):
        pm.trace.root.setwriter(sys.stderr.write)
        pm.enable_tracing()
    _state.pm, _state.pid, _state.records = pm, os.getpid(), {}
    _bump()
    _load_entry_points(pm)
    return pm


def _load_entry_points(pm: pluggy.PluginManager) -> None:
    allowed = _allowed_distributions()
    candidates: dict[str, list[importlib.metadata.EntryPoint]] = {}
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        candidates.setdefault(ep.name, []).append(ep)

    wanted: list[str] = []
    for name, eps in candidates.items():
        dists = [_distribution_of(ep) for ep in eps]
        if allowed is not None and not any(_normalize(d) in allowed for d, _ in dists):
            continue
        dist, version = dists[0]
        _state.records[name] = PluginRecord(
            name, dist, version, eps[0].value, builtin=_normalize(dist) == KERNEL_DISTRIBUTION
        )
        if len({d for d, _ in dists}) > 1:
            both = " and ".join(sorted({d for d, _ in dists}))
            record_failure(name, LookupError(f"plugin name {name!r} is provided by {both}"), "discovering")
            continue
        wanted.append(name)
    if not wanted:
        return

    from stevedore import NamedExtensionManager  # imported here: only needed when something loads

    failed: set[str] = set()

    def on_failure(_manager: Any, ep: importlib.metadata.EntryPoint, exc: BaseException) -> None:
        failed.add(ep.name)
        record_failure(ep.name, exc, "importing")

    def on_missing(names: Any) -> None:  # seen by importlib.metadata, not by stevedore: never drop one silently
        for name in sorted(set(names) - failed):  # one that failed to import is reported once, above
            record_failure(name, LookupError(f"entry point {name!r} disappeared while loading"), "discovering")

    # stevedore caches a group's entry points per process; a (re)load must see the installed set as it is now
    NamedExtensionManager.ENTRY_POINT_CACHE.pop(ENTRY_POINT_GROUP, None)
    manager = NamedExtensionManager(
        ENTRY_POINT_GROUP,
        names=wanted,
        on_load_failure_callback=on_failure,
        on_missing_entrypoints_callback=on_missing,
    )
    loaded = {ext.name: ext.plugin for ext in manager}
    # Kernel defaults first, then the rest by name: a stable order for hooks and conflicts.
    for name in sorted(loaded, key=lambda n: (not _state.records[n].builtin, n)):
        _register(pm, loaded[name], name)


def _distribution_of(ep: importlib.metadata.EntryPoint) -> tuple[str, str]:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return "?", ""
    return dist.metadata["Name"] or dist.name, dist.version


def _register(pm: pluggy.PluginManager, plugin: object, name: str) -> bool:
    try:
        pm.register(plugin, name=name)
    except Exception as exc:
        record_failure(name, exc, "registering")
        return False
    unknown = _unknown_hooks(pm, plugin)
    if unknown:
        pm.unregister(plugin)
        record_failure(name, LookupError(f"implements unknown hooks {unknown} (misspelt?)"), "registering")
        return False
    _bump()
    return True


def _unknown_hooks(pm: pluggy.PluginManager, plugin: object) -> list[str]:
    """Hooks a plugin implements that no spec declares: almost always a typo."""
    return [hc.name for hc in pm.get_hookcallers(plugin) or [] if not hc.has_spec()]


def register(
    plugin: object,
    name: str | None = None,
    *,
    distribution: str = IN_PROCESS,
    version: str = "",
) -> str:
    """Register a plugin object or module in this process, without packaging it.

    It then behaves exactly like an installed plugin: its components are
    selectable by name and it appears in ``llmp plugins list``. Returns the
    plugin name (the object's ``__name__`` by default). Raises
    :class:`PluginLoadError` if the object does not validate against the hook
    specifications.
    """
    pm = load_plugins()
    name = name or getattr(plugin, "__name__", None) or type(plugin).__name__
    if pm.has_plugin(name) or name in _state.records:
        raise PluginLoadError(f"a plugin named {name!r} is already registered")
    module = getattr(plugin, "__module__", None) or getattr(plugin, "__name__", "") or type(plugin).__module__
    _state.records[name] = PluginRecord(name, distribution, version, module)
    try:
        pm.register(plugin, name=name)
    except Exception as exc:
        del _state.records[name]
        raise PluginLoadError(f"cannot register {name!r}: {exc}") from exc
    unknown = _unknown_hooks(pm, plugin)
    if unknown:
        pm.unregister(plugin)
        del _state.records[name]
        raise PluginLoadError(f"{name!r} implements unknown hooks {unknown} (misspelt?)")
    _bump()
    return name


def unregister(name: str) -> None:
    """Remove a plugin registered in this process (tests use this in fixtures)."""
    pm = load_plugins()
    if pm.get_plugin(name) is not None:
        pm.unregister(name=name)
    _state.records.pop(name, None)
    _bump()


def plugin_records() -> list[PluginRecord]:
    """Every plugin seen in this process, loaded or broken, in registration order."""
    load_plugins()
    return list(_state.records.values())


def get_record(name: str) -> PluginRecord | None:
    load_plugins()
    return _state.records.get(name)


def generation() -> int:
    return _state.generation
