"""The transformers fallback serves architectures with no native plugin, and its greedy output
equals transformers' own, token for token, through batching, prefix caching, chunked prefill
and preemption."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from llmp import LLM, SamplingParams
from llmp.api import ModelLoadError, UnknownComponentError
from llmp.testing import assert_greedy_parity, engine_greedy, mixed_prompts, save_tiny_llama, tiny_tokenizer

NEW_TOKENS = 24
# initializer_range 0.1 (not 0.02) makes attention sharp enough that a wrong key, position or window shows
SMALL = dict(vocab_size=512, bos_token_id=0, eos_token_id=1, pad_token_id=2, initializer_range=0.1)


def gpt2() -> torch.nn.Module:  # learned absolute positions, tied LM head, Conv1D projections
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=256, **SMALL))
    with torch.no_grad():  # the tied head's scaling (save_tiny) scales token embeddings: keep positions as strong
        model.transformer.wpe.weight.mul_(8.0)
    return model


def phi3() -> torch.nn.Module:  # fused qkv, partial rotary, a sliding window shorter than most prompts
    from transformers import Phi3Config, Phi3ForCausalLM

    return Phi3ForCausalLM(
        Phi3Config(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
            sliding_window=20,
            partial_rotary_factor=0.5,
            **SMALL,
        )
    )


def gpt_neox() -> torch.nn.Module:  # parallel residual, rotary on a quarter of each head
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    return GPTNeoXForCausalLM(
        GPTNeoXConfig(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            rotary_pct=0.25,
            max_position_embeddings=256,
            **SMALL,
        )
    )


def save_tiny(path: Path, build: Callable[[], torch.nn.Module], seed: int = 0) -> torch.nn.Module:
    """Save a random-weight model and a tiny tokenizer; the LM head is scaled up so greedy margins are wide."""
    torch.manual_seed(seed)
    model = build().float().eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(8.0)
    model.save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return model


@pytest.fixture(scope="module", params=[gpt2, phi3, gpt_neox], ids=lambda b: b.__name__)
def tiny(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    path = tmp_path_factory.mktemp(request.param.__name__)
    return path, save_tiny(path, request.param)


@pytest.fixture(scope="module")
def tiny_gpt2(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    path = tmp_path_factory.mktemp("gpt2")
    return path, save_tiny(path, gpt2, seed=1)


@pytest.fixture(scope="module")
def tiny_phi3(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    path = tmp_path_factory.mktemp("phi3")
    return path, save_tiny(path, phi3, seed=2)


def model_spec(llm: LLM):
    return llm.engine.model.spec


def test_batch_of_mixed_lengths_matches_transformers(tiny):
    path, model = tiny
    prompts = mixed_prompts()
    got, llm = engine_greedy(path, prompts, enable_prefix_caching=False)
    spec = model_spec(llm)
    assert (spec.name, spec.model_impl, spec.distribution) == ("*", "transformers", "llmp-models-transformers")
    assert type(llm.engine.executor.runner.model.hf_model) is type(model)
    assert_greedy_parity(model, prompts, got)


def test_prefix_caching_hits_and_matches_transformers(tiny_gpt2):
    path, model = tiny_gpt2
    prompts = mixed_prompts(count=6, shared_prefix=24, seed=2)
    llm = LLM(str(path), dtype="float32", block_size=4)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    # The first request fills the cache; the others then reuse its prefix blocks.
    first = llm.generate({"prompt_token_ids": prompts[0]}, params, use_tqdm=False)
    rest = llm.generate([{"prompt_token_ids": p} for p in prompts[1:]], params, use_tqdm=False)
    assert all(o.num_cached_tokens >= 24 for o in rest)
    assert_greedy_parity(model, prompts, [o.outputs[0].token_ids for o in first + rest])


def test_chunked_prefill_with_sliding_window_matches_transformers(tiny_phi3):
    path, model = tiny_phi3
    prompts = mixed_prompts(seed=4)
    got, llm = engine_greedy(path, prompts, max_num_batched_tokens=16, enable_prefix_caching=False)
    assert llm.engine.scheduler.num_prefill_chunks > 0
    assert_greedy_parity(model, prompts, got)


def test_preemption_recomputes_and_matches_transformers(tiny_gpt2):
    path, model = tiny_gpt2
    prompts = mixed_prompts(seed=3)
    # 40 blocks of 4 tokens hold 160 tokens: far less than 8 prompts plus their outputs.
    got, llm = engine_greedy(path, prompts, num_kv_blocks=40, max_model_len=128)
    assert llm.engine.scheduler.num_preemptions > 0
    assert_greedy_parity(model, prompts, got)


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
