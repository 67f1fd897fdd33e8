"""The real `llmp` CLI in a subprocess: commands, JSON shapes, configuration sources."""

from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path

from llmp.testing import run_llmp

REPO = Path(__file__).resolve().parents[1]


def in_repo_plugin_projects() -> dict[str, str]:
    """Entry-point name -> distribution for every plugin project under plugins/."""
    found = {}
    for pyproject in sorted(REPO.glob("plugins/*/*/pyproject.toml")):
        project = tomllib.loads(pyproject.read_text())["project"]
        for name in project["entry-points"]["llmp"]:
            found[name] = project["name"]
    return found


def test_version_from_both_entry_points():
    assert run_llmp("--version").stdout.startswith("llmp 0.1.0")
    console = Path(sys.executable).with_name("llmp")
    import subprocess

    out = subprocess.run([str(console), "--version"], capture_output=True, text=True, check=True).stdout
    assert out.startswith("llmp 0.1.0")


def test_plugins_list_json_lists_every_plugin_in_the_repo():
    rows = {r["name"]: r for r in json.loads(run_llmp("plugins", "list", "--json").stdout)}
    assert rows["llmp-commands"]["distribution"] == "llmp"
    commands = {c["name"] for c in rows["llmp-commands"]["components"] if c["kind"] == "command"}
    assert {"serve", "plugins", "collect-env", "chat", "complete", "bench"} <= commands
    for name, distribution in in_repo_plugin_projects().items():
        assert name in rows, f"{distribution} is not in `llmp plugins list`"
        row = rows[name]
        assert row["distribution"] == distribution and row["version"] and row["status"] == "ok"
        assert row["kinds"] and row["components"], f"{name} provides no components"
    for row in rows.values():
        assert set(row) >= {"name", "kinds", "components", "distribution", "version", "status", "hooks"}


def test_plugins_list_table_and_kind_filter():
    table = run_llmp("plugins", "list").stdout
    assert "llmp-commands" in table and "distribution" in table
    only_commands = json.loads(run_llmp("plugins", "list", "--json", "--kind", "command").stdout)
    assert only_commands and all("command" in r["kinds"] for r in only_commands)
    bad = run_llmp("plugins", "list", "--kind", "gizmo", check=False)
    assert bad.returncode == 2 and "--kind must be model, kernels" in bad.stderr


def test_plugins_show():
    shown = json.loads(run_llmp("plugins", "show", "llmp-commands", "--json").stdout)
    assert shown["hooks"] == ["llmp_register_commands"] and shown["path"].endswith("commands.py")
    text = run_llmp("plugins", "show", "llmp-commands").stdout
    assert "llmp_register_commands" in text and "llmp.cli.plugins_cmd:app" in text
    missing = run_llmp("plugins", "show", "nope", check=False)
    assert missing.returncode == 2 and "NAME must be an installed plugin (" in missing.stderr
    assert "llmp-commands" in missing.stderr


def test_collect_env():
    report = json.loads(run_llmp("collect-env", "--json").stdout)
    assert report["python"] == sys.version.split()[0]
    assert set(report["libraries"]) >= {"torch", "transformers", "triton"}
    assert report["cpu"]["logical_cores"] >= 1
    assert any(p["name"] == "llmp-commands" for p in report["plugins"])
    assert run_llmp("collect-env").stdout.startswith("### llmp\n")


def test_plugins_list_imports_no_heavy_library():
    code = (
        "import sys\n"
        "from llmp.cli import main\n"
        "try:\n    main(['plugins', 'list', '--json'])\nexcept SystemExit:\n    pass\n"
        "print('HEAVY', sorted(m for m in ('torch', 'transformers', 'triton') if m in sys.modules))\n"
    )
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().endswith("HEAVY []")


