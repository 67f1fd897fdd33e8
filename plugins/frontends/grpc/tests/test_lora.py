"""A LoRA adapter (``--enable-lora --lora-modules a=PATH``) as the ``model`` of the gRPC service,
against the OpenAI front-end of the same server (the OpenAI plugin's tests check its adapter tokens
against the offline engine)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_frontend_support import GrpcServer, grpc_server, pb, rpc_error

from llmp.testing import save_random_lora

PROMPT = "Hello world"
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def adapter(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_random_lora(tiny_model, tmp_path_factory.mktemp("lora") / "a", seed=1)


@pytest.fixture(scope="module")
def server(tiny_model: Path, adapter: Path) -> Iterator[GrpcServer]:
    yield from grpc_server(tiny_model, "--enable-lora", "--lora-modules", f"a={adapter}")


def openai_ids(server: GrpcServer, model: str) -> list[int]:
    body = {"model": model, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}
    response = server.http.post("/v1/completions", json={**body, "return_token_ids": True})
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["token_ids"]


def greedy(**fields: object) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        **{"text": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True, **fields}
    )


def test_generate_on_an_adapter(server: GrpcServer, tiny_model: Path) -> None:
    response = server.stub.Generate(greedy(model="a"), timeout=60)
    assert response.model == "a"
    assert list(response.token_ids) == openai_ids(server, "a")
    base = server.stub.Generate(greedy(), timeout=60)
    assert base.model == str(tiny_model)
    assert list(base.token_ids) == openai_ids(server, str(tiny_model)) != list(response.token_ids)


def test_generate_stream_on_an_adapter(server: GrpcServer) -> None:
    messages = list(server.stub.GenerateStream(greedy(model="a"), timeout=60))
    assert {m.model for m in messages} == {"a"}
    assert [t for m in messages for t in m.token_ids] == openai_ids(server, "a")


def test_list_models_lists_the_adapter(server: GrpcServer, tiny_model: Path, adapter: Path) -> None:
    models = server.stub.ListModels(pb.ListModelsRequest(), timeout=30).models
    assert [(m.id, m.root) for m in models] == [(str(tiny_model), str(tiny_model)), ("a", str(adapter))]
    assert all(m.max_model_len == 512 for m in models)


def test_unknown_model_is_not_found(server: GrpcServer) -> None:
    error = rpc_error(server.stub.Generate, greedy(model="b"), timeout=30)
    assert error.code() == grpc.StatusCode.NOT_FOUND and "b" in error.details()
