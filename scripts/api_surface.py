"""The public surface of llmp's plugin API, as stable text: what ``tests/api_surface.json`` records.

For every public module (``llmp.api.PUBLIC_MODULES`` and each ``llmp.modeling`` submodule) it lists
the names of ``__all__``: a function's signature, a class's bases, dataclass fields and public
members (with signatures), an enum's members, a constant's type (and the items of a tuple of names).
Docstrings, help texts, default values (only whether a parameter has one) and private names are left
out: changing them never breaks a plugin, and every line here is one a plugin may rely on.

    python scripts/api_surface.py           # differences from the snapshot; exit 1 when there are some
    python scripts/api_surface.py --write   # record the surface of this llmp as API_VERSION's

``tests/test_api_version.py`` fails when the surface differs from the snapshot while
``llmp.api.API_VERSION`` is the snapshot's (see "API versioning" in ``docs/plugins.md``).
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import importlib
import inspect
import json
import pkgutil
import re
import sys
from pathlib import Path
from typing import Any

SNAPSHOT = Path(__file__).resolve().parents[1] / "tests" / "api_surface.json"

# an object's address or a temporary path in a default's repr would change from run to run
_UNSTABLE = re.compile(r" at 0x[0-9a-fA-F]+")


def public_modules() -> list[str]:
    """``PUBLIC_MODULES`` and every submodule of ``llmp.modeling`` (public, as :func:`is_public_module` says)."""
    from llmp.api import PUBLIC_MODULES

    modeling = importlib.import_module("llmp.modeling")
    submodules = sorted(f"llmp.modeling.{m.name}" for m in pkgutil.iter_modules(modeling.__path__))
    return [*PUBLIC_MODULES, *submodules]


def compute_surface() -> dict[str, dict[str, list[str]]]:
    """``{module: {name: [lines]}}``: every public name of every public module, described."""
    surface = {}
    for module_name in public_modules():
        module = importlib.import_module(module_name)
        names = getattr(module, "__all__", None)
        if names is None:  # every public module has an __all__ (docs/plugins.md); say so rather than guess
            raise SystemExit(f"{module_name} has no __all__")
        surface[module_name] = {name: describe(_attribute(module, name)) for name in sorted(names)}
    return surface


def _attribute(module: Any, name: str) -> Any:
    if hasattr(module, name):
        return getattr(module, name)
    return importlib.import_module(f"{module.__name__}.{name}")  # a submodule __all__ names (llmp.modeling)


def describe(obj: Any) -> list[str]:
    """A public object as lines of text that change only when what a plugin can rely on changes."""
    if inspect.ismodule(obj):
        return ["module"]
    if inspect.isclass(obj):
        return _describe_class(obj)
    if inspect.isroutine(obj):
        return [_function_line(obj)]
    if type(obj).__module__ in ("typing", "types", "typing_extensions"):  # aliases: Literal[...], Any, X | None
        return [f"alias {_stable(repr(obj))}"]
    if isinstance(obj, (tuple, list, frozenset, set)) and all(isinstance(item, str) for item in obj):
        items = sorted(obj) if isinstance(obj, (frozenset, set)) else list(obj)
        return [f"{type(obj).__name__} {json.dumps(items)}"]  # KINDS, PUBLIC_MODULES: their items are the API
    return [type(obj).__name__]  # other constants and instances (a version string, hookimpl): the type only


def _describe_class(cls: type) -> list[str]:
    bases = ", ".join(_qualname(base) for base in cls.__bases__ if base is not object)
    lines = [f"class {cls.__name__}({bases})" if bases else f"class {cls.__name__}"]
    if issubclass(cls, enum.Enum):
        return lines + [f"member {member.name} = {_stable(repr(member.value))}" for member in cls]
    if dataclasses.is_dataclass(cls):
        params = cls.__dataclass_params__  # type: ignore[attr-defined]
        lines.append(f"dataclass frozen={params.frozen}")
        positional = [f for f in dataclasses.fields(cls) if f.init and not f.kw_only]
        lines += [_field_line(f, positional.index(f) if f in positional else None) for f in dataclasses.fields(cls)]
    else:
        lines.append(f"init{_signature(cls)}")
    for name, value in sorted(_own_llmp_members(cls).items()):
        lines.append(_member_line(name, value))
    for name, annotation in sorted(_llmp_annotations(cls).items()):
        if not dataclasses.is_dataclass(cls) or name not in {f.name for f in dataclasses.fields(cls)}:
            lines.append(f"attribute {name}: {_annotation(annotation)}")
    return lines


def _own_llmp_members(cls: type) -> dict[str, Any]:
    """Public members a plugin sees on ``cls``, defined by llmp (itself or an llmp base), not by Python."""
    members: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        if not _is_llmp(klass):
            continue
        for name, value in list(vars(klass).items()):
            if not name.startswith("_") and not _is_field_default(klass, name):
                members[name] = value
    return members


def _is_llmp(klass: type) -> bool:
    return klass.__module__ == "llmp" or klass.__module__.startswith("llmp.")


def _is_field_default(klass: type, name: str) -> bool:
    """A dataclass field's default or a plain annotated class attribute: described as a field/attribute."""
    return name in vars(klass).get("__annotations__", {})  # not klass.__annotations__: that creates one


