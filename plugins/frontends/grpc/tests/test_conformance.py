"""`llmp plugins verify frontend-grpc` as a test: the conformance kit's front-end checks on one server;
a server of its own (the gRPC port): start and stop apply; the HTTP checks are
skipped (its tests check the gRPC side: keys, bad requests, cancellation)."""

from llmp.conformance import assert_conforms


def test_grpc_frontend_conforms():
    assert_conforms("frontend-grpc", kinds=["frontend"])
