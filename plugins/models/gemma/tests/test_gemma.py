"""Gemma and Gemma 2: greedy output equals transformers' token for token, batched with
mixed lengths, through prefix caching and chunked prefill. Gemma 2's reference runs
transformers' eager attention, the implementation that applies soft-capping."""

from __future__ import annotations

import pytest

from llmp.testing import assert_greedy_parity, engine_greedy, mixed_prompts, save_tiny_model

GEMMA2 = dict(
    head_dim=16,
    sliding_window=8,
    query_pre_attn_scalar=24,
    attn_logit_softcapping=2.0,
    final_logit_softcapping=3.0,
    attn_implementation="eager",
    qk_scale=6.0,
)


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_gemma_matches_transformers(tmp_path, tie):
    model = save_tiny_model(
        tmp_path, "GemmaForCausalLM", seed=2, head_dim=16, tie_word_embeddings=tie, logit_scale=1.0 if tie else 8.0
    )
    prompts = mixed_prompts(6, seed=2)
    got, llm = engine_greedy(tmp_path, prompts, enable_prefix_caching=False)
    assert type(llm.engine.executor.runner.model).__name__ == "GemmaForCausalLM"
    assert_greedy_parity(model, prompts, got)


@pytest.mark.parametrize(
    "options",
    [
        dict(enable_prefix_caching=False),
        dict(max_num_batched_tokens=16),
    ],
    ids=["batched", "chunked-prefill"],
)
def test_gemma2_matches_transformers(tmp_path, options):
    model = save_tiny_model(tmp_path, "Gemma2ForCausalLM", seed=3, **GEMMA2)
    prompts = mixed_prompts(6, seed=3)
    got, llm = engine_greedy(tmp_path, prompts, **options)
    layers = llm.engine.executor.runner.model.attention_layers()
    assert [layer.sliding_window for layer in layers] == [8, None]  # sliding, then global
    assert all(layer.softcap == 2.0 for layer in layers)
    assert_greedy_parity(model, prompts, got)


def test_gemma2_prefix_caching_matches_transformers(tmp_path):
    model = save_tiny_model(tmp_path, "Gemma2ForCausalLM", seed=4, **GEMMA2)
    prompts = mixed_prompts(5, shared_prefix=20, seed=4)
    got, llm = engine_greedy(tmp_path, prompts[:1] + prompts)  # the first request warms the cache
    assert llm.engine.kv_manager.prefix_cache_hits > 0
    assert_greedy_parity(model, prompts, got[1:])


def test_gemma2_logprobs_follow_the_capped_logits(tmp_path):
    # soft-capping never changes the argmax, so greedy parity cannot see it: compare log-probabilities
    import torch

    from llmp import LLM, SamplingParams

    model = save_tiny_model(tmp_path, "Gemma2ForCausalLM", seed=5, **{**GEMMA2, "final_logit_softcapping": 1.5})
    prompt = mixed_prompts(1, seed=5)[0]
    llm = LLM(str(tmp_path), dtype="float32", block_size=4)
    params = SamplingParams(temperature=0.0, max_tokens=1, logprobs=5)
    out = llm.generate({"prompt_token_ids": prompt}, params, use_tqdm=False)[0].outputs[0]
    with torch.no_grad():
        expected = torch.log_softmax(model(torch.tensor([prompt])).logits[0, -1], dim=-1)
    top = out.logprobs[0]
    assert len(top) >= 5
    for token_id, logprob in top.items():
        assert abs(logprob.logprob - expected[token_id].item()) < 1e-4, (token_id, logprob, expected[token_id])