def _llmp_annotations(cls: type) -> dict[str, Any]:
    annotations: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        if _is_llmp(klass):
            annotations.update(
                {k: v for k, v in vars(klass).get("__annotations__", {}).items() if not k.startswith("_")}
            )
    return annotations


def _member_line(name: str, value: Any) -> str:
    if isinstance(value, property):
        return f"property {name}" + (" (settable)" if value.fset else "")
    if isinstance(value, staticmethod):
        return f"staticmethod {_function_line(value.__func__, name)}"
    if isinstance(value, classmethod):
        return f"classmethod {_function_line(value.__func__, name)}"
    if inspect.isfunction(value):
        return f"method {_function_line(value, name)}"
    if inspect.isclass(value):
        return f"class attribute {name}: class"
    return f"class attribute {name}: {type(value).__name__}"


def _field_line(f: dataclasses.Field, position: int | None) -> str:
    """``field 2 name: type = default``: the position where the field may be passed positionally."""
    has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
    default = " = ..." if has_default else ""  # whether there is one, not its value (see _signature)
    where = f"{position} " if position is not None else "" if f.init else "(not in __init__) "
    return f"field {where}{f.name}: {_annotation(f.type)}{default}"


def _function_line(func: Any, name: str | None = None) -> str:
    prefix = "async def" if inspect.iscoroutinefunction(func) or inspect.isasyncgenfunction(func) else "def"
    return f"{prefix} {name or func.__name__}{_signature(func)}"


def _signature(obj: Any) -> str:
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):  # some builtins and C types have none
        return "(...)"
    params = []
    previous_kind = None
    for param in signature.parameters.values():
        if param.kind is param.KEYWORD_ONLY and previous_kind not in (param.KEYWORD_ONLY, param.VAR_POSITIONAL):
            params.append("*")
        if previous_kind is param.POSITIONAL_ONLY and param.kind is not param.POSITIONAL_ONLY:
            params.append("/")
        text = {param.VAR_POSITIONAL: "*", param.VAR_KEYWORD: "**"}.get(param.kind, "") + param.name
        if param.annotation is not param.empty:
            text += f": {_annotation(param.annotation)}"
        if param.default is not param.empty:  # optional; its value is behaviour, not API: changing it breaks nothing
            text += " = ..."
        params.append(text)
        previous_kind = param.kind
    if previous_kind is inspect.Parameter.POSITIONAL_ONLY:
        params.append("/")
    returns = (
        "" if signature.return_annotation is signature.empty else f" -> {_annotation(signature.return_annotation)}"
    )
    return f"({', '.join(params)}){returns}"


def _annotation(annotation: Any) -> str:
    """As written: a string under ``from __future__ import annotations``, else the evaluated type's text."""
    if isinstance(annotation, str):
        return annotation
    if isinstance(annotation, type) and annotation.__module__ == "builtins":
        return annotation.__qualname__
    return _stable(inspect.formatannotation(annotation))


def _qualname(cls: type) -> str:
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def _stable(text: str) -> str:
    return _UNSTABLE.sub("", text)


def read_snapshot(path: Path = SNAPSHOT) -> dict[str, Any]:
    """``{"api_version": "0.5", "modules": {...}}`` as last written, or an empty one."""
    if not path.exists():
        return {"api_version": None, "modules": {}}
    return json.loads(path.read_text())


def write_snapshot(surface: dict[str, Any], api_version: str, path: Path = SNAPSHOT) -> None:
    path.write_text(json.dumps({"api_version": api_version, "modules": surface}, indent=1, sort_keys=True) + "\n")


def differences(old: dict[str, Any], new: dict[str, Any]) -> tuple[list[str], list[str]]:
    """``(added, removed)``: lines ``module.name: line`` only in ``new``, only in ``old``. A changed
    signature is a line removed and one added; a new name, or a new member or field, only adds."""

    def lines(surface: dict[str, Any]) -> set[str]:
        return {f"{m}.{name}: {line}" for m, names in surface.items() for name, ls in names.items() for line in ls}

    before, after = lines(old), lines(new)
    return sorted(after - before), sorted(before - after)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help=f"write the surface to {SNAPSHOT.name}")
    args = parser.parse_args(argv)
    from llmp.api import API_VERSION

    surface = compute_surface()
    snapshot = read_snapshot()
    added, removed = differences(snapshot["modules"], surface)
    for line in removed:
        print(f"- {line}")
    for line in added:
        print(f"+ {line}")
    if args.write:
        write_snapshot(surface, API_VERSION)
        print(f"wrote {SNAPSHOT} (API {API_VERSION}; the snapshot was of {snapshot['api_version']})")
        return 0
    if snapshot["api_version"] != API_VERSION:
        print(f"the snapshot is of API {snapshot['api_version']}, llmp.api.API_VERSION is {API_VERSION}")
        return 1
    return 1 if added or removed else 0


if __name__ == "__main__":
    sys.exit(main())
