"""``llmp plugins list`` fits the terminal: one component per line under its kind, sorted, names
never cut, the ``model *`` fallback explained, and a filter that matches nothing says so."""

from __future__ import annotations

import json
import re

import pytest
from rich.cells import cell_len

from llmp.api import KINDS
from llmp.testing import run_llmp


@pytest.fixture(scope="module")
def components() -> list[tuple[str, str, str]]:
    """(kind, name, plugin) of every component, from the JSON listing."""
    plugins = json.loads(run_llmp("plugins", "list", "--json").stdout)
    return [(c["kind"], c["name"], p["name"]) for p in plugins for c in p["components"]]


def listing(columns: int, *args: str, env: dict[str, str] | None = None) -> list[str]:
    return run_llmp("plugins", "list", *args, env={"COLUMNS": str(columns), **(env or {})}).stdout.splitlines()


@pytest.mark.parametrize("columns", [80, 120])
def test_one_sorted_line_per_component_within_the_width(columns, components):
    lines = listing(columns)
    assert all(cell_len(line) < columns for line in lines), [line for line in lines if cell_len(line) >= columns]
    # no more than a line per component, a heading and a blank line per kind, and a few notes
    kinds = {kind for kind, _, _ in components}
    assert len(lines) <= len(components) + 2 * len(kinds) + 12, len(lines)

    rows: dict[str, list[tuple[str, str]]] = {}
    kind = None
    for line in lines:
        if line in KINDS:
            kind = line
            rows[kind] = []
        elif line.startswith("  ") and kind is not None:
            name, plugin = line.split()[:2]  # whole names: a name cut or wrapped would not match below
            rows[kind].append((name, plugin))
        elif not line:
            kind = None
    assert list(rows) == [k for k in KINDS if k in kinds]  # kinds in their documented order
    for kind, found in rows.items():
        expected = sorted(
            ((n, p) for k, n, p in components if k == kind),
            key=lambda r: (r[0].startswith("*"), r[0] == "*", r[0].lower()),
        )
        assert found == expected, kind


def test_the_model_wildcard_is_explained():
    text = " ".join(listing(80))
    assert re.search(r"  \*\s+models-transformers\s", "\n".join(listing(80)))
    note = re.search(r"model \*: the fallback\. (.*?)\.", text)
    assert note, text
    assert "any architecture" in note.group(1) and "transformers" in note.group(1)


def test_a_kind_filter_shows_that_kind_only(components):
    lines = listing(80, "--kind", "kernels")
    assert lines[0] == "kernels"
    names = [line.split()[0] for line in lines[1:] if line.startswith("  ")]
    assert names == sorted(n for k, n, _ in components if k == "kernels")


def test_a_kind_filter_in_json_keeps_only_that_kinds_components():
    plugins = json.loads(run_llmp("plugins", "list", "--kind", "command", "--json").stdout)
    assert plugins and all(p["kinds"] == ["command"] for p in plugins)
    assert {c["kind"] for p in plugins for c in p["components"]} == {"command"}  # openai's frontend left out


def test_a_filter_that_matches_nothing_says_so():
    # only models-llama loaded: no plugin provides kernels
    result = run_llmp("plugins", "list", "--kind", "kernels", env={"LLMP_LOAD_PLUGINS": "llmp-models-llama"})
    assert result.returncode == 0
    assert result.stdout.startswith("no plugins match --kind kernels"), result.stdout
    assert "LLMP_LOAD_PLUGINS" in result.stdout
    assert (
        json.loads(
            run_llmp(
                "plugins", "list", "--kind", "kernels", "--json", env={"LLMP_LOAD_PLUGINS": "llmp-models-llama"}
            ).stdout
        )
        == []
    )


def test_an_unknown_kind_is_a_usage_error():
    result = run_llmp("plugins", "list", "--kind", "kernal", check=False)
    assert result.returncode == 2
    assert result.stderr.startswith("llmp: error: --kind must be model, kernels, executor"), result.stderr
    assert "got 'kernal' (did you mean kernels?)" in result.stderr
    assert not result.stdout


def test_an_unknown_kind_from_a_config_file_names_the_file(tmp_path):
    config = tmp_path / "llmp.yaml"
    config.write_text("kind: kernal\n")
    result = run_llmp("plugins", "list", "--config", str(config), check=False)
    assert result.returncode == 2 and not result.stdout
    assert result.stderr.startswith(f"llmp: error: kind in {config} must be model, kernels"), result.stderr
    assert "--kind" not in result.stderr
