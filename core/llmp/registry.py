"""Component registries: collect records from registration hooks, select by name.

A registry is built once per kind (and rebuilt only when a plugin is
registered or removed), so selecting a component is a dict lookup. Nothing
here is on the engine's per-step path: the engine resolves its components at
start-up and keeps plain objects.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from llmp import plugins
from llmp.api import (
    KINDS,
    SPEC_TYPES,
    ComponentSpec,
    DuplicateComponentError,
    IncompatiblePluginError,
    PluginLoadError,
    UnknownComponentError,
)

__all__ = [
    "all_components",
    "components",
    "conflicts",
    "get_component",
    "load_component",
    "select_kernels",
    "select_model",
]

HOOK_FOR_KIND: dict[str, str] = {
    "model": "llmp_register_models",
    "kernels": "llmp_register_kernels",
    "executor": "llmp_register_executors",
    "frontend": "llmp_register_frontends",
    "lora_resolver": "llmp_register_lora_resolvers",
    "tool_parser": "llmp_register_tool_parsers",
    "reasoning_parser": "llmp_register_reasoning_parsers",
    "scheduler": "llmp_register_schedulers",
    "kv_manager": "llmp_register_kv_managers",
    "stat_logger": "llmp_register_stat_loggers",
    "command": "llmp_register_commands",
}
assert set(HOOK_FOR_KIND) == set(KINDS)


@dataclass
class _KindRegistry:
    specs: dict[str, ComponentSpec] = field(default_factory=dict)
    conflicts: dict[str, DuplicateComponentError] = field(default_factory=dict)


_cache: dict[str, _KindRegistry] = {}
_cache_generation = -1


def _check_kind(kind: str) -> None:
    if kind not in HOOK_FOR_KIND:
        raise ValueError(f"unknown component kind {kind!r}; kinds are: {', '.join(KINDS)}")


def _collect(kind: str) -> _KindRegistry:
    pm = plugins.load_plugins()
    expected = SPEC_TYPES[kind]
    registry = _KindRegistry()
    hook_name = HOOK_FOR_KIND[kind]
    # Each plugin's implementation is called on its own (through pluggy, so
    # tracing still sees it) to stamp every record with the plugin that gave
    # it; hookimpls come in registration order, so later plugins may replace.
    for impl in getattr(pm.hook, hook_name).get_hookimpls():
        record = plugins.get_record(impl.plugin_name)
        dist = record.distribution if record else "?"
        version = record.version if record else ""
        others = [p for name, p in pm.list_name_plugin() if name != impl.plugin_name and p is not None]
        try:
            results = pm.subset_hook_caller(hook_name, remove_plugins=others)()
            specs = [spec for result in results for spec in (result or ())]
            bad = [s for s in specs if type(s) is not expected and not isinstance(s, expected)]
            if bad:
                raise TypeError(f"{hook_name} returned {bad[0]!r}; expected {expected.__name__} records")
        except IncompatiblePluginError as exc:  # require_api in a hook: the plugin is refused, not the process
            plugins.record_failure(impl.plugin_name, exc, f"running {hook_name}")
            continue
        except PluginLoadError:
            raise
        except Exception as exc:
            plugins.record_failure(impl.plugin_name, exc, f"running {hook_name}")
            continue
        for spec in specs:
            _add(registry, kind, spec.stamped(impl.plugin_name, dist, version))
    return registry


def _add(registry: _KindRegistry, kind: str, spec: ComponentSpec) -> None:
    existing = registry.specs.get(spec.name)
    # replace=True wins whatever the registration order; two replacers still conflict
    if existing is None or (spec.replace and not existing.replace):
        registry.specs[spec.name] = spec
        registry.conflicts.pop(spec.name, None)
        return
    if existing.replace and not spec.replace:
        return
    error = DuplicateComponentError(
        kind,
        spec.name,
        f"{existing.distribution} (plugin {existing.plugin})",
        f"{spec.distribution} (plugin {spec.plugin})",
        plugins=(existing.plugin, spec.plugin),
    )
    if plugins.is_strict():
        raise PluginLoadError(str(error)) from error
    registry.conflicts[spec.name] = error


def _registry(kind: str) -> _KindRegistry:
    global _cache_generation
    _check_kind(kind)
    plugins.load_plugins()
    if _cache_generation != plugins.generation():
        _cache.clear()
        _cache_generation = plugins.generation()
    if kind not in _cache:
        registry = _collect(kind)
        # collecting may itself mark plugins broken; that must not discard this result
        _cache_generation = plugins.generation()
        _cache[kind] = registry
    return _cache[kind]


def components(kind: str) -> dict[str, ComponentSpec]:
    """Every registered component of ``kind``, by name."""
    return dict(_registry(kind).specs)


def conflicts(kind: str) -> dict[str, DuplicateComponentError]:
    """Names of ``kind`` claimed by two plugins with neither replacing the other."""
    return dict(_registry(kind).conflicts)


def get_component(kind: str, name: str) -> ComponentSpec:
    """The record of component ``name`` of ``kind``.

    Raises :class:`UnknownComponentError` (listing the valid names and their
    distributions) or :class:`DuplicateComponentError`.
    """
    registry = _registry(kind)
    if name in registry.conflicts:
        raise registry.conflicts[name]
    try:
        return registry.specs[name]
    except KeyError:
        available = {n: s.distribution for n, s in registry.specs.items()}
        raise UnknownComponentError(kind, name, available) from None


def load_component(kind: str, name: str) -> Any:
    """Import and return the implementation of component ``name`` of ``kind``."""
    return get_component(kind, name).load()


def all_components() -> dict[str, dict[str, ComponentSpec]]:
    """Every registered component of every kind."""
    return {kind: components(kind) for kind in KINDS}


def select_model(architectures: list[str], model_impl: str) -> ComponentSpec:
    """The model record serving ``architectures``: the first a record is named after exactly, else
    the first a ``*Suffix`` record claims (``*ForSequenceClassification``; the longest suffix wins),
    else the record named ``"*"``.

    ``model_impl`` ``"native"`` or ``"transformers"`` restricts the choice; ``"auto"`` takes any
    record, so a native one named after the architecture comes before the fallbacks.
    """
    if model_impl not in ("auto", "native", "transformers"):
        raise ValueError(f"model_impl must be auto, native or transformers, got {model_impl!r}")
    specs = components("model")
    allowed = [s for s in specs.values() if model_impl == "auto" or getattr(s, "model_impl", "native") == model_impl]
    exact = {s.name: s for s in allowed}
    for arch in architectures:
        if arch in exact:
            return exact[arch]
    patterns = sorted((s for s in allowed if s.name.startswith("*") and s.name != "*"), key=lambda s: -len(s.name))
    for arch in architectures:
        for spec in patterns:
            if arch.endswith(spec.name[1:]):
                return spec
    if "*" in exact:
        return exact["*"]
    supported = {s.name: s.distribution for s in allowed if s.name != "*"}
    wanted = ", ".join(architectures) or "(config.json names no architectures)"
    raise UnknownComponentError("model", wanted, supported)


def select_kernels(name: str | None, device: str) -> ComponentSpec:
    """The kernel set named ``name``, or the highest-priority one that runs on ``device``."""
    if name:
        return get_component("kernels", name)
    candidates = [s for s in components("kernels").values() if device in getattr(s, "devices", ())]
    if not candidates:
        raise UnknownComponentError(
            "kernels", f"(any for device {device!r})", {n: s.distribution for n, s in components("kernels").items()}
        )
    return max(candidates, key=lambda s: getattr(s, "priority", 0))
