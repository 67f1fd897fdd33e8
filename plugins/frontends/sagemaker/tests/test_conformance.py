"""`llmp plugins verify frontend-sagemaker` as a test: the conformance kit's front-end checks on one server;
its probe asks /invocations for a completion, answered whole (no stream check)."""

from llmp.conformance import assert_conforms


def test_sagemaker_frontend_conforms():
    assert_conforms("frontend-sagemaker", kinds=["frontend"])
