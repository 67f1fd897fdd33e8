"""Model configs: native models read a cached attribute dump; the transformers fallback gets transformers' object."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmp import plugins
from llmp.model_files.config import PlainConfig, _cache_file, load_plain_config, transformers_config
from llmp.model_files.resolve import resolve_model
from llmp.options import EngineConfig
from llmp.testing import save_tiny_model


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LLMP_CACHE_DIR", str(tmp_path / "cache"))
    plugins.load_plugins()


@pytest.mark.parametrize("architecture", ["Qwen3ForCausalLM", "Gemma2ForCausalLM", "MixtralForCausalLM"])
def test_the_cached_config_has_every_attribute_transformers_gives(tmp_path, architecture):
    from transformers import AutoConfig

    save_tiny_model(tmp_path / "m", architecture)
    expected = AutoConfig.from_pretrained(tmp_path / "m").to_dict()
    first = load_plain_config(tmp_path / "m")  # through transformers; written to the cache
    assert _cache_file(tmp_path / "m").is_file()
    second = load_plain_config(tmp_path / "m")  # from the cache
    assert first.to_dict() == second.to_dict()
    assert set(second.to_dict()) == set(expected)
    for name in (
        "hidden_size",
        "num_key_value_heads",
        "rms_norm_eps",
        "vocab_size",
        "tie_word_embeddings",
        "sliding_window",
        "layer_types",
        "rope_parameters",
    ):
        if name in expected:
            assert getattr(second, name) == expected[name], name
    for alias, name in AutoConfig.from_pretrained(tmp_path / "m").attribute_map.items():
        assert getattr(second, alias) == expected[name], alias  # Mixtral: num_experts is num_local_experts
    with pytest.raises(AttributeError):
        second.not_a_config_attribute  # noqa: B018
    assert getattr(second, "not_a_config_attribute", 7) == 7


def test_a_changed_config_is_read_again_and_a_damaged_entry_is_replaced(tmp_path):
    save_tiny_model(tmp_path / "m", "LlamaForCausalLM")
    load_plain_config(tmp_path / "m")
    config_file = tmp_path / "m" / "config.json"
    values = json.loads(config_file.read_text())
    config_file.write_text(json.dumps({**values, "rms_norm_eps": 0.125}))
    assert load_plain_config(tmp_path / "m").rms_norm_eps == 0.125
    _cache_file(tmp_path / "m").write_text("{not json")
    assert load_plain_config(tmp_path / "m").rms_norm_eps == 0.125
    assert json.loads(_cache_file(tmp_path / "m").read_text())["values"]["rms_norm_eps"] == 0.125


def test_the_resolved_model_carries_the_plain_config_and_the_selected_implementation(tmp_path):
    from transformers import PretrainedConfig

    save_tiny_model(tmp_path / "llama", "LlamaForCausalLM")
    native = resolve_model(EngineConfig(model=str(tmp_path / "llama")))
    assert native.spec.model_impl == "native" and isinstance(native.config, PlainConfig)
    assert native.architectures == ("LlamaForCausalLM",) and native.task == "generate"
    fallback = resolve_model(EngineConfig(model=str(tmp_path / "llama"), model_impl="transformers"))
    assert fallback.spec.model_impl == "transformers" and isinstance(fallback.config, PlainConfig)
    # the fallback's runner reads transformers' own object (its model classes take nothing else)
    assert isinstance(transformers_config(fallback.model_dir), PretrainedConfig)


def test_a_cached_start_imports_no_transformers_config(tmp_path):
    # the start-up saving this exists for: a second engine start reads the config without transformers'
    # configuration module (which imports torch.distributed.tensor and sympy)
    save_tiny_model(tmp_path / "m", "Qwen2ForCausalLM")
    load_plain_config(tmp_path / "m")
    code = (
        "import sys, llmp\n"
        f"llm = llmp.LLM({str(tmp_path / 'm')!r}, max_model_len=64, num_kv_blocks=8)\n"
        "print(sorted(m for m in ('transformers.configuration_utils', 'sympy') if m in sys.modules))\n"
    )
    env = {**os.environ, "LLMP_CACHE_DIR": str(tmp_path / "cache")}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"
    assert Path(_cache_file(tmp_path / "m")).is_file()
