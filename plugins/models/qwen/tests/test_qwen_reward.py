"""Qwen2.5-Math's reward models as vLLM serves them natively: Qwen2ForRewardModel (a raw reward at
every token from an MLP head) and Qwen2ForProcessRewardModel (wrong/right probabilities at each step
tag). transformers has no class for them (the checkpoints ship remote code), so the checkpoint is a
transformers Qwen2Model under ``model.`` plus a random ``score.0``/``score.2`` head, and the reference
is that Qwen2Model's hidden states through the same head."""

from __future__ import annotations

import json
import random

import pytest
import torch
from safetensors.torch import load_file, save_file

from llmp import LLM, PoolingParams
from llmp.testing import mixed_prompts, save_tiny_model

PRM_STEP_TAG = 151651  # <extra_0>: the step tag Qwen2.5-Math-PRM's prompts end each step with


def save_tiny_reward_model(
    path, architecture: str, num_labels: int, **config
) -> tuple[torch.nn.Module, torch.nn.Sequential]:
    """A tiny random Qwen2 reward checkpoint of ``architecture``; returns the transformers Qwen2Model
    and the head (``score``), both float32."""
    model = save_tiny_model(path, "Qwen2Model", seed=11, qk_scale=4.0, **config)
    torch.manual_seed(12)
    hidden = model.config.hidden_size
    head = torch.nn.Sequential(
        torch.nn.Linear(hidden, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, num_labels)
    ).eval()
    weights = {f"model.{name}": tensor for name, tensor in load_file(path / "model.safetensors").items()}
    weights.update({f"score.{name}": tensor.detach().clone() for name, tensor in head.state_dict().items()})
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    settings = json.loads((path / "config.json").read_text())
    # as the Qwen2.5-Math checkpoints: no labels in the config (transformers' default of two)
    settings["architectures"] = [architecture]
    (path / "config.json").write_text(json.dumps(settings))
    return model, head


def reference(model: torch.nn.Module, head: torch.nn.Module, prompt: list[int]) -> torch.Tensor:
    """``[tokens, num_labels]`` logits: the head on each of the Qwen2Model's final hidden states."""
    with torch.no_grad():
        return head(model(torch.tensor([prompt])).last_hidden_state[0])


def test_reward_model_gives_raw_rewards_at_every_token(tmp_path):
    model, head = save_tiny_reward_model(tmp_path, "Qwen2ForRewardModel", 1)
    prompts = mixed_prompts(5, seed=11)
    inputs = [{"prompt_token_ids": p} for p in prompts]
    llm = LLM(str(tmp_path), dtype="float32", block_size=4)
    assert type(llm.engine.executor.runner.model).__name__ == "Qwen2ForRewardModel"
    assert llm.engine.info.options["num_labels"] == 1
    rewards = llm.reward(inputs, use_tqdm=False)
    through_sigmoid = llm.reward(inputs, pooling_params=PoolingParams(use_activation=True), use_tqdm=False)
    for prompt, got, got_sigmoid in zip(prompts, rewards, through_sigmoid, strict=True):
        expected = reference(model, head, prompt)
        assert got.prompt_token_ids == prompt
        # raw by default, as vLLM's Qwen2ForRewardModel
        torch.testing.assert_close(got.outputs.data, expected, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(got_sigmoid.outputs.data, expected.sigmoid(), atol=1e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="returned_token_ids"):
        llm.reward(inputs[:1], pooling_params=PoolingParams(returned_token_ids=[1]), use_tqdm=False)


def with_step_tags(prompts: list[list[int]], tag: int, seed: int) -> list[list[int]]:
    """Each prompt with ``tag`` after a few of its tokens and at its end, as a PRM's steps end."""
    rng = random.Random(seed)
    tagged = []
    for prompt in prompts:
        cuts = sorted(rng.sample(range(1, len(prompt)), min(2, len(prompt) - 1)))
        steps = [prompt[a:b] for a, b in zip([0, *cuts], [*cuts, len(prompt)], strict=True)]
        tagged.append([token for step in steps for token in (*step, tag)])
    return tagged


def test_process_reward_model_scores_each_step_tag(tmp_path):
    # a vocabulary that holds the default step tag (151651)
    model, head = save_tiny_reward_model(tmp_path, "Qwen2ForProcessRewardModel", 2, vocab_size=PRM_STEP_TAG + 16)
    other_tag = 2  # <unk>: never among mixed_prompts' tokens
    default_prompts = with_step_tags(mixed_prompts(4, seed=12), PRM_STEP_TAG, seed=12)
    other_prompts = with_step_tags(mixed_prompts(3, seed=13), other_tag, seed=13)
    llm = LLM(str(tmp_path), dtype="float32", block_size=4)
    assert type(llm.engine.executor.runner.model).__name__ == "Qwen2ForProcessRewardModel"
    assert llm.engine.info.options["num_labels"] == 2

    def assert_steps(outputs, prompts, tag, activation) -> None:
        for prompt, got in zip(prompts, outputs, strict=True):
            rows = [i for i, token in enumerate(prompt) if token == tag]
            expected = activation(reference(model, head, prompt)[rows])
            assert len(got.outputs.data) == len(rows) == 3
            torch.testing.assert_close(got.outputs.data, expected, atol=1e-5, rtol=1e-4)

    def softmax(logits):
        return logits.softmax(-1)

    def raw(logits):
        return logits

    # vLLM's default step tag and its softmax over (wrong, right)
    inputs = [{"prompt_token_ids": p} for p in default_prompts]
    assert_steps(llm.reward(inputs, use_tqdm=False), default_prompts, PRM_STEP_TAG, softmax)
    # a request's own step tag, through LLM.encode
    inputs = [{"prompt_token_ids": p} for p in other_prompts]
    params = PoolingParams(task="token_classify", step_tag_id=other_tag)
    assert_steps(llm.encode(inputs, pooling_params=params, use_tqdm=False), other_prompts, other_tag, softmax)
    params = PoolingParams(task="token_classify", step_tag_id=other_tag, use_activation=False)
    assert_steps(llm.encode(inputs, pooling_params=params, use_tqdm=False), other_prompts, other_tag, raw)
    # returned_token_ids keeps the "right" column, before the activation (one column: the sigmoid), as vLLM
    params = PoolingParams(task="token_classify", step_tag_id=other_tag, returned_token_ids=[1])
    right = llm.encode(inputs, pooling_params=params, use_tqdm=False)
    assert_steps(right, other_prompts, other_tag, lambda logits: logits[:, [1]].sigmoid())
