"""Every native family at tensor-parallel size 2 (mp executor, two real worker
processes) still equals transformers' greedy output: QKV bias, q/k norm and
expert weights are split over ranks the same way as dense Llama weights."""

from __future__ import annotations

import pytest

from llmp.testing import assert_greedy_parity, engine_greedy, mixed_prompts, save_tiny_model

CASES = {
    "qwen2-bias": ("Qwen2ForCausalLM", {}),
    "qwen3-moe": ("Qwen3MoeForCausalLM", dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)),
    "mixtral": ("MixtralForCausalLM", dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=8)),
    "gemma2": (
        "Gemma2ForCausalLM",
        dict(
            head_dim=16,
            sliding_window=8,
            query_pre_attn_scalar=24,
            attn_logit_softcapping=2.0,
            attn_implementation="eager",
            qk_scale=6.0,
        ),
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_tensor_parallel_family_matches_transformers(tmp_path, case):
    architecture, config = CASES[case]
    model = save_tiny_model(tmp_path, architecture, seed=21, **{"qk_scale": 4.0, **config})
    prompts = mixed_prompts(4, seed=21)
    got, llm = engine_greedy(tmp_path, prompts, executor="mp", tensor_parallel_size=2, max_model_len=128)
    assert len(llm.engine.executor.worker_pids) == 2
    llm.shutdown()
    assert_greedy_parity(model, prompts, got)
