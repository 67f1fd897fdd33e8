"""`llmp plugins verify frontend-anthropic` as a test: the conformance kit's front-end checks on one server;
its probe asks for /v1/messages, whole and streamed (ending with message_stop)."""

from llmp.conformance import assert_conforms


def test_anthropic_frontend_conforms():
    assert_conforms("frontend-anthropic", kinds=["frontend"])
