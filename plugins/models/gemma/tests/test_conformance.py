"""The conformance kit's model suite on this plugin (what `llmp plugins verify models-gemma` runs):
Gemma and Gemma 2 (alternating sliding windows, soft-capping) against transformers through every
engine path, Gemma 2 at tensor-parallel size 2, and the classifiers."""

from llmp.conformance import assert_conforms


def test_conforms():
    assert_conforms("models-gemma", tensor_parallel=["Gemma2ForCausalLM"])
