"""Mixtral beyond the conformance kit's checks (tests/test_conformance.py: Mistral's sliding window
and Mixtral's top-2-of-4 experts through every engine path, MistralModel embeddings): top-1 routing
over 3 experts, and a checkpoint missing an expert refused by name."""

from __future__ import annotations

import pytest

from llmp import LLM
from llmp.testing import assert_greedy_parity, engine_greedy, mixed_prompts, save_tiny_model

MIXTRAL = dict(num_local_experts=4, num_experts_per_tok=2)


def test_mixtral_top1_of_3_matches_transformers(tmp_path):
    config = dict(num_experts_per_tok=1, num_local_experts=3)  # top 2 of 4: tests/test_conformance.py
    model = save_tiny_model(tmp_path, "MixtralForCausalLM", seed=5, qk_scale=4.0, **config)
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
