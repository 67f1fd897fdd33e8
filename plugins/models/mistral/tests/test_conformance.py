"""The conformance kit's model suite on this plugin (what `llmp plugins verify models-mistral` runs):
Mistral's sliding window and Mixtral's experts against transformers, through batching, block sizes,
chunked prefill, the prefix cache, preemption and (Mixtral) tensor-parallel size 2."""

from llmp.conformance import assert_conforms


def test_conforms():
    assert_conforms("models-mistral", tensor_parallel=["MixtralForCausalLM"])
