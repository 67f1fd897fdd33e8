"""`llmp plugins verify parsers-reasoning`: the conformance kit's checks on deepseek_r1, qwen3 and mistral.

Streamed deltas add up to the whole parse on llmp's recorded outputs cut every way, results only
grow, malformed output never raises or loses text, one instance serves interleaved requests.
"""

from llmp.conformance import assert_conforms


def test_conforms():
    assert_conforms("parsers-reasoning")
