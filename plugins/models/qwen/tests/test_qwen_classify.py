"""Qwen3-Reranker as vLLM serves it: a Qwen3ForCausalLM whose "yes" and "no" token logits become a
score through hf_overrides, as a pooling-only classifier or, without the architectures override, in
an engine that also generates. (The Qwen2 and Qwen3 sequence classifiers: tests/test_conformance.py.)"""

from __future__ import annotations

import pytest
import torch

from llmp import LLM, PoolingParams
from llmp.testing import (
    assert_greedy_parity,
    engine_greedy,
    mixed_prompts,
    save_tiny_model,
    tiny_tokenizer,
)

RERANKER = {"classifier_from_token": ["no", "yes"], "is_original_qwen3_reranker": True}
QUERY = "What is paged attention?"
DOCUMENTS = [
    "Paged attention keeps the KV cache in fixed-size blocks.",
    "The quick brown fox jumps over the lazy dog.",
    "Continuous batching serves many requests at once.",
    "def add(a, b): return a + b",
]


def save_tiny_reranker(path, *, tied: bool, logit_scale: float = 1.0) -> tuple[torch.nn.Module, int, int]:
    """A tiny Qwen3ForCausalLM whose tokenizer has "no" and "yes" tokens; returns it and their ids."""
    model = save_tiny_model(
        path, "Qwen3ForCausalLM", seed=9, logit_scale=logit_scale, qk_scale=4.0, head_dim=16, tie_word_embeddings=tied
    )
    tokenizer = tiny_tokenizer()
    tokenizer.add_tokens(["no", "yes"])
    tokenizer.save_pretrained(path)
    return model, tokenizer.convert_tokens_to_ids("no"), tokenizer.convert_tokens_to_ids("yes")


def assert_reranker_scores(llm: LLM, model: torch.nn.Module, no: int, yes: int) -> None:
    """llmp's scores (raw and through the sigmoid) equal transformers' yes-minus-no logit at the last token."""
    raw = llm.score(QUERY, DOCUMENTS, pooling_params=PoolingParams(use_activation=False), use_tqdm=False)
    scores = llm.score(QUERY, DOCUMENTS, use_tqdm=False)
    for got_raw, got in zip(raw, scores, strict=True):
        assert got_raw.prompt_token_ids == got.prompt_token_ids
        with torch.no_grad():
            logits = model(torch.tensor([got.prompt_token_ids])).logits[0, -1]
        margin = (logits[yes] - logits[no]).item()
        assert got_raw.outputs.score == pytest.approx(margin, abs=1e-4)
        assert got.outputs.score == pytest.approx(torch.sigmoid(torch.tensor(margin)).item(), abs=1e-4)


@pytest.mark.parametrize("tied", [False, True], ids=["lm-head", "tied-embeddings"])
def test_qwen3_reranker_recipe_scores_as_transformers(tmp_path, tied):
    model, no, yes = save_tiny_reranker(tmp_path, tied=tied)
    overrides = {"architectures": ["Qwen3ForSequenceClassification"], **RERANKER}
    llm = LLM(str(tmp_path), dtype="float32", block_size=4, hf_overrides=overrides)
    assert type(llm.engine.executor.runner.model).__name__ == "Qwen3ForSequenceClassification"
    assert "generate" not in llm.engine.info.options["supported_tasks"]
    assert_reranker_scores(llm, model, no, yes)


def test_qwen3_reranker_without_the_architecture_override_generates_and_scores(tmp_path):
    model, no, yes = save_tiny_reranker(tmp_path, tied=False, logit_scale=8.0)  # wide greedy margins
    prompts = mixed_prompts(4, seed=9)
    got, llm = engine_greedy(tmp_path, prompts, hf_overrides=RERANKER)
    assert type(llm.engine.executor.runner.model).__name__ == "Qwen3ForCausalLM"
    assert {"generate", "classify", "score"} <= set(llm.engine.info.options["supported_tasks"])
    assert_greedy_parity(model, prompts, got)
    assert_reranker_scores(llm, model, no, yes)


def test_qwen3_reranker_at_tensor_parallel_size_2(tmp_path):
    # the live LM head is split over the ranks by vocabulary rows: each rank adds the token rows it holds
    pytest.importorskip("llmp_executors_mp", reason="the mp executor plugin is not installed")
    model, no, yes = save_tiny_reranker(tmp_path, tied=False)
    for overrides in (RERANKER, {"architectures": ["Qwen3ForSequenceClassification"], **RERANKER}):
        llm = LLM(
            str(tmp_path),
            dtype="float32",
            block_size=4,
            hf_overrides=overrides,
            executor="mp",
            tensor_parallel_size=2,
            max_model_len=128,
        )
        try:
            assert_reranker_scores(llm, model, no, yes)
        finally:
            llm.shutdown()


def test_a_causal_lm_converted_to_a_classifier_without_a_head_says_how_to_get_one(tmp_path):
    from llmp.api import ModelLoadError

    save_tiny_model(tmp_path, "Qwen3ForCausalLM", seed=3, head_dim=16)
    with pytest.raises(ModelLoadError, match=r"no classification head.*classifier_from_token"):
        LLM(str(tmp_path), task="classify", dtype="float32")
