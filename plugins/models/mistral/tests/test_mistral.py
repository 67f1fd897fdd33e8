"""Mistral (sliding-window attention) and Mixtral (mixture of experts): greedy output
equals transformers' token for token, batched with mixed lengths, through prefix
caching and chunked prefill; MistralModel checkpoints serve embeddings."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from llmp import LLM
from llmp.testing import assert_greedy_parity, engine_greedy, mixed_prompts, save_tiny_model

WINDOW = 8  # far shorter than the prompts (3-60 tokens) plus 24 new tokens, so the window matters
MIXTRAL = dict(num_local_experts=4, num_experts_per_tok=2)


@pytest.mark.parametrize(
    "options",
    [
        dict(enable_prefix_caching=False),
        dict(max_num_batched_tokens=16),  # chunked prefill: chunks attend across the window boundary
    ],
    ids=["batched", "chunked-prefill"],
)
def test_mistral_sliding_window_matches_transformers(tmp_path, options):
    model = save_tiny_model(tmp_path, "MistralForCausalLM", seed=3, sliding_window=WINDOW, qk_scale=4.0)
    prompts = mixed_prompts(6, seed=3)
    got, llm = engine_greedy(tmp_path, prompts, **options)
    assert type(llm.engine.executor.runner.model).__name__ == "MistralForCausalLM"
    assert all(layer.sliding_window == WINDOW for layer in llm.engine.executor.runner.model.attention_layers())
    assert_greedy_parity(model, prompts, got)


def test_mistral_prefix_caching_matches_transformers(tmp_path):
    model = save_tiny_model(tmp_path, "MistralForCausalLM", seed=4, sliding_window=WINDOW, qk_scale=4.0)
    prompts = mixed_prompts(5, shared_prefix=20, seed=4)
    first, rest = prompts[0], prompts[1:]
    got, _ = engine_greedy(tmp_path, [first])  # a separate engine run must not matter
    got_rest, llm = engine_greedy(tmp_path, [first] + rest)
    assert llm.engine.kv_manager.prefix_cache_hits > 0
    assert_greedy_parity(model, prompts, got_rest)
    assert got[0] == got_rest[0]


@pytest.mark.parametrize(
    "extra", [{}, dict(num_experts_per_tok=1, num_local_experts=3)], ids=["top2-of-4", "top1-of-3"]
)
def test_mixtral_matches_transformers(tmp_path, extra):
    model = save_tiny_model(tmp_path, "MixtralForCausalLM", seed=5, qk_scale=4.0, **{**MIXTRAL, **extra})
    prompts = mixed_prompts(6, seed=5)
    got, llm = engine_greedy(tmp_path, prompts, max_num_batched_tokens=32)
    assert type(llm.engine.executor.runner.model).__name__ == "MixtralForCausalLM"
    assert_greedy_parity(model, prompts, got)


def test_mixtral_checkpoint_missing_an_expert_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    from llmp.api import ModelLoadError

    save_tiny_model(tmp_path, "MixtralForCausalLM", seed=6, **MIXTRAL)
    weights = load_file(tmp_path / "model.safetensors")
    del weights["model.layers.1.block_sparse_moe.experts.3.w2.weight"]
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match=r"layers\.1\.mlp\.experts\.w2:3:down"):
        LLM(str(tmp_path), dtype="float32")


def test_mistral_base_model_serves_embeddings(tmp_path):
    model = save_tiny_model(tmp_path, "MistralModel", seed=8, sliding_window=WINDOW)
    prompts = mixed_prompts(4, seed=8)
    llm = LLM(str(tmp_path), dtype="float32", block_size=4)
    assert llm.engine.info.options["task"] == "embed"
    outputs = llm.embed([{"prompt_token_ids": p} for p in prompts], use_tqdm=False)
    with torch.no_grad():
        expected = [F.normalize(model(torch.tensor([p])).last_hidden_state[0, -1], dim=-1) for p in prompts]
    for out, ref in zip(outputs, expected, strict=True):
        assert F.cosine_similarity(torch.tensor(out.outputs.embedding), ref, dim=0) > 0.9999
