"""The out-of-tree example plugins under examples/, installed as a user installs them: each passes
``llmp plugins verify`` (how CI verifies them) and its own tests.

The examples are installed together (one ``pip install --target``); their own tests run in one
pytest process, less each ``tests/test_conformance.py``, which runs the checks ``verify`` runs.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from llmp.testing import child_environment, pip_install_target, run_llmp

REPO = Path(__file__).resolve().parents[1]
STATS_FILE = "LLMP_STAT_LOGGER_FILE"  # where examples/llmp-stat-logger-file writes
EXAMPLES = sorted(path.parent for path in (REPO / "examples").glob("*/pyproject.toml"))


def plugin_names(project: Path) -> list[str]:
    """The plugins a project provides: its entry points in group ``llmp``."""
    return list(tomllib.loads((project / "pyproject.toml").read_text())["project"]["entry-points"]["llmp"])


PLUGINS = [(project.name, name) for project in EXAMPLES for name in plugin_names(project)]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("site")
    pip_install_target(target, *EXAMPLES)
    return target


def test_the_examples_load_and_show_the_kinds_the_issue_asks_for(site):
    rows = {row["name"]: row for row in json.loads(run_llmp("plugins", "list", "--json", pythonpath=site).stdout)}
    examples = [rows[plugin] for _, plugin in PLUGINS]
    assert all(row["status"] == "ok" for row in examples), [(row["name"], row["errors"]) for row in examples]
    shown = {kind for row in examples for kind in row["kinds"]}
    assert {"tool_parser", "frontend", "kernels", "stat_logger", "command"} <= shown, shown


@pytest.mark.parametrize(("project", "plugin"), PLUGINS, ids=[project for project, _ in PLUGINS])
def test_example_passes_llmp_plugins_verify(project, plugin, site, tmp_path):
    stats = tmp_path / "stats.jsonl"  # llmp-stat-logger-file writes there (every engine builds every stat logger)
    result = run_llmp(
        "plugins", "verify", plugin, "--json", pythonpath=site, check=False, timeout=600, env={STATS_FILE: str(stats)}
    )
    assert result.returncode == 0, f"llmp plugins verify {plugin} exited {result.returncode}:\n{result.stdout[-4000:]}"
    report = json.loads(result.stdout)
    assert report["passed"] and report["results"], report
    assert report["distribution"] == project
    if project == "llmp-stat-logger-file":  # the kit's records and its tiny engine run, as JSON lines
        lines = [json.loads(line) for line in stats.read_text().splitlines()]
        engine_run = [line for line in lines if line["model"] != "tiny-llama"]  # not the kit's recorded trace
        generated = {
            event: sum(line["num_generation_tokens"] for line in engine_run if line["event"] == event)
            for event in ("step", "finished")
        }
        assert generated["finished"] > 0 and generated["step"] == generated["finished"], generated


def test_examples_pass_their_own_tests(site, tmp_path):
    tests = [project / "tests" for project in EXAMPLES if (project / "tests").is_dir()]
    assert len(tests) >= 4
    # the tests/ folders share module names (test_conformance.py): importlib mode
    (tmp_path / "pytest.ini").write_text("[pytest]\naddopts = --import-mode=importlib -p no:cacheprovider\n")
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-c", str(tmp_path / "pytest.ini"), "--rootdir", str(tmp_path)]
        + [f"--ignore={folder / 'test_conformance.py'}" for folder in tests]
        + [str(folder) for folder in tests],
        cwd=tmp_path,
        env=child_environment({"PYTHONPATH": str(site)}),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, f"{run.stdout[-6000:]}\n{run.stderr[-2000:]}"
