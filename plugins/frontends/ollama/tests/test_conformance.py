"""`llmp plugins verify frontend-ollama` as a test: the conformance kit's front-end checks on one server;
its probe asks for /api/chat, whole and streamed as NDJSON (ending with a done line)."""

from llmp.conformance import assert_conforms


def test_ollama_frontend_conforms():
    assert_conforms("frontend-ollama", kinds=["frontend"])
