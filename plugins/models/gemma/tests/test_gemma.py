"""Gemma and Gemma 2 beyond the conformance kit's checks (tests/test_conformance.py: untied Gemma and
Gemma 2's windows and soft-caps through every engine path): Gemma with tied embeddings, and Gemma 2's
log-probabilities through the final soft-cap. Gemma 2's reference runs transformers' eager
attention, the implementation that applies soft-capping."""

from __future__ import annotations

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


def test_gemma_with_tied_embeddings_matches_transformers(tmp_path):
    # untied: tests/test_conformance.py
    config = dict(head_dim=16, tie_word_embeddings=True, logit_scale=1.0)
    model = save_tiny_model(tmp_path, "GemmaForCausalLM", seed=2, **config)
    prompts = mixed_prompts(6, seed=2)
    got, llm = engine_greedy(tmp_path, prompts, enable_prefix_caching=False)
    assert type(llm.engine.executor.runner.model).__name__ == "GemmaForCausalLM"
    assert_greedy_parity(model, prompts, got)


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
