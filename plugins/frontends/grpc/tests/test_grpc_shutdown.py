"""SIGTERM drains gRPC calls as it drains HTTP requests: those in flight get ``--shutdown-timeout``,
new ones are refused, and the engine stops only after them."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import grpc
import httpx
from grpc_frontend_support import pb, pb_grpc, rpc_error

from llmp.testing import free_port, serving


def test_sigterm_lets_a_stream_in_flight_finish_and_refuses_new_calls(tiny_model: Path) -> None:
    port = free_port()
    args = ("--frontend", "openai", "--frontend", "grpc", "--dtype", "float32", "--shutdown-timeout", "60")
    with serving(tiny_model, *args, env={"LLMP_GRPC_PORT": str(port)}) as live:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            grpc.channel_ready_future(channel).result(timeout=30)
            stub = pb_grpc.LlmpStub(channel)
            # 480 tokens: seconds on a CPU, where the engine used to stop 0.2 s after the signal
            ask = pb.GenerateRequest(text="1, 2, 3,", max_tokens=480, temperature=0, ignore_eos=True)
            stream = stub.GenerateStream(ask, timeout=120)
            next(stream)  # generating
            live.process.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 30
            while _healthy(live.url):  # until the signal is handled (HTTP refuses, or its port closes)
                assert time.monotonic() < deadline
                time.sleep(0.02)
            refused = rpc_error(stub.Generate, pb.GenerateRequest(text="Hi", max_tokens=2), timeout=30)
            assert refused.code() == grpc.StatusCode.UNAVAILABLE, refused
            last = list(stream)[-1]
            assert (last.finish_reason, last.usage.completion_tokens) == ("length", 480)
        assert live.process.wait(timeout=60) == 0, live.log()


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health").status_code == 200
    except httpx.TransportError:
        return False


def test_a_call_still_running_when_the_drain_ends_gets_its_text_and_abort(tiny_model: Path, tmp_path: Path) -> None:
    # as an HTTP request: the engine aborts it at --shutdown-timeout and the call ends with what it has
    # (grpcio used to cancel it at that same moment: UNAVAILABLE, the text lost)
    from llmp.testing import SlowSteps

    (tmp_path / "slow-site").mkdir()
    slow = SlowSteps(tmp_path / "slow-site")
    port = free_port()
    args = ("--frontend", "grpc", "--dtype", "float32", "--shutdown-timeout", "1", "--executor", "slow-steps")
    with serving(tiny_model, *args, env={**slow.env, "LLMP_GRPC_PORT": str(port)}) as live, slow.slowed():
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            grpc.channel_ready_future(channel).result(timeout=30)
            stub = pb_grpc.LlmpStub(channel)
            ask = pb.GenerateRequest(text="1, 2, 3,", max_tokens=400, temperature=0, ignore_eos=True)
            unary = stub.Generate.future(ask, timeout=120)  # 20 s at least, slowed
            stream = stub.GenerateStream(ask, timeout=120)
            next(stream)
            live.process.send_signal(signal.SIGTERM)
            last = list(stream)[-1]
            assert last.finish_reason == "abort" and 0 < last.usage.completion_tokens < 400
            whole = unary.result(timeout=60)
            assert whole.finish_reason == "abort" and len(whole.token_ids) == whole.usage.completion_tokens > 0
        assert live.process.wait(timeout=60) == 0, live.log()
