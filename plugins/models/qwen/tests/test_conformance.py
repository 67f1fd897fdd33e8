"""The conformance kit's model suite on this plugin (what `llmp plugins verify models-qwen` runs):
Qwen2 (QKV bias, a sliding-window layer), Qwen3 (q/k norm) and Qwen3-MoE against transformers
through every engine path, tensor-parallel size 2 for the biases and the experts, and the
embedding and classifier variants."""

from llmp.conformance import assert_conforms


def test_conforms():
    assert_conforms("models-qwen", tensor_parallel=["Qwen2ForCausalLM", "Qwen3MoeForCausalLM"])
