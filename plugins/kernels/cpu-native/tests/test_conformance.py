"""The conformance kit's kernel suite on this plugin (what `llmp plugins verify kernels-cpu-native` runs):
every kernel against the torch reference set over the engine's shapes, then a tiny Llama's greedy
tokens with the set."""

from llmp.conformance import assert_conforms


def test_conforms():
    assert_conforms("kernels-cpu-native")
