"""The transformers fallback is chosen as it should be: for architectures with no native plugin, for
any with model_impl="transformers", never for one transformers lacks or cannot run on the KV cache.
(Its greedy output against transformers' through every engine path: tests/test_conformance.py.)"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from llmp import LLM
from llmp.api import ModelLoadError, UnknownComponentError
from llmp.testing import assert_greedy_parity, engine_greedy, mixed_prompts, save_tiny_llama, tiny_tokenizer

# initializer_range 0.1 (not 0.02) makes attention sharp enough that a wrong key, position or window shows
SMALL = dict(vocab_size=512, bos_token_id=0, eos_token_id=1, pad_token_id=2, initializer_range=0.1)


def gpt2() -> torch.nn.Module:  # learned absolute positions, tied LM head, Conv1D projections
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=256, **SMALL))
    with torch.no_grad():  # the tied head's scaling (save_tiny) scales token embeddings: keep positions as strong
        model.transformer.wpe.weight.mul_(8.0)
    return model


def save_tiny(path: Path, build: Callable[[], torch.nn.Module], seed: int = 0) -> torch.nn.Module:
    """Save a random-weight model and a tiny tokenizer; the LM head is scaled up so greedy margins are wide."""
    torch.manual_seed(seed)
    model = build().float().eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(8.0)
    model.save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return model


@pytest.fixture(scope="module")
def tiny_gpt2(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    path = tmp_path_factory.mktemp("gpt2")
    return path, save_tiny(path, gpt2, seed=1)


def model_spec(llm: LLM):
    return llm.engine.model.spec


def test_model_impl_transformers_forces_the_fallback_on_llama(tmp_path):
    model = save_tiny_llama(tmp_path, num_attention_heads=8, num_key_value_heads=2, initializer_range=0.1)
    prompts = mixed_prompts(count=4, seed=5)
    got, llm = engine_greedy(tmp_path, prompts, model_impl="transformers")
    assert model_spec(llm).name == "*"
    assert_greedy_parity(model, prompts, got)
    _, native = engine_greedy(tmp_path, prompts[:1], model_impl="auto")
    assert model_spec(native).name == "LlamaForCausalLM"  # auto still prefers the native plugin


def test_model_impl_native_refuses_an_architecture_without_a_native_plugin(tiny_gpt2):
    path, _ = tiny_gpt2
    with pytest.raises(UnknownComponentError, match="GPT2LMHeadModel.*LlamaForCausalLM"):
        LLM(str(path), dtype="float32", model_impl="native")


def test_architecture_unknown_to_transformers_is_refused_naming_the_native_ones(tmp_path):
    save_tiny_llama(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["architectures"] = ["FancyNewForCausalLM"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnknownComponentError, match="FancyNewForCausalLM.*LlamaForCausalLM.*no such class") as info:
        LLM(str(tmp_path), dtype="float32")
    assert isinstance(info.value, ModelLoadError)


def test_model_without_attention_backend_support_is_refused(tiny_gpt2, monkeypatch):
    from transformers import GPT2LMHeadModel

    monkeypatch.setattr(GPT2LMHeadModel, "_supports_attention_backend", False)
    with pytest.raises(ModelLoadError, match="GPT2LMHeadModel cannot run on llmp's KV cache"):
        LLM(str(tiny_gpt2[0]), dtype="float32")
