"""``LlamaForSequenceClassification`` (classifiers and reward models such as Skywork-Reward):
logits, probabilities and per-token rewards equal transformers'."""

from __future__ import annotations

import pytest
import torch

from llmp import LLM, PoolingParams
from llmp.testing import mixed_prompts, save_tiny_model


def activation(logits: torch.Tensor) -> torch.Tensor:  # vLLM's classify rule: sigmoid for one label
    return logits.sigmoid() if logits.shape[-1] == 1 else logits.softmax(-1)


@pytest.mark.parametrize("labels", [1, 3], ids=["reward-model", "three-labels"])
def test_classifier_and_rewards_match_transformers(tmp_path, labels):
    # pad_token_id 2 never occurs in the prompts: transformers pools the last token, as llmp does
    model = save_tiny_model(
        tmp_path, "LlamaForSequenceClassification", seed=labels, qk_scale=4.0, pad_token_id=2, num_labels=labels
    )
    prompts = mixed_prompts(5, seed=labels)
    inputs = [{"prompt_token_ids": p} for p in prompts]
    llm = LLM(str(tmp_path), dtype="float32", block_size=4)
    assert type(llm.engine.executor.runner.model).__name__ == "LlamaForSequenceClassification"
    assert llm.engine.info.options["task"] == "classify"
    raw = llm.classify(inputs, pooling_params=PoolingParams(use_activation=False), use_tqdm=False)
    probs = llm.classify(inputs, use_tqdm=False)
    rewards = llm.reward(inputs, use_tqdm=False)
    for prompt, got_raw, got_probs, got_rewards in zip(prompts, raw, probs, rewards, strict=True):
        with torch.no_grad():
            ids = torch.tensor([prompt])
            logits = model(ids).logits[0]
            per_token = model.score(model.model(ids).last_hidden_state)[0]
        torch.testing.assert_close(torch.tensor(got_raw.outputs.probs), logits, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(torch.tensor(got_probs.outputs.probs), activation(logits), atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(got_rewards.outputs.data, activation(per_token), atol=1e-5, rtol=1e-4)
