"""bge-reranker-v2-gemma's recipe (a GemmaForCausalLM read as a classifier of the "Yes" token's
logit) equals that logit in transformers. (The Gemma and Gemma 2 sequence classifiers:
tests/test_conformance.py.)"""

from __future__ import annotations

import pytest
import torch

from llmp import LLM, PoolingParams
from llmp.testing import save_tiny_model, tiny_tokenizer


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
