"""``llmp plugins new KIND NAME``: a complete plugin distribution of each kind, written from templates.

The templates are package data: ``templates/<kind>/`` holds what is particular to a kind (the
package with its registration hook, kind-specific tests, ``README.kind.md``, optionally
``dependencies``: requirements beside llmp's, one a line, and ``test_dependencies``: the ``test``
extra's, the reference plugins its conformance suite runs against) and ``common/``
what every plugin gets (``pyproject.toml``, ``README.md``, ``LICENSE``, the conformance test, a
CI workflow, ``.gitignore``); a kind's file wins over a common one of the same path. Every
template file ends in ``.tmpl``, so no linter or test runner reads it, and the suffix is dropped
when the file is written. Paths and contents are rendered by literal replacement of
``{{token}}`` (no other templating), the tokens being :func:`tokens`' keys.
"""

from __future__ import annotations

import re
from difflib import get_close_matches
from pathlib import Path

from llmp.api import KINDS, LLMPError

__all__ = ["NAME_RULE", "ScaffoldError", "check_name", "new_plugin", "tokens", "version_range"]

TEMPLATES = Path(__file__).with_name("templates")
COMMON = Path(__file__).with_name("common")
SUFFIX = ".tmpl"
KIND_README = "README.kind.md"  # (.tmpl) embedded in README.md, not written on its own
KIND_DEPENDENCIES = "dependencies"  # (.tmpl) requirements beside llmp's, one a line, in pyproject.toml
# (.tmpl) the test extra's requirements beside pytest, one a line: the reference plugins the kind's
# conformance suite runs against (a model needs a kernel set; a front-end a model and the openai one)
KIND_TEST_DEPENDENCIES = "test_dependencies"
MAX_NAME_LENGTH = 24  # the generated code stays within 120 columns
NAME_RULE = (
    f"a plugin name is lowercase letters, digits and single hyphens, starts with a letter, "
    f"has at most {MAX_NAME_LENGTH} characters and does not start with 'llmp-' (the distribution is llmp-NAME)"
)
_NAME = re.compile(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*\Z")

# what a plugin of each kind provides, in words (the generated description and README)
KIND_NOUNS: dict[str, str] = {
    "model": "a model architecture",
    "kernels": "a kernel set",
    "executor": "an executor",
    "frontend": "a protocol front-end",
    "lora_resolver": "a LoRA adapter resolver",
    "tool_parser": "a tool-call parser",
    "reasoning_parser": "a reasoning parser",
    "scheduler": "a scheduler",
    "kv_manager": "a KV-cache manager",
    "stat_logger": "a stat logger",
    "command": "an llmp command",
}
assert set(KIND_NOUNS) == set(KINDS)


class ScaffoldError(LLMPError):
    """A name or directory ``plugins new`` refuses; the message is one line naming the fix."""


def new_plugin(kind: str, name: str, directory: str | Path | None = None) -> Path:
    """Write the distribution ``llmp-NAME`` providing one component of ``kind`` into ``directory``
    (default ``./llmp-NAME``) and return its path. Refuses an invalid name and a directory that
    exists and is not empty."""
    _check_kind(kind)
    check_name(name)
    target = Path(directory) if directory is not None else Path(f"llmp-{name}")
    _check_directory(target)
    _check_unclaimed(kind, name)
    values = tokens(kind, name)
    files = _render(kind, values)
    target.mkdir(parents=True, exist_ok=True)
    for relative, text in files.items():
        path = target / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return target


def check_name(name: str) -> None:
    """Raise :class:`ScaffoldError` (the rule and a name that follows it) unless ``name`` is valid."""
    if len(name) <= MAX_NAME_LENGTH and _NAME.match(name) and not name.startswith("llmp-"):
        return
    suggestion = _fixed_name(name)
    hint = f"; try {suggestion!r}" if suggestion and suggestion != name else ""
    raise ScaffoldError(f"invalid plugin name {name!r}: {NAME_RULE}{hint}")


def _fixed_name(name: str) -> str:
    """``name`` made to follow the rule: ``My_Parser`` -> ``my-parser``, ``llmp-x`` -> ``x``."""
    fixed = re.sub(r"[^a-z0-9]+", "-", name.lower())
    fixed = fixed.removeprefix("llmp-").lstrip("-0123456789")
    fixed = fixed[:MAX_NAME_LENGTH].strip("-")
    return fixed if fixed and fixed != "llmp" else ""


def _check_kind(kind: str) -> None:
    if kind in KINDS:
        return
    close = get_close_matches(kind.replace("-", "_"), KINDS, 1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    raise ScaffoldError(f"unknown kind {kind!r}; kinds: {', '.join(KINDS)}{hint}")


def _check_directory(target: Path) -> None:
    if target.is_dir() and not any(target.iterdir()):
        return
    if target.exists():
        what = "is not empty" if target.is_dir() else "is a file"
        raise ScaffoldError(
            f"{target} {what}: plugins new never overwrites anything; choose another --dir or move it away"
        )


def _check_unclaimed(kind: str, name: str) -> None:
    """Refuse a plugin name or component name an installed plugin already has: the new plugin
    would load as broken (two plugins of one name, or a duplicate component)."""
    from llmp import plugins, registry

    component = name.replace("-", "_")
    if (record := plugins.get_record(name)) is not None:
        raise ScaffoldError(
            f"a plugin named {name!r} is already installed ({record.distribution}); choose another name"
        )
    for claimed in (name, component):
        spec = registry.components(kind).get(claimed)
        if spec is not None:
            raise ScaffoldError(
                f"{kind} {claimed!r} is already provided by plugin {spec.plugin}; choose another name "
                f"(e.g. {f'my-{name}'[:MAX_NAME_LENGTH].rstrip('-')!r})"
            )


def version_range(version: str) -> str:
    """The range of versions compatible with ``version`` under llmp's rule (a minor release may
    break while the major is 0): ``0.5`` -> ``>=0.5,<0.6``, ``1.2.3`` -> ``>=1.2,<2``."""
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None:
        raise ValueError(f"not a version: {version!r}")
    major, minor = int(match[1]), int(match[2])
    upper = f"{major}.{minor + 1}" if major == 0 else f"{major + 1}"
    return f">={major}.{minor},<{upper}"


def tokens(kind: str, name: str) -> dict[str, str]:
    """What each ``{{token}}`` of the templates stands for, for plugin ``name`` of ``kind``.

    The tokens every template may use (the template format): ``name``, ``distribution``,
    ``package``, ``class_name``, ``component``, ``api_range``, ``llmp_range``. The common files
    also use ``kind``, ``kind_noun``, ``hook``, and three that a kind's template directory fills:
    ``kind_readme`` (its ``README.kind.md``), ``extra_dependencies`` (its ``dependencies``
    file: requirements beside llmp's, one a line, such as another plugin it builds on) and
    ``test_dependencies`` (its ``test_dependencies`` file: the ``test`` extra's)."""
    import llmp
    from llmp.api import API_VERSION
    from llmp.registry import HOOK_FOR_KIND

    return {
        "name": name,
        "distribution": f"llmp-{name}",
        "package": f"llmp_{name.replace('-', '_')}",
        "class_name": "".join(part.capitalize() for part in name.split("-")),
        "component": name.replace("-", "_"),
        "api_range": version_range(API_VERSION),
        "llmp_range": version_range(llmp.__version__),
        "kind": kind,
        "kind_noun": KIND_NOUNS[kind],
        "hook": HOOK_FOR_KIND[kind],
    }


def _render(kind: str, values: dict[str, str]) -> dict[str, str]:
    """Relative path -> text of every file of the new distribution."""
    kind_dir = TEMPLATES / kind
    if not kind_dir.is_dir():
        raise ScaffoldError(f"this llmp has no template for kind {kind!r} (looked in {kind_dir})")
    templates = _templates(COMMON) | _templates(kind_dir)  # a kind's file replaces a common one
    readme = templates.pop(Path(KIND_README), None)

    def requirements(name: str) -> str:
        listed = templates.pop(Path(name), None)
        found = _substitute(listed.read_text(encoding="utf-8"), values).split() if listed else []
        return "".join(f', "{requirement}"' for requirement in found)

    values = values | {
        "kind_readme": _substitute(readme.read_text(encoding="utf-8"), values).strip() if readme else "",
        "extra_dependencies": requirements(KIND_DEPENDENCIES),
        "test_dependencies": requirements(KIND_TEST_DEPENDENCIES),
    }
    return {
        Path(_substitute(str(relative), values)): _substitute(path.read_text(encoding="utf-8"), values)
        for relative, path in sorted(templates.items())
    }


def _templates(root: Path) -> dict[Path, Path]:
    """Relative path of the file to write -> template file, for every ``*.tmpl`` under ``root``."""
    found = {}
    for path in root.rglob("*" + SUFFIX):
        relative = path.relative_to(root)
        if "__pycache__" not in relative.parts:
            found[relative.with_name(relative.name.removesuffix(SUFFIX))] = path
    return found


def _substitute(text: str, values: dict[str, str]) -> str:
    for token, value in values.items():
        text = text.replace("{{" + token + "}}", value)
    return text
