"""The versioned plugin API: ``require_api``, plugins made for another API listed as ``incompatible``,
and a public surface (``tests/api_surface.json``) that changes only with ``llmp.api.API_VERSION``."""

from __future__ import annotations

import ast
import importlib.util
import json
import logging
import pickle
import re
import sys
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet  # pytest's own dependency: the reference for PEP 440

from llmp import hookimpl, plugins, registry
from llmp.api import API_VERSION, IncompatiblePluginError, PluginLoadError, ToolParserSpec, require_api
from llmp.testing import plugin_site, run_llmp

REPO = Path(__file__).resolve().parents[1]
REGENERATE = "run scripts/api_surface.py --write"

# -- require_api -------------------------------------------------------------------------------


def test_require_api_agrees_with_pep_440(monkeypatch):
    operators = ["~=", "==", "!=", "<=", ">=", "<", ">"]
    bounds = ["0", "0.4", "0.5", "0.5.0", "0.5.1", "0.6", "1", "1.0.0", "0.5.*", "0.4.*"]
    specifiers = [f"{op}{bound}" for op in operators for bound in bounds] + [">=0.5,<0.6", ">= 0.4 , < 0.5", "~=0.4.2"]
    for api_version in ("0.5", "0.4.9", "1.0", "0.10"):
        monkeypatch.setattr("llmp.api.API_VERSION", api_version)
        for specifier in specifiers:
            try:
                expected = SpecifierSet(specifier).contains(api_version)
            except Exception:  # ~=0, ~=0.5.* ...: not specifiers, checked below
                continue
            try:
                require_api(specifier)
                accepted = True
            except IncompatiblePluginError:
                accepted = False
            assert accepted == expected, f"API {api_version}, require_api({specifier!r})"


@pytest.mark.parametrize("specifier", ["", "0.5", ">=0.5,", "=>0.5", ">=0.5;<0.6", ">=v0.5", ">=0.5rc1", "~=1", None])
def test_a_malformed_specifier_is_a_load_error_naming_it(specifier):
    with pytest.raises(PluginLoadError, match=re.escape(f"require_api({specifier!r}): not a version specifier")) as e:
        require_api(specifier)
    assert not isinstance(e.value, IncompatiblePluginError)


def test_the_error_says_what_the_plugin_needs_and_survives_a_process_boundary():
    with pytest.raises(IncompatiblePluginError) as refused:
        require_api(" >=0.6, <0.7")
    assert str(refused.value) == f"needs llmp API >=0.6,<0.7 (this llmp has {API_VERSION})"
    copy = pickle.loads(pickle.dumps(refused.value))
    assert (copy.specifier, copy.api_version, str(copy)) == (">=0.6,<0.7", API_VERSION, str(refused.value))
    require_api(f"=={API_VERSION}")  # the version it has: nothing raised


def test_every_in_repo_plugin_declares_its_range_before_any_other_llmp_import():
    """First: an llmp of another API then says "incompatible", not an ImportError of a moved name."""
    modules = sorted(REPO.glob("plugins/*/*/llmp_*/__init__.py"))
    assert len(modules) >= 20
    for path in modules:
        tree = ast.parse(path.read_text())
        statements = [node for node in tree.body if node is not tree.body[0]]  # after the docstring
        first = next(
            i
            for i, node in enumerate(statements)
            if isinstance(node, ast.ImportFrom | ast.Import) and "llmp" in ast.unparse(node).split()[1].split(".")[0]
        )
        assert ast.unparse(statements[first]) == "from llmp.api import require_api", path
        call = statements[first + 1]
        assert ast.unparse(call).startswith("require_api("), f"{path}: require_api(...) must follow its import"
        specifier = ast.literal_eval(call.value.args[0])
        assert SpecifierSet(specifier).contains(API_VERSION), f"{path}: {specifier} excludes API {API_VERSION}"


# -- loading a plugin made for another API -----------------------------------------------------


def write_distribution(site: Path, name: str, specifier: str) -> None:
    """A distribution ``llmp-NAME`` 1.0.0 whose module ``llmp_NAME`` requires ``specifier`` and registers
    the tool parser ``NAME``: installed as pip installs (a ``.dist-info`` with a real entry point)."""
    source = (
        "from llmp.api import require_api\n\n"
        f"require_api({specifier!r})\n\n"
        "from llmp import hookimpl  # noqa: E402\n"
        "from llmp.api import ToolParserSpec  # noqa: E402\n\n\n"
        "@hookimpl\n"
        "def llmp_register_tool_parsers():\n"
        f"    yield ToolParserSpec(name={name!r}, impl='json:loads')\n"
    )
    plugin_site(site, f"llmp_{name.replace('-', '_')}", source, name=name, distribution=f"llmp-{name}", version="1.0.0")


