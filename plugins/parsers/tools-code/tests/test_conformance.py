"""`llmp plugins verify parsers-tools-code`: the conformance kit's checks on pythonic and qwen3_xml.

Streamed deltas add up to the whole parse on llmp's recorded outputs cut every way, results only
grow, malformed output never raises or loses text, one instance serves interleaved requests.
"""

from llmp.conformance import assert_conforms


def test_conforms():
    assert_conforms("parsers-tools-code")
