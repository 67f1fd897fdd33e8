"""``LlamaForSequenceClassification`` (classifiers and reward models such as Skywork-Reward):
logits, probabilities and per-token rewards equal transformers'."""

from __future__ import annotations

import pytest

from llmp.testing import assert_classifier_parity


@pytest.mark.parametrize("labels", [1, 3], ids=["reward-model", "three-labels"])
def test_classifier_and_rewards_match_transformers(tmp_path, labels):
    assert_classifier_parity(tmp_path, "LlamaForSequenceClassification", seed=labels, num_labels=labels)
