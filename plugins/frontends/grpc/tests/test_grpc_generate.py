"""The gRPC service against the OpenAI front-end of the same server: same model, same answers."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_frontend_support import GrpcServer, grpc_server, metrics, pb, rpc_error, wait_idle

from llmp.testing import SlowSteps

PROMPT = "Hello world"
MAX_TOKENS = 8
CONTEXT = 512  # the tiny Llama's max_position_embeddings


@pytest.fixture(scope="module")
def slow(tmp_path_factory: pytest.TempPathFactory) -> SlowSteps:
    # slowed, a long generation lasts long whatever the machine (CONTEXT - 20 tokens: 24 s at least)
    return SlowSteps(tmp_path_factory.mktemp("slow-site"))


@pytest.fixture(scope="module")
def server(tiny_model: Path, slow: SlowSteps) -> Iterator[GrpcServer]:
    yield from grpc_server(tiny_model, "--executor", "slow-steps", env=slow.env)


def completion(server: GrpcServer, **body: object) -> dict:
    response = server.http.post(
        "/v1/completions",
        json={
            "prompt": PROMPT,
            "max_tokens": MAX_TOKENS,
            "temperature": 0,
            "ignore_eos": True,
            "return_token_ids": True,
            **body,
        },
    )
    assert response.status_code == 200, response.text
    return response.json()


def greedy(**fields: object) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        **{"text": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True, **fields}
    )


@pytest.fixture(scope="module")
def unary(server: GrpcServer) -> pb.GenerateResponse:
    return server.stub.Generate(greedy(), timeout=60)


def test_generate_equals_openai_completion(server: GrpcServer, unary: pb.GenerateResponse) -> None:
    choice = completion(server)["choices"][0]
    assert list(unary.token_ids) == choice["token_ids"]
    assert len(unary.token_ids) == MAX_TOKENS
    assert unary.text == choice["text"] and unary.text
    assert unary.finish_reason == "length" == choice["finish_reason"]
    prompt_ids = server.http.post("/tokenize", json={"prompt": PROMPT}).json()["tokens"]
    assert (unary.usage.prompt_tokens, unary.usage.completion_tokens, unary.usage.total_tokens) == (
        len(prompt_ids),
        MAX_TOKENS,
        len(prompt_ids) + MAX_TOKENS,
    )
    assert unary.model == str(server.model)


def test_token_id_prompt_equals_text_prompt(server: GrpcServer, unary: pb.GenerateResponse) -> None:
    ids = list(server.stub.Tokenize(pb.TokenizeRequest(text=PROMPT), timeout=30).token_ids)
    reply = server.stub.Generate(greedy(text=None, token_ids=pb.TokenIds(ids=ids)), timeout=60)
    assert list(reply.token_ids) == list(unary.token_ids)
    assert reply.usage.prompt_tokens == len(ids)


def test_stream_deltas_add_up_to_the_unary_answer(server: GrpcServer, unary: pb.GenerateResponse) -> None:
    messages = list(server.stub.GenerateStream(greedy(), timeout=60))
    assert len(messages) >= 2
    assert "".join(m.text for m in messages) == unary.text
    assert [t for m in messages for t in m.token_ids] == list(unary.token_ids)
    *deltas, last = messages
    assert all(m.finish_reason == "" and not m.HasField("usage") for m in deltas)
    assert last.finish_reason == "length"
    assert last.usage == unary.usage


def test_stop_string_matches_openai(server: GrpcServer, unary: pb.GenerateResponse) -> None:
    stop = unary.text[len(unary.text) // 2 :][:1]  # a character the greedy answer reaches halfway
    reply = server.stub.Generate(greedy(stop=[stop]), timeout=60)
    choice = completion(server, stop=[stop])["choices"][0]
    assert reply.finish_reason == "stop" == choice["finish_reason"]
    assert reply.stop_reason == stop == choice["stop_reason"]
    assert reply.text == choice["text"] == unary.text[: unary.text.index(stop)]


def test_chat_equals_openai_chat(server: GrpcServer) -> None:
    messages = [{"role": "user", "content": "Hi there"}]
    reply = server.stub.Generate(
        pb.GenerateRequest(
            chat=pb.Chat(messages=[pb.ChatMessage(**m) for m in messages]), max_tokens=4, temperature=0, ignore_eos=True
        ),
        timeout=60,
    )
    body = server.http.post(
        "/v1/chat/completions", json={"messages": messages, "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    ).json()
    assert reply.text == body["choices"][0]["message"]["content"]
    assert reply.usage.prompt_tokens == body["usage"]["prompt_tokens"]
    assert len(reply.token_ids) == 4


def test_tokenize_equals_http_tokenize(server: GrpcServer) -> None:
    text = "Tokenize <s> this"
    http = server.http.post("/tokenize", json={"prompt": text}).json()
    reply = server.stub.Tokenize(pb.TokenizeRequest(text=text), timeout=30)
    assert list(reply.token_ids) == http["tokens"] and reply.count == http["count"] == len(http["tokens"])
    assert reply.max_model_len == CONTEXT
    bare = server.stub.Tokenize(pb.TokenizeRequest(text=text, add_special_tokens=False), timeout=30)
    assert (
        list(bare.token_ids)
        == server.http.post("/tokenize", json={"prompt": text, "add_special_tokens": False}).json()["tokens"]
    )
    messages = [{"role": "system", "content": "Be brief"}, {"role": "user", "content": "Hi"}]
    chat = server.stub.Tokenize(
        pb.TokenizeRequest(chat=pb.Chat(messages=[pb.ChatMessage(**m) for m in messages])), timeout=30
    )
    assert list(chat.token_ids) == server.http.post("/tokenize", json={"messages": messages}).json()["tokens"]


def test_list_models_and_health(server: GrpcServer) -> None:
    models = server.stub.ListModels(pb.ListModelsRequest(), timeout=30).models
    assert [(m.id, m.max_model_len) for m in models] == [(str(server.model), CONTEXT)]
    assert [m["id"] for m in server.http.get("/v1/models").json()["data"]] == [models[0].id]
    assert server.stub.Health(pb.HealthRequest(), timeout=30).status == pb.HealthResponse.SERVING


@pytest.mark.parametrize(
    ("fields", "code", "contains"),
    [
        ({"model": "no-such-model"}, grpc.StatusCode.NOT_FOUND, "The model `no-such-model` does not exist."),
        ({"temperature": -1}, grpc.StatusCode.INVALID_ARGUMENT, "temperature must be >= 0"),
        (
            {"max_tokens": CONTEXT + 1},
            grpc.StatusCode.INVALID_ARGUMENT,
            f"max_tokens={CONTEXT + 1} cannot be greater than max_model_len={CONTEXT}",
        ),
        ({"max_tokens": CONTEXT - 2}, grpc.StatusCode.INVALID_ARGUMENT, "This model's maximum context length is 512"),
        ({"top_p": 0}, grpc.StatusCode.INVALID_ARGUMENT, "top_p must be in (0"),
        (
            {"text": None, "token_ids": pb.TokenIds(ids=[1, 512])},
            grpc.StatusCode.INVALID_ARGUMENT,
            "token id 512 in token_ids is out of vocabulary (size 512)",
        ),
        ({"text": None, "token_ids": pb.TokenIds()}, grpc.StatusCode.INVALID_ARGUMENT, "token_ids must not be empty"),
        ({"text": None}, grpc.StatusCode.INVALID_ARGUMENT, "give the prompt as one of text, token_ids or chat"),
        ({"stop": [""]}, grpc.StatusCode.INVALID_ARGUMENT, "stop strings must not be empty"),
    ],
)
@pytest.mark.parametrize("rpc", ["Generate", "GenerateStream"])
def test_bad_requests(server: GrpcServer, rpc: str, fields: dict, code: grpc.StatusCode, contains: str) -> None:
    request = greedy(**{k: v for k, v in fields.items() if v is not None})
    if fields.get("text", "") is None and request.WhichOneof("input") == "text":
        request.ClearField("text")  # no prompt at all
    call = getattr(server.stub, rpc)
    error = rpc_error(lambda: list(call(request, timeout=30)) if rpc == "GenerateStream" else call(request, timeout=30))
    assert error.code() == code, error.details()
    assert contains in error.details()


@pytest.mark.parametrize("rpc", ["Generate", "GenerateStream", "Tokenize", "Health"])
def test_bytes_that_are_not_the_message_are_invalid_argument(server: GrpcServer, rpc: str) -> None:
    """grpcio's own answer to a request that does not decode is UNKNOWN, a server error to clients."""
    streaming = rpc == "GenerateStream"
    method = (server.channel.unary_stream if streaming else server.channel.unary_unary)(f"/llmp.v1.Llmp/{rpc}")
    garbage = b"\x0a\xff\xff\xff\xff\x0f"  # field 1, length-delimited, a length past the end
    error = rpc_error(lambda: list(method(garbage, timeout=30)) if streaming else method(garbage, timeout=30))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert "is not a valid llmp.v1." in error.details()
    assert server.stub.Health(pb.HealthRequest(), timeout=30).status == pb.HealthResponse.SERVING


