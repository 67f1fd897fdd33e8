"""Who imports what: plugins use only llmp's public modules, and the kernel's layers import downwards, in no circle.

Imports are read from the source with ``ast``: module-level ones and those inside functions
(lazy imports are still dependencies); those under ``if TYPE_CHECKING:`` are annotations only.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import llmp
from llmp.api import PUBLIC_MODULES, is_public_module

REPO = Path(__file__).resolve().parents[1]
CORE = REPO / "core" / "llmp"

# The kernel's layers, lowest first: a module may import from its own layer and those below, never above.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "records",
        (
            "llmp",  # the package itself: its __init__ (hookimpl, lazy user API)
            "llmp.api",
            "llmp.options",
            "llmp.inputs",
            "llmp.sampling_params",
            "llmp.pooling_params",
            "llmp.lora",
            "llmp.outputs",
            "llmp.hookspecs",
            "llmp.config",
            "llmp.progress",  # log set-up and progress bars: stdlib only, rich and torch imported when used
            "llmp.quantization",  # GGML block formats: torch only
        ),
    ),
    ("plugins", ("llmp.plugins", "llmp.registry", "llmp.builtins")),
    ("models", ("llmp.model_files", "llmp.modeling", "llmp.chat_template", "llmp.scoring")),
    ("engine", ("llmp.engine", "llmp.executor", "llmp.scheduling")),
    ("entry points", ("llmp.llm", "llmp.async_llm", "llmp.beam_search")),
    ("front-ends", ("llmp.parsing", "llmp.frontend")),
    ("server", ("llmp.server",)),
    ("commands", ("llmp.cli", "llmp.testing", "llmp.conformance", "llmp.scaffold", "llmp.__main__")),
]


# -- reading imports ---------------------------------------------------------------------------


def module_names(package_dir: Path) -> dict[str, Path]:
    """Dotted name -> file of every module of the package at ``package_dir``."""
    names = {}
    for path in package_dir.rglob("*.py"):
        parts = list(path.relative_to(package_dir.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imported_names(path: Path, module: str) -> Iterator[tuple[str, str | None]]:
    """``(module, name)`` of every runtime import in the file: ``name`` is what ``from module import
    name`` takes (None for ``import module``). Relative imports are made absolute."""

    def visit(node: ast.AST) -> Iterator[tuple[str, str | None]]:
        for child in ast.iter_child_nodes(node):
            if _is_type_checking(child):
                continue
            if isinstance(child, ast.Import):
                yield from ((alias.name, None) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                    package = package[: len(package) - (child.level - 1)]
                    base = ".".join(package + ([child.module] if child.module else []))
                yield from ((base, alias.name) for alias in child.names)
            yield from visit(child)

    yield from visit(ast.parse(path.read_text(), filename=str(path)))


def llmp_module_of(base: str, name: str | None, known: set[str]) -> str:
    """The llmp module an import loads: ``from llmp import registry`` is ``llmp.registry``,
    ``from llmp import LLM`` is where the package's lazy ``LLM`` lives (``llmp.llm``)."""
    if name is not None and f"{base}.{name}" in known:
        return f"{base}.{name}"
    if base == "llmp" and name in llmp._LAZY:
        return llmp._LAZY[name]
    return base


def import_graph(package_dir: Path) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports."""
    modules = module_names(package_dir)
    top = package_dir.name
    graph = {}
    for module, path in modules.items():
        targets = set()
        for base, name in imported_names(path, module):
            if base.split(".")[0] != top:
                continue
            target = llmp_module_of(base, name, set(modules))
            while target not in modules:  # an attribute of a module, not a module
                target = target.rpartition(".")[0]
            targets.add(target)
        targets.discard(module)
        graph[module] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph[node]):
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return found


def layer_of(module: str) -> int:
    for number, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or (prefix != "llmp" and module.startswith(prefix + ".")):
                return number
    raise AssertionError(f"{module} is in no layer: add it to LAYERS in {Path(__file__).name}")


# -- plugins use the public modules only -------------------------------------------------------

PLUGIN_PACKAGES = sorted(p for p in REPO.glob("plugins/*/*/llmp_*") if p.is_dir())
PLUGIN_SOURCES = sorted(
    [
        *(p for package in PLUGIN_PACKAGES for p in package.rglob("*.py")),
        *REPO.glob("plugins/*/*/tests/**/*.py"),
        *REPO.glob("examples/**/*.py"),
        *REPO.glob("tests/fixtures/**/*.py"),
    ]
)
CORE_MODULES = set(module_names(CORE))


def test_there_are_plugin_sources_to_check():
    assert len(PLUGIN_PACKAGES) >= 15 and len(PLUGIN_SOURCES) > 100


def imported_llmp_modules(path: Path) -> Iterator[str]:
    """The llmp modules a plugin's file imports; ``from llmp import LLM`` is the package ``llmp``."""
    for base, name in imported_names(path, path.stem):
        if base.split(".")[0] == "llmp":
            yield f"{base}.{name}" if f"{base}.{name}" in CORE_MODULES else base


