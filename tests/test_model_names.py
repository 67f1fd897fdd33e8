"""Models are found by the names people use for them: packaged models by their Hugging Face Hub
ids (any case, as on the Hub), cached models by their ids in any case, and an id that is not on
this machine gets an error saying how to bring it here."""

from __future__ import annotations

import pytest
import torch

from llmp import LLM
from llmp.api import ModelLoadError
from llmp.model_files.lookup import find_model_dir
from llmp.model_files.packaged import PACKAGED_MODELS, packaged_model
from llmp.model_files.resolve import resolve_model
from llmp.options import DEFAULT_MODEL, EngineConfig
from llmp.testing import minilm_dir, save_tiny_llama, sentence_transformers_reference

MINILM_ID = "sentence-transformers/all-MiniLM-L6-v2"
SMOLLM2_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
TEXTS = ["A man is eating food.", "The stock market crashed today."]


def test_the_embedding_model_in_the_venv_answers_to_its_hub_id():
    llm = LLM(MINILM_ID, task="embed", dtype="float32")
    try:
        got = torch.tensor([o.outputs.embedding for o in llm.embed(TEXTS, use_tqdm=False)])
    finally:
        llm.shutdown()
    assert torch.allclose(got, sentence_transformers_reference(minilm_dir(), TEXTS), atol=1e-5)


@pytest.mark.parametrize(
    "name", [MINILM_ID, MINILM_ID.upper(), MINILM_ID.lower(), "all-MiniLM-L6-v2", "all-minilm:l6-v2"]
)
def test_embedding_model_names_resolve_to_the_packaged_directory(name):
    resolved = resolve_model(EngineConfig(model=name))
    assert resolved.model_dir == minilm_dir()
    assert resolved.task == "embed" and resolved.architectures == ("BertModel",)
    assert resolved.name == name  # the name served is the one asked for, as vLLM serves the Hub id


@pytest.mark.parametrize("name", [SMOLLM2_ID, SMOLLM2_ID.lower(), "SmolLM2-135M-Instruct", "smollm2:135m"])
def test_the_default_model_answers_to_its_hub_id(name):
    resolved = resolve_model(EngineConfig(model=name))
    assert resolved.model_dir == find_model_dir(None)  # the packaged GGUF, converted once
    assert resolved.task == "generate" and resolved.architectures == ("LlamaForCausalLM",)


def test_every_packaged_model_is_installed_in_the_dev_venv_and_the_default_is_one_of_them():
    assert packaged_model(DEFAULT_MODEL) is not None
    for model in PACKAGED_MODELS:
        assert model.location() is not None and model.location().exists(), model


def test_a_directory_wins_over_a_packaged_name(tmp_path, monkeypatch):
    """`hf download ... --local-dir all-MiniLM-L6-v2` then `llmp serve all-MiniLM-L6-v2` serves that directory."""
    save_tiny_llama(tmp_path / "all-MiniLM-L6-v2")
    monkeypatch.chdir(tmp_path)
    assert find_model_dir("all-MiniLM-L6-v2").resolve() == tmp_path / "all-MiniLM-L6-v2"


def test_a_cached_hub_id_is_found_in_any_case(tmp_path, monkeypatch):
    from huggingface_hub import constants

    commit = "0" * 40
    repo = tmp_path / "models--SomeOrg--Tiny-Model"
    snapshot = repo / "snapshots" / commit
    save_tiny_llama(snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    assert find_model_dir("SomeOrg/Tiny-Model") == snapshot
    assert find_model_dir("someorg/tiny-model") == snapshot


def test_a_hub_id_not_on_this_machine_offline_says_how_to_get_it(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelLoadError) as caught:
        LLM("NoSuchOrg/No-Such-Model")
    message = str(caught.value)
    assert "'NoSuchOrg/No-Such-Model' is not on this machine" in message
    assert "HF_HUB_OFFLINE=1 forbids downloading it" in message
    assert "llmp pull NoSuchOrg/No-Such-Model" in message
    assert "hf download NoSuchOrg/No-Such-Model --local-dir No-Such-Model" in message
    assert "HF_HOME" in message and "llmp serve ./No-Such-Model" in message


def test_a_packaged_alias_with_a_revision_asks_for_its_hub_repository(tmp_path, monkeypatch):
    # --revision / --gguf-file ask for the Hub's files (docs/models.md): the alias names its repository,
    # never the packaged copy, and never "not found"
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    hub_id = packaged_model("smollm2:135m").hub_id
    for asked in ({"revision": "v9"}, {"gguf_file": "x.gguf"}):
        with pytest.raises(ModelLoadError, match=f"'{hub_id}' is not on this machine"):
            find_model_dir("smollm2:135m", **asked)


def test_a_missing_path_is_not_called_a_hub_id(tmp_path):
    with pytest.raises(ModelLoadError, match="no such directory or .gguf file") as caught:
        find_model_dir(str(tmp_path / "nope"))
    assert "hf download" not in str(caught.value)