NEEDS = f"needs llmp API >=0.6,<0.7 (this llmp has {API_VERSION})"
INSTALL_HINT = "install a release of it made for this llmp, or uninstall it"
ONLY_THESE = {"LLMP_LOAD_PLUGINS": "llmp-api-future,llmp-api-current"}  # not every installed plugin: faster


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two plugins: ``api-future`` (made for API 0.6) and ``api-current`` (for this one)."""
    site = tmp_path_factory.mktemp("api-site")
    write_distribution(site, "api-future", ">=0.6,<0.7")
    write_distribution(site, "api-current", f"=={API_VERSION}.*")
    return site


@pytest.fixture
def installed(site, monkeypatch, clean_plugin_env):
    """``site`` on this process's path, and only its plugins loaded (beside the kernel's)."""
    monkeypatch.syspath_prepend(str(site))
    for key, value in ONLY_THESE.items():
        monkeypatch.setenv(key, value)
    yield site
    sys.modules.pop("llmp_api_current", None)


def test_an_incompatible_plugin_is_recorded_once_and_registers_nothing(installed, caplog):
    with caplog.at_level(logging.WARNING, logger="llmp.plugins"):
        pm = plugins.load_plugins()
    record = plugins.get_record("api-future")
    assert (record.status, record.incompatible, record.errors) == ("incompatible", NEEDS, [NEEDS])
    assert (record.distribution, record.version) == ("llmp-api-future", "1.0.0")
    assert pm.get_plugin("api-future") is None and "llmp_api_future" not in sys.modules
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings == [f"plugin 'api-future' (llmp-api-future) is incompatible: {NEEDS}; " + INSTALL_HINT]
    # the other plugins are unaffected
    assert plugins.get_record("api-current").status == "ok"
    assert "api-current" in registry.components("tool_parser")
    assert "api-future" not in registry.components("tool_parser")


def test_strict_mode_raises_naming_the_plugin(installed, monkeypatch):
    monkeypatch.setenv("LLMP_STRICT_PLUGINS", "1")
    with pytest.raises(IncompatiblePluginError) as refused:
        plugins.load_plugins()
    assert str(refused.value) == f"plugin 'api-future' (llmp-api-future) is incompatible: {NEEDS}"


def test_require_api_in_a_hook_refuses_the_plugin_not_the_process(clean_plugin_env):
    class Late:
        @hookimpl
        def llmp_register_tool_parsers(self):
            require_api(">=0.6,<0.7")
            yield ToolParserSpec(name="late", impl="json:loads")

    plugins.register(Late(), name="late")
    assert "late" not in registry.components("tool_parser")
    assert plugins.get_record("late").status == "incompatible"
    assert plugins.load_plugins().get_plugin("late") is None  # none of it stays registered


def test_plugins_list_names_it_in_its_own_words_and_warns_once(site):
    listed = run_llmp("plugins", "list", pythonpath=site, env={**ONLY_THESE, "COLUMNS": "200"})
    assert f"plugin api-future (llmp-api-future 1.0.0) is incompatible: {NEEDS}" in listed.stdout
    assert "all ok" not in listed.stdout and ", 1 incompatible." in listed.stdout
    assert re.search(r"^  api-current\s+api-current$", listed.stdout, re.M), listed.stdout  # the other one, listed
    assert listed.stderr.count("plugin 'api-future'") == 1, listed.stderr  # reported once


def llmp_main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``llmp ARGS`` in this process (quicker than a child): its exit status, stdout and stderr."""
    from llmp.cli import main

    with pytest.raises(SystemExit) as exited:
        main(list(args))
    out, err = capsys.readouterr()
    return exited.value.code, out, err


def test_show_json_verify_and_strict_mode_say_why_with_the_exit_codes_of_a_broken_plugin(installed, capsys):
    status, out, _ = llmp_main(capsys, "plugins", "show", "api-future")
    assert status == 0 and out.startswith(f"api-future incompatible: {NEEDS}\n") and "Traceback" not in out, out

    status, out, _ = llmp_main(capsys, "plugins", "list", "--json")
    rows = {row["name"]: row for row in json.loads(out)}
    assert status == 0 and (rows["api-future"]["status"], rows["api-future"]["errors"]) == ("incompatible", [NEEDS])
    assert rows["api-future"]["components"] == [] and rows["api-current"]["status"] == "ok"

    status, out, _ = llmp_main(capsys, "plugins", "verify", "api-future", "--json")
    assert status == 2 and json.loads(out)["error"] == f"the plugin is incompatible: {NEEDS}"


def test_strict_mode_is_an_error_of_the_command(installed, capsys, monkeypatch):
    monkeypatch.setenv("LLMP_STRICT_PLUGINS", "1")
    status, _, err = llmp_main(capsys, "plugins", "list")
    assert status == 2 and err == f"llmp: error: plugin 'api-future' (llmp-api-future) is incompatible: {NEEDS}\n"


# -- the public surface ------------------------------------------------------------------------


def api_surface_script():
    spec = importlib.util.spec_from_file_location("api_surface", REPO / "scripts" / "api_surface.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_public_surface_changes_only_with_the_api_version():
    script = api_surface_script()
    snapshot = script.read_snapshot()
    assert snapshot["api_version"] == API_VERSION, (
        f"llmp.api.API_VERSION is {API_VERSION} but tests/api_surface.json is the surface of API "
        f"{snapshot['api_version']}: {REGENERATE}"
    )
    added, removed = script.differences(snapshot["modules"], script.compute_surface())
    shown = "\n".join([*(f"- {line}" for line in removed), *(f"+ {line}" for line in added)][:60])
    assert not removed, (
        "the public API changed: bump llmp.api.API_VERSION, add a changelog entry (docs/plugins.md, "
        f'"API versioning"), {REGENERATE}\n{shown}'
    )
    assert not added, (
        f"the public API grew: name the additions in the changelog entry of API {API_VERSION} "
        f'(docs/plugins.md, "API versioning"; additions break no plugin), {REGENERATE}\n{shown}'
    )


def test_the_changelog_has_an_entry_for_this_api_version():
    docs = (REPO / "docs" / "plugins.md").read_text()
    section = docs[docs.index("## API versioning") :]
    assert f"- **{API_VERSION}**:" in section, f"docs/plugins.md: no changelog entry for API {API_VERSION}"
