"""The executor suite of the conformance kit (what `llmp plugins verify executors-mp` runs): greedy
parity with uniproc at tensor-parallel 2, collective_rpc, a killed worker, shutdown."""

from llmp.conformance import assert_conforms


def test_mp_executor_conforms():
    assert_conforms("executors-mp")
