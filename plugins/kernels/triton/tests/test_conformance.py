"""The conformance kit's kernel suite on this plugin (what `llmp plugins verify kernels-triton` runs):
every kernel against the torch reference set, then a tiny Llama's greedy tokens with the set; without
CUDA under Triton's interpreter (conftest.py), on the kit's smaller grid."""

from llmp.conformance import assert_conforms


def test_conforms():
    assert_conforms("kernels-triton")
