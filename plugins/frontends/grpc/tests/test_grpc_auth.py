"""With an API key, every RPC but Health needs ``authorization: Bearer <key>``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_frontend_support import GrpcServer, grpc_server, pb, rpc_error

KEY = "Secret-Key-42"  # mixed case: its lower- and upper-cased forms are wrong keys
BODY_LIMIT = 64 << 10


@pytest.fixture(scope="module")
def server(tiny_model: Path) -> Iterator[GrpcServer]:
    yield from grpc_server(
        tiny_model,
        "--api-key",
        KEY,
        "--served-model-name",
        "alias",
        "--max-request-body-bytes",
        str(BODY_LIMIT),
        env={"LLMP_API_KEY": KEY},
    )


@pytest.mark.parametrize(
    "metadata",
    [
        None,
        [("authorization", KEY)],
        [("authorization", f"Bearer {KEY.lower()}")],
        [("authorization", f"Basic {KEY}")],
        [("x-api-key", KEY)],
    ],
)
def test_missing_or_wrong_key_is_unauthenticated(server: GrpcServer, metadata: list | None) -> None:
    for call, request in (
        (server.stub.ListModels, pb.ListModelsRequest()),
        (server.stub.Tokenize, pb.TokenizeRequest(text="hi")),
        (server.stub.Generate, pb.GenerateRequest(text="hi", max_tokens=1)),
    ):
        error = rpc_error(call, request, metadata=metadata, timeout=30)
        assert error.code() == grpc.StatusCode.UNAUTHENTICATED, (call, error.details())
        assert "API key" in error.details()
    stream = server.stub.GenerateStream(pb.GenerateRequest(text="hi", max_tokens=1), metadata=metadata, timeout=30)
    assert rpc_error(list, stream).code() == grpc.StatusCode.UNAUTHENTICATED


def test_right_key_works(server: GrpcServer) -> None:
    metadata = [("authorization", f"Bearer {KEY}")]
    models = server.stub.ListModels(pb.ListModelsRequest(), metadata=metadata, timeout=30).models
    assert [m.id for m in models] == ["alias"]
    reply = server.stub.Generate(
        pb.GenerateRequest(model="alias", text="hi", max_tokens=2, ignore_eos=True), metadata=metadata, timeout=60
    )
    assert len(reply.token_ids) == 2 and reply.finish_reason == "length"
    http = server.http.post(
        "/v1/completions",
        headers={"Authorization": f"Bearer {KEY}"},
        json={
            "model": "alias",
            "prompt": "hi",
            "max_tokens": 2,
            "temperature": 0,
            "ignore_eos": True,
            "return_token_ids": True,
        },
    )
    greedy = server.stub.Generate(
        pb.GenerateRequest(model="alias", text="hi", max_tokens=2, temperature=0, ignore_eos=True),
        metadata=metadata,
        timeout=60,
    )
    assert list(greedy.token_ids) == http.json()["choices"][0]["token_ids"]


def test_health_needs_no_key(server: GrpcServer) -> None:
    assert server.stub.Health(pb.HealthRequest(), timeout=30).status == pb.HealthResponse.SERVING


def test_max_request_body_bytes_bounds_a_message(server: GrpcServer) -> None:
    metadata = [("authorization", f"Bearer {KEY}")]
    text = "a" * (BODY_LIMIT + 1)
    error = rpc_error(server.stub.Tokenize, pb.TokenizeRequest(text=text), metadata=metadata, timeout=30)
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error.details()
    http = server.http.post("/tokenize", headers={"Authorization": f"Bearer {KEY}"}, json={"prompt": text})
    assert http.status_code == 413  # as the HTTP routes
    fits = server.stub.Tokenize(pb.TokenizeRequest(text=text[: BODY_LIMIT // 2]), metadata=metadata, timeout=30)
    assert fits.count > 0
