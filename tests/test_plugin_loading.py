"""In-process behaviour of the plugin kernel: registration, selection, conflicts, failures."""

from __future__ import annotations

import sys
import types

import pytest

from llmp import hookimpl, plugins, registry
from llmp.api import (
    KINDS,
    SPEC_TYPES,
    DuplicateComponentError,
    ExecutorSpec,
    ModelSpec,
    PluginLoadError,
    ToolParserSpec,
    UnknownComponentError,
)

pytestmark = pytest.mark.usefixtures("clean_plugin_env")


class ExecutorPlugin:
    @hookimpl
    def llmp_register_executors(self):
        yield ExecutorSpec(name="toy", impl="collections:OrderedDict", description="a toy")


def test_load_plugins_is_idempotent_and_registers_kernel_defaults():
    pm = plugins.load_plugins()
    assert plugins.load_plugins() is pm
    builtin = [r for r in plugins.plugin_records() if r.builtin]
    assert builtin and all(r.distribution == "llmp" and r.status == "ok" for r in builtin)
    assert {"plugins", "collect-env"} <= set(registry.components("command"))


def test_in_process_plugin_behaves_like_an_installed_one():
    name = plugins.register(ExecutorPlugin(), name="toy-plugin")
    spec = registry.get_component("executor", "toy")
    assert (spec.plugin, spec.distribution, spec.description) == ("toy-plugin", plugins.IN_PROCESS, "a toy")
    from collections import OrderedDict

    assert registry.load_component("executor", "toy") is OrderedDict
    assert any(r.name == name for r in plugins.plugin_records())
    plugins.unregister(name)
    with pytest.raises(UnknownComponentError):
        registry.get_component("executor", "toy")


def test_unknown_name_lists_valid_names_and_their_distributions():
    plugins.register(ExecutorPlugin(), name="toy-plugin")
    with pytest.raises(UnknownComponentError) as info:
        registry.get_component("executor", "nope")
    message = str(info.value)
    assert "unknown executor 'nope'" in message and "toy (from (in-process))" in message


def test_unknown_kind_is_a_value_error():
    with pytest.raises(ValueError, match="unknown component kind 'gizmo'"):
        registry.components("gizmo")


def test_duplicate_names_are_an_error_naming_both_unless_replaced():
    class Second:
        @hookimpl
        def llmp_register_executors(self):
            yield ExecutorSpec(name="toy", impl="collections:Counter")

    plugins.register(ExecutorPlugin(), name="first", distribution="dist-one")
    plugins.register(Second(), name="second", distribution="dist-two")
    with pytest.raises(DuplicateComponentError) as info:
        registry.get_component("executor", "toy")
    assert "dist-one" in str(info.value) and "dist-two" in str(info.value)

    class Replacer:
        @hookimpl
        def llmp_register_executors(self):
            yield ExecutorSpec(name="toy", impl="collections:deque", replace=True)

    plugins.register(Replacer(), name="third", distribution="dist-three")
    assert registry.get_component("executor", "toy").distribution == "dist-three"
    # a later plain record does not undo a replacement; a second replacer conflicts
    plugins.register(ExecutorPlugin(), name="fourth", distribution="dist-four")
    assert registry.get_component("executor", "toy").distribution == "dist-three"
    plugins.register(Replacer(), name="fifth", distribution="dist-five")
    with pytest.raises(DuplicateComponentError, match="dist-five"):
        registry.get_component("executor", "toy")


def test_duplicate_in_strict_mode_raises_at_collection(monkeypatch):
    plugins.register(ExecutorPlugin(), name="first")
    plugins.register(ExecutorPlugin(), name="second")
    monkeypatch.setenv("LLMP_STRICT_PLUGINS", "1")
    with pytest.raises(PluginLoadError, match="registered by both"):
        registry.components("executor")


def test_a_failing_hook_marks_only_its_plugin_broken():
    class Exploding:
        @hookimpl
        def llmp_register_tool_parsers(self):
            raise RuntimeError("boom")

    class Fine:
        @hookimpl
        def llmp_register_tool_parsers(self):
            yield ToolParserSpec(name="fine", impl="json:loads")

    installed = set(registry.components("tool_parser"))  # the parser plugins of this environment
    plugins.register(Exploding(), name="exploding")
    plugins.register(Fine(), name="fine-plugin")
    assert set(registry.components("tool_parser")) == installed | {"fine"}
    record = plugins.get_record("exploding")
    assert record.status == "broken" and "boom" in record.errors[0]
    assert "RuntimeError: boom" in record.tracebacks[0]
    assert plugins.get_record("fine-plugin").status == "ok"


def test_a_failing_hook_raises_in_strict_mode(monkeypatch):
    class Exploding:
        @hookimpl
        def llmp_register_models(self):
            raise RuntimeError("boom")

    plugins.register(Exploding(), name="exploding")
    monkeypatch.setenv("LLMP_STRICT_PLUGINS", "1")
    with pytest.raises(PluginLoadError, match="boom"):
        registry.components("model")


def test_records_of_the_wrong_kind_are_rejected():
    class Confused:
        @hookimpl
        def llmp_register_executors(self):
            yield ModelSpec(name="LlamaForCausalLM", impl="x:y")

    before = registry.components("executor")
    plugins.register(Confused(), name="confused")
    assert registry.components("executor") == before  # the bad record is dropped, the others stay
    assert "LlamaForCausalLM" not in registry.components("executor")
    assert "expected ExecutorSpec" in plugins.get_record("confused").errors[0]


def test_misspelt_hook_is_refused():
    class Typo:
        @hookimpl
        def llmp_register_model(self):  # missing "s"
            return []

    with pytest.raises(PluginLoadError, match="unknown hooks"):
        plugins.register(Typo(), name="typo")
    assert plugins.get_record("typo") is None


def test_hookimpl_with_an_argument_the_spec_lacks_is_refused():
    class BadArgs:
        @hookimpl
        def llmp_engine_started(self, info, extra):
            pass

    with pytest.raises(PluginLoadError, match="cannot register"):
        plugins.register(BadArgs(), name="bad-args")


def test_implementation_is_imported_only_on_selection(tmp_path, monkeypatch):
    (tmp_path / "llmp_lazy_probe.py").write_text("class Heavy:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    class Lazy:
        @hookimpl
        def llmp_register_kernels(self):
            yield SPEC_TYPES["kernels"](name="lazy", impl="llmp_lazy_probe:Heavy")

    plugins.register(Lazy(), name="lazy")
    registry.all_components()
    assert "llmp_lazy_probe" not in sys.modules
    assert registry.load_component("kernels", "lazy").__name__ == "Heavy"
    assert "llmp_lazy_probe" in sys.modules


def test_a_module_registers_like_an_object():
    module = types.ModuleType("llmp_inline_module")

    @hookimpl
    def llmp_register_frontends():
        yield SPEC_TYPES["frontend"](name="inline", impl="json:dumps")

    module.llmp_register_frontends = llmp_register_frontends
    assert plugins.register(module) == "llmp_inline_module"
    assert registry.get_component("frontend", "inline").plugin == "llmp_inline_module"


def test_every_kind_has_a_registration_hook():
    pm = plugins.load_plugins()
    for kind in KINDS:
        assert hasattr(pm.hook, registry.HOOK_FOR_KIND[kind])


def test_spec_validation():
    with pytest.raises(ValueError, match="must be 'package.module:attribute'"):
        ExecutorSpec(name="x", impl="no_colon")
    with pytest.raises(ValueError, match="non-empty"):
        ExecutorSpec(name="", impl="a:b")