def test_cancelled_stream_aborts_the_request(server: GrpcServer) -> None:
    before = metrics(server.http)
    stream = server.stub.GenerateStream(greedy(max_tokens=CONTEXT - 20), timeout=120)
    first = next(stream)
    assert first.token_ids and not first.finish_reason
    stream.cancel()
    # unaborted, ~490 tokens would keep the engine busy for many seconds
    wait_idle(server.http, timeout=5)
    after = metrics(server.http)
    aborted = 'llmp_request_success_total{finished_reason="abort"}'
    assert after.get(aborted, 0) == before.get(aborted, 0) + 1
    assert after["llmp_generation_tokens_total"] - before["llmp_generation_tokens_total"] < CONTEXT - 20


def test_deadline_aborts_the_request(server: GrpcServer, slow: SlowSteps) -> None:
    # slowed, the request takes 24 s at least: a 5 s deadline fires mid-generation however fast the
    # machine, with seconds to spare for a stalled client or server to have started it by then
    deadline = 5.0
    before = metrics(server.http)
    with slow.slowed():
        started = time.monotonic()
        error = rpc_error(server.stub.Generate, greedy(max_tokens=CONTEXT - 20), timeout=deadline)
        assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert time.monotonic() - started < deadline + 5
        wait_idle(server.http, timeout=5)
    after = metrics(server.http)
    aborted = 'llmp_request_success_total{finished_reason="abort"}'
    assert after.get(aborted, 0) == before.get(aborted, 0) + 1
    assert after["llmp_generation_tokens_total"] - before["llmp_generation_tokens_total"] < CONTEXT - 20