def test_plugins_examples_and_fixtures_import_only_public_modules():
    private = [
        f"{path.relative_to(REPO)}: {module}"
        for path in PLUGIN_SOURCES
        for module in imported_llmp_modules(path)
        if not is_public_module(module)
    ]
    assert not private, "imports of private llmp modules (see llmp.api.PUBLIC_MODULES):\n" + "\n".join(private)


def test_the_check_sees_a_private_import(tmp_path: Path):
    source = tmp_path / "plugin.py"
    source.write_text(
        "from llmp import LLM, registry\nfrom llmp.modeling import decoder\n"
        "def f():\n    from llmp.engine.worker import Worker\n"
    )
    found = set(imported_llmp_modules(source))
    assert found == {"llmp", "llmp.registry", "llmp.modeling.decoder", "llmp.engine.worker"}
    assert [m for m in sorted(found) if not is_public_module(m)] == ["llmp.engine.worker"]


# -- the public modules -------------------------------------------------------------------------


def public_module_names() -> list[str]:
    modeling = sorted(m for m in CORE_MODULES if m.startswith("llmp.modeling."))
    return [*PUBLIC_MODULES, *modeling]


@pytest.mark.parametrize("name", public_module_names())
def test_every_name_a_public_module_exports_imports(name: str):
    module = importlib.import_module(name)
    assert (module.__doc__ or "").strip(), f"{name} has no docstring"
    exported = getattr(module, "__all__", None)
    assert exported, f"{name} has no __all__"
    for attribute in exported:
        namespace: dict = {}
        exec(f"from {name} import {attribute}", namespace)
        assert namespace[attribute] is not None, (name, attribute)


LIGHT_MODULES = [
    "llmp",
    "llmp.api",
    "llmp.options",
    "llmp.cli.options",
    "llmp.parsing",
    "llmp.frontend",
    "llmp.executor",
    "llmp.scheduling",
    "llmp.registry",
    "llmp.plugins",
    "llmp.testing",
    "llmp.modeling",
]


def test_the_light_public_modules_import_no_torch():
    code = (
        f"import sys\nfor name in {LIGHT_MODULES!r}:\n    __import__(name)\n"
        "import llmp.frontend, llmp.options\n"
        "from llmp import SamplingParams, PoolingParams, Prompt, StructuredOutputsParams, hookimpl\n"
        "print(sorted(m for m in ('torch', 'transformers', 'triton', 'fastapi') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# -- layers and circles -------------------------------------------------------------------------


def test_every_kernel_module_is_in_a_layer():
    for module in CORE_MODULES:
        layer_of(module)


def test_no_kernel_module_imports_from_a_higher_layer():
    graph = import_graph(CORE)
    upward = [
        f"{module} ({LAYERS[layer_of(module)][0]}) imports {target} ({LAYERS[layer_of(target)][0]})"
        for module, targets in sorted(graph.items())
        for target in sorted(targets)
        if layer_of(target) > layer_of(module)
    ]
    assert not upward, "imports up the layers:\n" + "\n".join(upward)


@pytest.mark.parametrize("package", [CORE, *PLUGIN_PACKAGES], ids=lambda p: p.name)
def test_no_import_circle(package: Path):
    assert cycles(import_graph(package)) == []


def test_the_circle_check_finds_a_circle(tmp_path: Path):
    package = tmp_path / "llmp_circle"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from llmp_circle.b import x\n")
    (package / "b.py").write_text("def f():\n    from llmp_circle import a\n")
    (package / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from llmp_circle import a\n"
    )
    assert cycles(import_graph(package)) == [["llmp_circle.a", "llmp_circle.b"]]
