"""Finding and reading model files: every broken input names the file at fault."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from llmp import LLM
from llmp.api import ModelLoadError
from llmp.model_files.lookup import find_model_dir
from llmp.model_files.weights import weight_files
from llmp.testing import save_tiny_llama


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sharded")
    save_tiny_llama(path, max_shard_size="100KB")
    return path


def copy_of(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target


def test_sharded_index_lists_every_shard(sharded):
    files = weight_files(sharded)
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    assert {f.name for f in files} == set(index["weight_map"].values())


def test_missing_shard_is_named(sharded, tmp_path):
    model = copy_of(sharded, tmp_path / "m")
    victim = sorted(model.glob("*.safetensors"))[1]
    victim.unlink()
    with pytest.raises(ModelLoadError, match=victim.name):
        LLM(str(model), dtype="float32")


def test_corrupt_weight_file_is_named(sharded, tmp_path):
    model = copy_of(sharded, tmp_path / "m")
    victim = sorted(model.glob("*.safetensors"))[0]
    victim.write_bytes(b"\x00" * 64)
    with pytest.raises(ModelLoadError, match=victim.name):
        LLM(str(model), dtype="float32")


def test_missing_weight_is_named(tmp_path):
    import torch
    from safetensors.torch import load_file, save_file

    save_tiny_llama(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    del weights["model.layers.1.mlp.up_proj.weight"]
    weights["model.layers.0.input_layernorm.weight"] = torch.ones(3)
    save_file(weights, tmp_path / "model.safetensors")
    with pytest.raises(ModelLoadError, match=r"model.layers.0.input_layernorm.weight has shape \(3,\)"):
        LLM(str(tmp_path), dtype="float32")
    weights["model.layers.0.input_layernorm.weight"] = torch.ones(64)
    save_file(weights, tmp_path / "model.safetensors")
    with pytest.raises(
        ModelLoadError, match=r"lacks weights of LlamaForCausalLM: model\.layers\.1\.mlp\.up_proj\.weight$"
    ):
        LLM(str(tmp_path), dtype="float32")


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"intermediate_size": 96},
            r"'model\.layers\.0\.mlp\.[a-z]+_proj\.weight' does not fit LlamaForCausalLM "
            r"\(does config\.json match the weights\?\): .*has shape \((64, )?128(, 64)?\), "
            r"the model expects \((64, )?96(, 64)?\)",
        ),
        ({"num_hidden_layers": 1}, r"'model\.layers\.1\.[a-z_.]+' has no place in LlamaForCausalLM"),
        ({"num_hidden_layers": 3}, r"lacks weights of LlamaForCausalLM: model\.layers\.2\."),
        ({"vocab_size": 500}, r"'(model\.embed_tokens|lm_head)\.weight' does not fit .*\(512, 64\).*\(500, 64\)"),
    ],
    ids=["intermediate-size", "fewer-layers", "more-layers", "vocab-size"],
)
def test_config_that_does_not_match_the_weights_names_the_weight(tmp_path, change, message):
    save_tiny_llama(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(ModelLoadError, match=message):
        LLM(str(tmp_path), dtype="float32")


def test_unknown_paths_and_names_say_what_was_tried(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelLoadError, match="no such directory or .gguf file"):
        find_model_dir(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="holds no config.json"):
        find_model_dir(tmp_path / "empty")
    with pytest.raises(ModelLoadError, match="not in the Hugging Face cache.*hf download some-org/some-model"):
        find_model_dir("some-org/some-model-that-is-not-cached")


def test_corrupt_gguf_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("LLMP_CACHE_DIR", str(tmp_path / "cache"))
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 60)
    with pytest.raises(ModelLoadError, match="broken.gguf"):
        find_model_dir(bad)
    assert not list((tmp_path / "cache").rglob("*.safetensors"))  # nothing half-written is kept


def test_a_gguf_file_is_known_by_its_magic_and_another_file_is_named(tmp_path, monkeypatch):
    # as llama.cpp: a GGUF file under any name (model.bin, MODEL.GGUF) is read as one
    monkeypatch.setenv("LLMP_CACHE_DIR", str(tmp_path / "cache"))
    for name in ("model.bin", "MODEL.GGUF"):
        renamed = tmp_path / name
        renamed.write_bytes(b"GGUF" + b"\x00" * 60)
        with pytest.raises(ModelLoadError, match=name):  # read as GGUF: its own (truncated) error names it
            find_model_dir(renamed)
    text = tmp_path / "readme.txt"
    text.write_text("not a model")
    with pytest.raises(ModelLoadError, match="readme.txt is a file but not a GGUF file"):
        find_model_dir(text)


def test_unsupported_architecture_lists_the_supported_ones(tmp_path):
    from llmp.api import UnknownComponentError

    save_tiny_llama(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["architectures"] = ["FancyNewForCausalLM"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnknownComponentError, match="FancyNewForCausalLM.*LlamaForCausalLM"):
        LLM(str(tmp_path), dtype="float32")


@pytest.mark.parametrize("method", ["bitsandbytes", "fp8", "hqq"])
def test_a_quantised_checkpoint_of_another_method_is_refused_in_one_line_naming_it(tmp_path, method):
    """AWQ, GPTQ and compressed-tensors int8 load (tests/engine/test_hf_quantized.py); other methods are refused."""
    save_tiny_llama(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["quantization_config"] = {"quant_method": method, "bits": 4, "group_size": 128}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=f"method '{method}' .* not supported: llmp runs awq, gptq"):
        LLM(str(tmp_path), dtype="float32")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_dtype_is_applied_to_weights_and_cache(tmp_path, dtype):
    save_tiny_llama(tmp_path)
    llm = LLM(str(tmp_path), dtype=dtype, max_model_len=64)
    runner = llm.engine.executor.runner
    assert {str(p.dtype) for p in runner.model.parameters()} == {f"torch.{dtype}"}
    assert all(str(k.dtype) == f"torch.{dtype}" for k, _ in runner.kv_caches)
    with pytest.raises(ValueError, match="dtype must be"):
        LLM(str(tmp_path), dtype="int8")


def test_two_processes_converting_one_gguf_file_together_both_get_the_finished_directory(tmp_path):
    """Servers and test workers may start on the same file at once: one converts, the other waits
    for it; neither deletes the directory the other is loading from."""
    import os
    import subprocess
    import sys

    from llmp.model_files.packaged import packaged_model
    from llmp.options import DEFAULT_MODEL

    gguf_file = packaged_model(DEFAULT_MODEL).location()  # the packaged default model's .gguf file
    script = (
        "import sys; from pathlib import Path; from llmp.model_files.gguf import convert_gguf; "
        "out = convert_gguf(Path(sys.argv[1])); "
        "assert (out / '.complete').is_file() and (out / 'config.json').is_file(); "
        "import os; print(out, os.stat(out).st_ino)"
    )
    env = {**os.environ, "LLMP_CACHE_DIR": str(tmp_path / "cache")}
    runs = [
        subprocess.Popen([sys.executable, "-c", script, str(gguf_file)], env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outputs = [run.communicate(timeout=300)[0].strip() for run in runs]
    assert [run.returncode for run in runs] == [0, 0]
    directory, inode = outputs[0].split()
    # the same directory for both, never replaced under the one that finished first
    assert outputs[0] == outputs[1] and os.stat(directory).st_ino == int(inode)
    assert not list((tmp_path / "cache" / "gguf").glob("*.partial-*"))


def test_what_an_older_release_wrote_for_gguf_files_is_removed_when_a_file_is_first_read(tmp_path, monkeypatch):
    from llmp.model_files.gguf import convert_gguf
    from llmp.testing import save_tiny_gguf

    monkeypatch.setenv("LLMP_CACHE_DIR", str(tmp_path / "cache"))
    old = tmp_path / "cache" / "gguf" / "model-Q4_1-0123456789abcdef"  # a float32 copy of an older layout
    old.mkdir(parents=True)
    (old / ".complete").touch()
    (old / "model.safetensors").write_bytes(b"\0" * 1024)
    old.with_name(old.name + ".lock").touch()
    save_tiny_gguf(tmp_path / "tiny.gguf")
    first = convert_gguf(tmp_path / "tiny.gguf")
    assert not old.exists() and not old.with_name(old.name + ".lock").exists()
    assert sorted(p.name for p in (tmp_path / "cache" / "gguf").iterdir() if p.is_dir()) == sorted(
        [first.name, "content-ids"]
    )
    assert convert_gguf(tmp_path / "tiny.gguf") == first and (first / "config.json").is_file()
