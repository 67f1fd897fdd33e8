"""Every implementation a hook-spec example or docs/plugins.md names is real: importing it works."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from llmp import hookspecs
from llmp.api import resolve_reference
from llmp.testing import pip_install_target

REPO = Path(__file__).resolve().parents[1]
GUIDE = (REPO / "docs" / "plugins.md").read_text()
REFERENCE = re.compile(r"""impl=["']([\w.]+:[\w.]+)["']""")


def hook_docstring_references() -> list[str]:
    return [
        ref
        for name, function in sorted(vars(hookspecs).items())
        if name.startswith("llmp_") and hasattr(function, "llmp_spec")
        for ref in REFERENCE.findall(inspect.getdoc(function) or "")
    ]


def guide_references() -> tuple[list[str], list[str]]:
    """(the hook reference's, the rest of the guide's)."""
    before, reference = GUIDE.split("## Hook reference", 1)
    reference, after = reference.split("\n## ", 1)
    return REFERENCE.findall(reference), REFERENCE.findall(before + after)


@pytest.fixture(scope="module", autouse=True)
def example_stats_plugin(tmp_path_factory: pytest.TempPathFactory):
    # the stat-logger example is the fixture distribution, installed as a user would
    site = tmp_path_factory.mktemp("stats-site")
    pip_install_target(site, REPO / "tests" / "fixtures" / "llmp-example-stats")
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(site))
        yield


def test_there_are_examples_of_every_registration_hook():
    registration_hooks = [n for n in vars(hookspecs) if n.startswith("llmp_register_")]
    assert len(hook_docstring_references()) == len(registration_hooks)
    assert sorted(guide_references()[0]) == sorted(hook_docstring_references())


@pytest.mark.parametrize("reference", hook_docstring_references())
def test_hook_spec_example_imports(reference):
    assert resolve_reference(reference) is not None


def test_guide_examples_import_or_are_written_in_the_guide():
    hook_reference, tutorials = guide_references()
    for reference in hook_reference:
        resolve_reference(reference)
    for reference in tutorials:
        attribute = reference.rpartition(":")[2]
        # a tutorial writes its own module out in full (the greet command, the calltag parser)
        if not re.search(rf"^(class|def) {attribute}\b", GUIDE, flags=re.MULTILINE):
            resolve_reference(reference)
