"""``MistralForSequenceClassification``: logits, probabilities and per-token rewards equal
transformers' (a sliding window shorter than most prompts)."""

from __future__ import annotations

from llmp.testing import assert_classifier_parity


def test_classifier_and_rewards_match_transformers(tmp_path):
    assert_classifier_parity(tmp_path, "MistralForSequenceClassification", seed=4, sliding_window=8)
