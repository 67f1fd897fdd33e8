"""`llmp plugins verify frontend-openai` as a test: the conformance kit's front-end checks on one server;
its probe asks for /v1/completions, whole and streamed; it is the reference of
the other front-ends' parity check, so that one is skipped here."""

from llmp.conformance import assert_conforms


def test_openai_frontend_conforms():
    assert_conforms("frontend-openai", kinds=["frontend"])
