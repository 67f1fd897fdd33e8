"""``llmp plugins new``: every kind's scaffold, generated into a temporary directory, is ruff-clean,
installs, lists as ok, passes its own tests unchanged and ``llmp plugins verify``; and the refusals
(a bad name, a directory that is not empty, an unknown kind) are each one line and status 2.

The generated distributions are installed together (one ``pip install --target``) and their tests
run in one pytest process: one install and one start-up for all kinds, not one per kind.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import llmp
from llmp.api import API_VERSION, KINDS
from llmp.scaffold import TEMPLATES, ScaffoldError, check_name, new_plugin, version_range
from llmp.testing import child_environment, pip_install_target, run_llmp

RUFF = Path(sys.executable).with_name("ruff")
LONGEST_NAME = "abcdefghij-abcdefghij-ab"  # 24 characters: the longest lines
VERIFIED_BY_COMMAND = ("lora_resolver", "tool_parser")  # cheap suites: the command's exit status and report


ENGINE = ["llmp-kernels-torch", "llmp-models-llama"]  # a tiny Llama engine run on the CPU
REFERENCE_PLUGINS = {  # what each kind's suite needs installed (a model a kernel set, a front-end the openai one)
    "model": ["llmp-kernels-torch"],
    "kernels": ["llmp-models-llama"],
    "frontend": [*ENGINE, "llmp-frontend-openai"],
    **dict.fromkeys(["executor", "scheduler", "kv_manager", "stat_logger"], ENGINE),
}


def test_the_reference_plugins_are_this_repositorys_distributions():
    repository = Path(__file__).parents[1]
    names = {tomllib.loads(p.read_text())["project"]["name"] for p in repository.glob("plugins/*/*/pyproject.toml")}
    assert {name for needed in REFERENCE_PLUGINS.values() for name in needed} <= names


def plugin_name(kind: str) -> str:
    return "made-" + kind.replace("_", "-")


def test_every_kind_has_a_template():
    missing = [kind for kind in KINDS if not (TEMPLATES / kind).is_dir()]
    assert not missing, f"no template directory core/llmp/scaffold/templates/<kind>/ for {missing}"


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """kind -> the distribution ``plugins new`` wrote for it (kinds with a template)."""
    root = tmp_path_factory.mktemp("scaffolds")
    return {
        kind: new_plugin(kind, plugin_name(kind), root / f"llmp-{plugin_name(kind)}")
        for kind in KINDS
        if (TEMPLATES / kind).is_dir()
    }


@pytest.fixture(scope="module")
def site(generated: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """All generated distributions, pip-installed into one ``--target`` directory."""
    target = tmp_path_factory.mktemp("site")
    pip_install_target(target, *generated.values())
    return target


@pytest.fixture(scope="module")
def own_test_results(generated: dict[str, Path], site: Path) -> dict[str, list[tuple[str, str, str]]]:
    """Every generated distribution's own tests, run unchanged in one pytest process with the
    distributions installed: kind -> [(test, outcome, details)]."""
    root = next(iter(generated.values())).parent
    # the projects' tests/ folders share module names (test_conformance.py): importlib mode
    (root / "pytest.ini").write_text("[pytest]\naddopts = --import-mode=importlib -p no:cacheprovider\n")
    report = root / "results.xml"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "--continue-on-collection-errors", "-o", "junit_family=xunit1"]
        + [f"--junitxml={report}"]
        + [str(path / "tests") for path in generated.values()],
        cwd=root,
        env=child_environment({"PYTHONPATH": str(site)}),
        capture_output=True,
        text=True,
        timeout=600,
    )
    if not report.exists():
        pytest.fail(f"the generated plugins' pytest wrote no report (exit {run.returncode}):\n{run.stdout}{run.stderr}")
    results: dict[str, list[tuple[str, str, str]]] = {kind: [] for kind in generated}
    for case in ET.parse(report).iter("testcase"):
        where = case.get("file") or case.get("classname", "").replace(".", "/")  # a collection error: no file
        kind = next((k for k, path in generated.items() if where.startswith(path.name + "/")), None)
        if kind is None:
            pytest.fail(f"a result of no generated plugin: {where}::{case.get('name')}\n{run.stdout[-3000:]}")
        problem = next((child for child in case if child.tag in ("failure", "error", "skipped")), None)
        outcome = "passed" if problem is None else problem.tag
        details = "" if problem is None else f"{problem.get('message', '')}\n{problem.text or ''}"
        results[kind].append((f"{case.get('file')}::{case.get('name')}", outcome, details))
    return results


@pytest.mark.parametrize("kind", KINDS)
def test_generated_plugin_passes_its_own_tests(kind, own_test_results):
    assert kind in own_test_results, f"no template for kind {kind}"
    results = own_test_results[kind]
    assert any(test.endswith("::test_" + plugin_name(kind).replace("-", "_") + "_conforms") for test, _, _ in results)
    problems = [f"{test}: {outcome}\n{details}" for test, outcome, details in results if outcome != "passed"]
    assert not problems, "\n".join(problems)


def test_generated_plugins_are_listed_ok_with_a_component_of_their_kind(generated, site):
    rows = {row["name"]: row for row in json.loads(run_llmp("plugins", "list", "--json", pythonpath=site).stdout)}
    for kind in generated:
        row = rows[plugin_name(kind)]
        assert (row["status"], row["distribution"], row["errors"]) == ("ok", f"llmp-{plugin_name(kind)}", []), kind
        assert row["kinds"] == [kind], row


@pytest.mark.parametrize("kind", VERIFIED_BY_COMMAND)
def test_llmp_plugins_verify_passes_on_a_generated_plugin(kind, generated, site):
    result = run_llmp("plugins", "verify", plugin_name(kind), "--json", pythonpath=site, check=False, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["plugin"] == plugin_name(kind) and report["distribution"] == f"llmp-{plugin_name(kind)}", report


@pytest.mark.parametrize("name", ["a", LONGEST_NAME])
def test_generated_files_are_ruff_clean_whatever_the_names_length(name, tmp_path):
    """With the generated project's own ruff configuration (its pyproject.toml): llmp is a
    third-party package there, the plugin's own package first-party."""
    kinds = [kind for kind in KINDS if (TEMPLATES / kind).is_dir()]
    paths = [str(new_plugin(kind, name, tmp_path / kind)) for kind in kinds]
    for command in (["check", "--no-cache"], ["format", "--check", "--no-cache", "--diff"]):
        result = subprocess.run([str(RUFF), *command, *paths], capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, f"ruff {' '.join(command)}:\n{result.stdout}{result.stderr}"


def test_generated_distribution_is_complete(generated):
    import trove_classifiers

    for kind, path in generated.items():
        files = {p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file()}
        package = "llmp_" + plugin_name(kind).replace("-", "_")
        expected = {"pyproject.toml", "README.md", "LICENSE", ".gitignore", ".github/workflows/ci.yml"}
        assert expected | {f"{package}/__init__.py", "tests/test_conformance.py"} <= files, (kind, files)
        assert not any(name.endswith(".tmpl") or name == "README.kind.md" for name in files), files
        for name in files:
            leftover = re.findall(r"\{\{\w+\}\}", (path / name).read_text())
            assert not leftover, f"{kind}: {name} keeps template tokens {leftover}"
        project = tomllib.loads((path / "pyproject.toml").read_text())["project"]
        assert project["name"] == f"llmp-{plugin_name(kind)}"
        assert project["entry-points"]["llmp"] == {plugin_name(kind): package}
        assert project["dependencies"][0] == "llmp" + version_range(llmp.__version__)
        assert project["requires-python"] == ">=3.11" and project["license"] == "Apache-2.0"
        assert project["description"] and project["readme"] == "README.md" and project["urls"]
        assert set(project["classifiers"]) <= trove_classifiers.classifiers, project["classifiers"]
        # the test extra: pytest and the reference plugins the kind's conformance suite runs against
        test_extra = project["optional-dependencies"]["test"]
        assert test_extra[0] == "pytest>=8", test_extra
        llmp_range = version_range(llmp.__version__)
        assert [name.removesuffix(llmp_range) for name in test_extra[1:]] == REFERENCE_PLUGINS.get(kind, []), kind
        entry_module = (path / package / "__init__.py").read_text()
        assert f'require_api("{version_range(API_VERSION)}")' in entry_module, kind
        workflow = (path / ".github" / "workflows" / "ci.yml").read_text()
        assert 'pip install -e ".[test]"' in workflow and f"llmp plugins verify {plugin_name(kind)}" in workflow
        assert 'python-version: "3.11"' in workflow


def test_version_ranges_stay_below_the_next_breaking_release():
    assert version_range("0.1.0") == ">=0.1,<0.2"
    assert version_range("0.5") == ">=0.5,<0.6"
    assert version_range("1.2.3") == ">=1.2,<2"
    assert version_range("0.10.0.dev1") == ">=0.10,<0.11"


@pytest.mark.parametrize(
    ("name", "suggestion"),
    [("My_Parser", "my-parser"), ("llmp-cache", "cache"), ("a--b", "a-b"), ("x" * 25, "x" * 24), ("-", None)],
)
def test_a_bad_name_is_refused_with_the_rule_and_a_name_that_follows_it(name, suggestion):
    with pytest.raises(ScaffoldError) as refused:
        check_name(name)
    message = str(refused.value)
    assert "\n" not in message and "lowercase letters, digits and single hyphens" in message
    assert message.endswith(f"; try {suggestion!r}") if suggestion else "try" not in message
    if suggestion:
        check_name(suggestion)


def llmp_main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """``llmp ARGS`` in this process: its exit status and its stderr."""
    from llmp.cli import main

    with pytest.raises(SystemExit) as exited:
        main(list(args))
    return exited.value.code, capsys.readouterr().err


def test_refusals_are_one_line_and_status_2(tmp_path, capsys, clean_plugin_env):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    refusals = {
        ("command", "Bad_Name", str(tmp_path / "new")): "invalid plugin name 'Bad_Name'",
        ("command", "fine", str(tmp_path / "taken")): "is not empty: plugins new never overwrites",
        ("parser", "fine", str(tmp_path / "new")): "KIND must be model, kernels",
    }
    for (kind, name, directory), expected in refusals.items():
        status, err = llmp_main(capsys, "plugins", "new", kind, name, "--dir", directory)
        assert status == 2 and err.count("\n") == 1 and err.startswith("llmp: error: ") and expected in err, err
    assert (tmp_path / "taken" / "notes.txt").read_text() == "mine" and not (tmp_path / "new").exists()


def test_unknown_kind_and_an_existing_file_are_refused_in_python(tmp_path):
    unknown = r"unknown kind 'tool-parser'; kinds: model, .* \(did you mean tool_parser\?\)"
    with pytest.raises(ScaffoldError, match=unknown):
        new_plugin("tool-parser", "fine", tmp_path / "new")
    (tmp_path / "file").write_text("")
    with pytest.raises(ScaffoldError, match="is a file: plugins new never overwrites"):
        new_plugin("command", "fine", tmp_path / "file")


def test_a_name_an_installed_plugin_has_is_refused(tmp_path, clean_plugin_env):
    taken = r"a plugin named 'kernels-torch' is already installed \(llmp-kernels-torch\)"
    with pytest.raises(ScaffoldError, match=taken):
        new_plugin("kernels", "kernels-torch", tmp_path / "a")
    with pytest.raises(ScaffoldError, match=r"kernels 'torch' is already provided by plugin kernels-torch"):
        new_plugin("kernels", "torch", tmp_path / "b")


def test_a_kinds_dependencies_file_adds_requirements_beside_llmp(tmp_path, monkeypatch):
    import shutil

    import llmp.scaffold

    templates = tmp_path / "templates"
    shutil.copytree(TEMPLATES / "command", templates / "command")
    (templates / "command" / "dependencies.tmpl").write_text("llmp-kernels-torch{{llmp_range}}\nrich>=13\n")
    monkeypatch.setattr(llmp.scaffold, "TEMPLATES", templates)
    path = new_plugin("command", "needs-more", tmp_path / "out")
    project = tomllib.loads((path / "pyproject.toml").read_text())["project"]
    llmp_range = version_range(llmp.__version__)
    assert project["dependencies"] == [f"llmp{llmp_range}", f"llmp-kernels-torch{llmp_range}", "rich>=13"]
    assert not (path / "dependencies").exists()


def test_a_generated_distribution_builds_an_sdist_and_a_wheel_twine_accepts(generated, tmp_path):
    project, dist = generated["tool_parser"], tmp_path / "dist"
    build = [sys.executable, "-m", "hatchling", "build", "-t", "sdist", "-t", "wheel", "-d", str(dist)]
    subprocess.run(build, cwd=project, check=True, capture_output=True, timeout=120)
    built = sorted(path.name for path in dist.iterdir())
    assert built == ["llmp_made_tool_parser-0.1.0-py3-none-any.whl", "llmp_made_tool_parser-0.1.0.tar.gz"]
    check = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *map(str, dist.iterdir())],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert check.returncode == 0, check.stdout + check.stderr
