"""``LlamaForSequenceClassification`` with one label (reward models such as Skywork-Reward): logits,
the sigmoid's probabilities and per-token rewards equal transformers'. (Several labels:
tests/test_conformance.py.)"""

from __future__ import annotations

from llmp.testing import assert_classifier_parity


def test_reward_model_matches_transformers(tmp_path):
    assert_classifier_parity(tmp_path, "LlamaForSequenceClassification", seed=1, num_labels=1)
