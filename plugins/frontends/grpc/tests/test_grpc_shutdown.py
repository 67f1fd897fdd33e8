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
