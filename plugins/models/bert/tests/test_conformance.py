"""The conformance kit's model suite on this plugin (what `llmp plugins verify models-bert` runs):
each encoder's token states and pooled embedding, and each cross-encoder's logits and
probabilities, against transformers."""

from llmp.conformance import assert_conforms


def test_conforms():
    assert_conforms("models-bert")
