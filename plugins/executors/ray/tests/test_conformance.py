"""The executor suite of the conformance kit (what `llmp plugins verify executors-ray` runs), on the
test cluster: greedy parity with uniproc at tensor-parallel 2, collective_rpc, a killed actor, shutdown.
(Without ``executor_options`` the executor starts a local Ray instance of its own.)"""

from llmp.conformance import assert_conforms


def test_ray_executor_conforms(cluster):
    assert_conforms("executors-ray", executor_options={"ray_address": cluster})
