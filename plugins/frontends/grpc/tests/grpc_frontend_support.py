"""Helpers shared by the gRPC front-end tests (conftest puts this folder on sys.path)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from llmp.testing import LiveServer, free_port, serving
from llmp_frontend_grpc import llmp_pb2 as pb  # noqa: F401  (the tests import it from here)
from llmp_frontend_grpc import llmp_pb2_grpc as pb_grpc


class GrpcServer:
    """A live server: ``http`` (httpx, the OpenAI front-end) and ``stub`` (the gRPC front-end)."""

    def __init__(self, live: LiveServer, grpc_port: int, model: Path) -> None:
        self.live, self.grpc_port, self.model = live, grpc_port, model
        self.channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
        # /health answers once the front-ends are mounted; the gRPC port opens a moment later
        grpc.channel_ready_future(self.channel).result(timeout=30)
        self.stub = pb_grpc.LlmpStub(self.channel)
        self.http = httpx.Client(base_url=live.url, timeout=60)

    def close(self) -> None:
        self.channel.close()
        self.http.close()


def grpc_server(model: Path, *args: str, env: dict[str, str] | None = None) -> Iterator[GrpcServer]:
    port = free_port()
    with serving(
        model,
        "--frontend",
        "openai",
        "--frontend",
        "grpc",
        "--dtype",
        "float32",
        *args,
        env={"LLMP_GRPC_PORT": str(port), **(env or {})},
    ) as live:
        server = GrpcServer(live, port, model)
        try:
            yield server
        finally:
            server.close()
        assert live.process.poll() is None, f"the server died during the tests:\n{live.log()}"


def rpc_error(call: Any, *args: Any, **kwargs: Any) -> grpc.RpcError:
    """The error ``call(*args)`` must fail with."""
    with pytest.raises(grpc.RpcError) as info:
        call(*args, **kwargs)
    return info.value


def metrics(http: httpx.Client) -> dict[str, float]:
    """``/metrics`` as {'name{label="value"}': value}, without the model_name label."""
    out = {}
    for line in http.get("/metrics").text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            name, _, labels = key.partition("{")
            pairs = [f'{k}="{v}"' for k, v in re.findall(r'(\w+)="([^"]*)"', labels) if k != "model_name"]
            out[name + (f"{{{','.join(pairs)}}}" if pairs else "")] = float(value)
    return out


def wait_idle(http: httpx.Client, timeout: float) -> float:
    """Seconds until no request runs or waits in the engine; fails after ``timeout``."""
    start = time.monotonic()
    while True:
        m = metrics(http)
        if m.get("llmp_num_requests_running") == 0 and m.get("llmp_num_requests_waiting") == 0:
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            raise AssertionError(
                f"the engine is still busy {timeout} s later: {m.get('llmp_num_requests_running')} running"
            )
        time.sleep(0.05)
