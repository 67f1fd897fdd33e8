"""The conformance kit's model suite on this plugin (what `llmp plugins verify models-llama` runs):
greedy parity with transformers, paged-KV, prefix-cache and preemption invariance, embeddings and
classifier logits. Llama at tensor-parallel size 2 is the mp executor's own test."""

from llmp.conformance import assert_conforms


def test_conforms():
    assert_conforms("models-llama", tensor_parallel="none")
