"""`llmp plugins verify frontend-mcp` as a test: the conformance kit's front-end checks on one server;
its probe calls the generate tool over /mcp, answered whole (no stream check)."""

from llmp.conformance import assert_conforms


def test_mcp_frontend_conforms():
    assert_conforms("frontend-mcp", kinds=["frontend"])
