"""Out-of-tree plugins, pip-installed for real: discovery, failure isolation, selection switches."""

from __future__ import annotations

import json
from pathlib import Path

from llmp.testing import pip_install_target, run_llmp

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"


def plugin_rows(site, **env):
    return {r["name"]: r for r in json.loads(run_llmp("plugins", "list", "--json", pythonpath=site, env=env).stdout)}


def test_installed_example_plugin_is_listed_and_its_command_runs(third_party_site):
    rows = plugin_rows(third_party_site)
    hello = rows["hello"]
    assert (hello["distribution"], hello["version"], hello["status"]) == ("llmp-hello", "0.1.0", "ok")
    assert hello["kinds"] == ["command"] and hello["components"][0]["name"] == "hello"
    assert run_llmp("hello", "--name", "llmp", pythonpath=third_party_site).stdout == "hello, llmp\n"


def test_broken_plugin_is_reported_and_does_not_break_other_commands(third_party_site):
    rows = plugin_rows(third_party_site)
    broken = rows["broken"]
    assert broken["status"] == "broken" and broken["distribution"] == "llmp-example-broken"
    assert "llmp_dependency_that_is_not_installed" in broken["errors"][0]
    assert len(broken["errors"]) == 1  # reported once: not again as an entry point that "disappeared"
    listed = run_llmp("plugins", "list", pythonpath=third_party_site)
    assert "broken" in listed.stdout
    assert listed.stderr.count("plugin 'broken'") == 1, listed.stderr
    shown = run_llmp("plugins", "show", "broken", pythonpath=third_party_site).stdout
    assert "ModuleNotFoundError" in shown and "Traceback" in shown
    assert run_llmp("collect-env", "--json", pythonpath=third_party_site).returncode == 0
    assert run_llmp("hello", pythonpath=third_party_site).stdout == "hello, world\n"


def test_strict_mode_turns_a_broken_plugin_into_an_error(third_party_site):
    result = run_llmp("plugins", "list", pythonpath=third_party_site, env={"LLMP_STRICT_PLUGINS": "1"}, check=False)
    assert result.returncode == 2
    assert "plugin 'broken' (llmp-example-broken) failed while importing" in result.stderr


def test_llmp_load_plugins_selects_distributions(third_party_site):
    assert set(plugin_rows(third_party_site, LLMP_LOAD_PLUGINS="")) == {"llmp-commands", "llmp-engine"}
    only_hello = plugin_rows(third_party_site, LLMP_LOAD_PLUGINS="llmp-hello")
    assert set(only_hello) == {"llmp-commands", "llmp-engine", "hello"}
    # the kernel's own plugins always load, so the CLI keeps working
    assert run_llmp("collect-env", "--json", pythonpath=third_party_site, env={"LLMP_LOAD_PLUGINS": ""}).returncode == 0


def test_two_plugins_claiming_one_command_name(tmp_path):
    pip_install_target(tmp_path, REPO / "examples" / "llmp-hello", FIXTURES / "llmp-example-clash")
    rows = plugin_rows(tmp_path)
    assert rows["clash"]["status"] == "broken" and rows["hello"]["status"] == "broken"
    assert "llmp-hello" in rows["clash"]["errors"][0] and "llmp-example-clash" in rows["clash"]["errors"][0]
    strict = run_llmp("plugins", "list", pythonpath=tmp_path, env={"LLMP_STRICT_PLUGINS": "1"}, check=False)
    assert strict.returncode == 2 and "registered by both" in strict.stderr
