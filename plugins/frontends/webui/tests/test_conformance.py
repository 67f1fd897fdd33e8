"""`llmp plugins verify frontend-webui` as a test: the conformance kit's front-end checks on one server;
a page: its exact public path answers without the key; it names no probe (its
replies come from the OpenAI routes), so the checks of generations are skipped."""

from llmp.conformance import assert_conforms


def test_webui_frontend_conforms():
    assert_conforms("frontend-webui", kinds=["frontend"])
