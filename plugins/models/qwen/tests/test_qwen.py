"""Qwen variants beyond the conformance kit's checks (tests/test_conformance.py): Qwen3 with attention
biases, Qwen3-MoE unnormalised with a sparse step; causal LMs used as embedding models (task embed,
a sentence-transformers config) match transformers' last hidden state."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from llmp import LLM
from llmp.testing import assert_greedy_parity, engine_greedy, mixed_prompts, save_tiny_model

MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)

# beyond the conformance kit's tiny Qwen2 (QKV bias, a sliding-window layer), Qwen3 (head size 32) and
# Qwen3-MoE (normalised top 2 of 4 beside a dense layer): tests/test_conformance.py
CASES = {
    "qwen3-attention-bias": ("Qwen3ForCausalLM", dict(head_dim=16, attention_bias=True)),
    "qwen3-moe-unnormalised-sparse-step": (
        "Qwen3MoeForCausalLM",
        dict(MOE, norm_topk_prob=False, decoder_sparse_step=2),
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_greedy_matches_transformers(tmp_path, case):
    architecture, config = CASES[case]
    model = save_tiny_model(tmp_path, architecture, seed=len(case), qk_scale=4.0, **config)
    prompts = mixed_prompts(6, seed=len(case))
    got, llm = engine_greedy(tmp_path, prompts, enable_prefix_caching=False)
    assert type(llm.engine.executor.runner.model).__name__ == architecture
    assert_greedy_parity(model, prompts, got)


def hf_last_token_embeddings(base_model: torch.nn.Module, prompts: list[list[int]]) -> list[torch.Tensor]:
    with torch.no_grad():
        return [F.normalize(base_model(torch.tensor([p])).last_hidden_state[0, -1], dim=-1) for p in prompts]


def assert_embeddings_match(outputs, expected) -> None:
    assert len(outputs) == len(expected)
    for out, ref in zip(outputs, expected, strict=True):
        got = torch.tensor(out.outputs.embedding)
        assert got.shape == ref.shape
        assert F.cosine_similarity(got, ref, dim=0) > 0.9999
        assert torch.allclose(got, ref, atol=1e-4)


def test_causal_lm_as_embedding_model_with_task_embed(tmp_path):
    model = save_tiny_model(tmp_path, "Qwen3ForCausalLM", seed=11, head_dim=16)
    prompts = mixed_prompts(5, seed=11)
    llm = LLM(str(tmp_path), dtype="float32", block_size=4, task="embed")
    assert llm.engine.info.options["task"] == "embed"
    outputs = llm.embed([{"prompt_token_ids": p} for p in prompts], use_tqdm=False)
    assert_embeddings_match(outputs, hf_last_token_embeddings(model.model, prompts))
    with pytest.raises(ValueError, match="cannot generate text"):
        llm.generate({"prompt_token_ids": prompts[0]}, use_tqdm=False)


def test_sentence_transformers_config_makes_a_causal_lm_embed(tmp_path):
    # Qwen3-Embedding ships as Qwen3ForCausalLM plus a sentence-transformers pooling config
    model = save_tiny_model(tmp_path, "Qwen3ForCausalLM", seed=13, head_dim=16)
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_lasttoken": True}))
    (tmp_path / "modules.json").write_text(
        json.dumps(
            [
                {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
                {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
            ]
        )
    )
    prompts = mixed_prompts(3, seed=13)
    llm = LLM(str(tmp_path), dtype="float32", block_size=4)
    assert llm.engine.info.options["task"] == "embed"
    outputs = llm.embed([{"prompt_token_ids": p} for p in prompts], use_tqdm=False)
    assert_embeddings_match(outputs, hf_last_token_embeddings(model.model, prompts))