def test_option_sources_command_line_then_env_then_yaml(tmp_path):
    config = tmp_path / "llmp.yaml"
    config.write_text("json: true\nkind: model\n")
    # YAML alone: JSON output, filtered to plugins providing models (there may be none)
    from_yaml = run_llmp("plugins", "list", "--config", str(config)).stdout
    assert all("model" in r["kinds"] for r in json.loads(from_yaml))
    # the environment beats the file
    from_env = run_llmp("plugins", "list", "--config", str(config), env={"LLMP_KIND": "command"}).stdout
    assert any(r["name"] == "llmp-commands" for r in json.loads(from_env))
    # the command line beats both
    env = {"LLMP_KIND": "model", "LLMP_CONFIG": str(config)}
    from_cli = run_llmp("plugins", "list", "--kind", "command", env=env).stdout
    assert any(r["name"] == "llmp-commands" for r in json.loads(from_cli))
    # every option is settable from the environment
    assert json.loads(run_llmp("collect-env", env={"LLMP_JSON": "1"}).stdout)["llmp"] == "0.1.0"
    # and a boolean set there can be turned off again on the command line
    table = run_llmp("plugins", "list", "--no-json", env={"LLMP_JSON": "1"}).stdout
    assert "distribution" in table and not table.lstrip().startswith("[")


def test_bad_config_sources_are_clear_errors(tmp_path):
    bad_type = run_llmp("plugins", "list", env={"LLMP_JSON": "maybe"}, check=False)
    assert bad_type.returncode == 2 and "LLMP_JSON must be true or false" in bad_type.stderr
    not_yaml = tmp_path / "bad.yaml"
    not_yaml.write_text("- just\n- a list\n")
    result = run_llmp("plugins", "list", "--config", str(not_yaml), check=False)
    assert result.returncode == 2 and "mapping" in result.stderr
    missing = run_llmp("plugins", "list", "--config", str(tmp_path / "absent.yaml"), check=False)
    assert missing.returncode == 2


def test_unknown_command_is_a_usage_error():
    result = run_llmp("frobnicate", check=False)
    assert result.returncode == 2 and "frobnicate" in result.stderr


def test_trace_switch_prints_hook_calls():
    result = run_llmp("plugins", "list", "--json", env={"LLMP_TRACE_PLUGINS": "1"})
    assert "llmp_register_commands" in result.stderr and "llmp_register_kernels" in result.stderr
    assert json.loads(result.stdout)


NATIVE_ARCHITECTURES = {
    "models-llama": {"LlamaForCausalLM", "LlamaModel", "LlamaForSequenceClassification"},
    "models-mistral": {"MistralForCausalLM", "MixtralForCausalLM", "MistralModel", "MistralForSequenceClassification"},
    "models-qwen": {
        "Qwen2ForCausalLM",
        "Qwen3ForCausalLM",
        "Qwen3MoeForCausalLM",
        "Qwen2Model",
        "Qwen3Model",
        "Qwen2ForSequenceClassification",
        "Qwen3ForSequenceClassification",
        "Qwen2ForRewardModel",
        "Qwen2ForProcessRewardModel",
    },
    "models-gemma": {
        "GemmaForCausalLM",
        "Gemma2ForCausalLM",
        "GemmaForSequenceClassification",
        "Gemma2ForSequenceClassification",
    },
    "models-bert": {
        "BertModel",
        "RobertaModel",
        "XLMRobertaModel",
        "BertForSequenceClassification",
        "RobertaForSequenceClassification",
        "XLMRobertaForSequenceClassification",
    },
}


def test_model_plugins_list_their_architectures():
    rows = {r["name"]: r for r in json.loads(run_llmp("plugins", "list", "--json", "--kind", "model").stdout)}
    for plugin, architectures in NATIVE_ARCHITECTURES.items():
        assert {c["name"] for c in rows[plugin]["components"] if c["kind"] == "model"} == architectures
    fallback = [c for c in rows["models-transformers"]["components"] if c["kind"] == "model"]
    assert sorted((c["name"], c["details"]["model_impl"]) for c in fallback) == [
        ("*", "transformers"),
        ("*ForSequenceClassification", "transformers"),
    ]
    shown = run_llmp("plugins", "show", "models-qwen").stdout
    for architecture in NATIVE_ARCHITECTURES["models-qwen"]:
        assert f"model: {architecture} -> llmp_models_qwen.model:{architecture}" in shown
    assert "tasks=embed" in shown and "Qwen3-Embedding" in shown  # embedding variants and their descriptions
