"""Gemma and Gemma 2 sequence classifiers: logits, probabilities and per-token rewards equal
transformers'; bge-reranker-v2-gemma's recipe (a GemmaForCausalLM read as a classifier of the
"Yes" token's logit) equals that logit in transformers."""

from __future__ import annotations

import pytest
import torch

from llmp import LLM, PoolingParams
from llmp.testing import mixed_prompts, save_tiny_model, tiny_tokenizer

GEMMA2 = dict(
    head_dim=16, query_pre_attn_scalar=16, sliding_window=8, attn_logit_softcapping=50.0, final_logit_softcapping=30.0
)
CASES = {
    "gemma2": ("Gemma2ForSequenceClassification", GEMMA2),
    "gemma": ("GemmaForSequenceClassification", dict(head_dim=16)),
}


@pytest.mark.parametrize("case", CASES)
def test_classifier_and_rewards_match_transformers(tmp_path, case):
    architecture, config = CASES[case]
    # pad_token_id 2 never occurs in the prompts: transformers pools the last token, as llmp does
    model = save_tiny_model(tmp_path, architecture, seed=5, qk_scale=4.0, pad_token_id=2, num_labels=3, **config)
    prompts = mixed_prompts(5, seed=5)
    inputs = [{"prompt_token_ids": p} for p in prompts]
    llm = LLM(str(tmp_path), dtype="float32", block_size=4)
    assert type(llm.engine.executor.runner.model).__name__ == architecture
    raw = llm.classify(inputs, pooling_params=PoolingParams(use_activation=False), use_tqdm=False)
    probs = llm.classify(inputs, use_tqdm=False)
    rewards = llm.reward(inputs, pooling_params=PoolingParams(use_activation=False), use_tqdm=False)
    for prompt, got_raw, got_probs, got_rewards in zip(prompts, raw, probs, rewards, strict=True):
        with torch.no_grad():
            ids = torch.tensor([prompt])
            logits = model(ids).logits[0]
            per_token = model.score(model.model(ids).last_hidden_state)[0]
        torch.testing.assert_close(torch.tensor(got_raw.outputs.probs), logits, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(torch.tensor(got_probs.outputs.probs), logits.softmax(-1), atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(got_rewards.outputs.data, per_token, atol=1e-5, rtol=1e-4)


def test_bge_reranker_gemma_recipe_scores_the_yes_logit(tmp_path):
    model = save_tiny_model(
        tmp_path, "GemmaForCausalLM", seed=6, logit_scale=1.0, head_dim=16, tie_word_embeddings=True
    )
    tokenizer = tiny_tokenizer()
    tokenizer.add_tokens(["Yes"])
    tokenizer.save_pretrained(tmp_path)
    yes = tokenizer.convert_tokens_to_ids("Yes")
    overrides = {
        "architectures": ["GemmaForSequenceClassification"],
        "classifier_from_token": ["Yes"],
        "method": "no_post_processing",
    }
    llm = LLM(str(tmp_path), dtype="float32", block_size=4, hf_overrides=overrides)
    assert type(llm.engine.executor.runner.model).__name__ == "GemmaForSequenceClassification"
    documents = ["The quick brown fox.", "Paged attention keeps the KV cache in blocks.", "def add(a, b):"]
    raw = llm.score(
        "What is paged attention?", documents, pooling_params=PoolingParams(use_activation=False), use_tqdm=False
    )
    scores = llm.score("What is paged attention?", documents, use_tqdm=False)
    for got_raw, got in zip(raw, scores, strict=True):
        with torch.no_grad():
            logit = model(torch.tensor([got.prompt_token_ids])).logits[0, -1, yes]
        assert got_raw.prompt_token_ids == got.prompt_token_ids
        assert got_raw.outputs.score == pytest.approx(logit.item(), abs=1e-4)
        assert got.outputs.score == pytest.approx(logit.sigmoid().item(), abs=1e-4)
