"""What the server around the front-end does: probes, API keys, request ids, CORS, root path, docs, metrics."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import openai
import pytest
from openai_frontend_support import (
    ALIAS,
    API_KEY,
    OK_ORIGIN,
    ROOT_PATH,
    SHORT_CONTEXT,
    assert_error,
    metric,
    metrics,
    wait_idle,
)

from llmp import __version__

MESSAGES = [{"role": "user", "content": "The quick brown fox"}]


# -- probes ----------------------------------------------------------------------------


@pytest.mark.parametrize("prefix", ["", ROOT_PATH])
def test_probes(ops_http, prefix):
    assert ops_http.get(f"{prefix}/health").status_code == 200
    assert ops_http.get(f"{prefix}/live").status_code == 200
    assert ops_http.get(f"{prefix}/ping").status_code == 200
    version = ops_http.get(f"{prefix}/version")
    assert version.status_code == 200 and version.json() == {"version": __version__}


def test_models(client, tiny):
    models = client.models.list().data
    assert [m.id for m in models] == [tiny.name]
    data = models[0].model_dump()
    assert data["root"] == str(tiny.path) and data["object"] == "model" and data["owned_by"] == "llmp"
    assert data["max_model_len"] == 512
    # the SDKs' models.retrieve: the same card (a name with slashes included), else OpenAI's 404
    assert client.models.retrieve(tiny.name).model_dump() == data
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("no-such-model")
    assert info.value.body["param"] == "model" and "no-such-model" in info.value.body["message"]


def test_docs_and_openapi(http):
    assert http.get("/docs").status_code == 200
    spec = http.get("/openapi.json")
    assert spec.status_code == 200
    paths = spec.json()["paths"]
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/models", "/tokenize", "/detokenize", "/health"):
        assert path in paths, sorted(paths)
    assert "/v1/embeddings" not in paths  # a generative model's server


# -- root path ----------------------------------------------------------------------------


def test_root_path_serves_both_prefixed_and_plain_paths(ops_http, tiny):
    plain, prefixed = ops_http.get("/v1/models"), ops_http.get(f"{ROOT_PATH}/v1/models")
    assert plain.status_code == prefixed.status_code == 200
    assert plain.json()["data"][0]["id"] == prefixed.json()["data"][0]["id"] == tiny.name
    body = {"prompt": "The quick", "max_tokens": 2}
    assert ops_http.post(f"{ROOT_PATH}/v1/completions", json=body).status_code == 200
    assert ops_http.post("/v1/completions", json=body).status_code == 200


def test_root_path_sdk(ops_server, tiny):
    with openai.OpenAI(base_url=f"{ops_server.url}{ROOT_PATH}/v1", api_key="x", max_retries=0) as sdk:
        response = sdk.chat.completions.create(model=tiny.name, messages=MESSAGES, max_tokens=3)
    assert response.usage.completion_tokens >= 1


# -- request ids ----------------------------------------------------------------------------


def test_request_id_is_echoed(http):
    response = http.post(
        "/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 1}, headers={"X-Request-Id": "my-request-7"}
    )
    assert response.headers["x-request-id"] == "my-request-7"
    assert response.json()["id"] == "chatcmpl-my-request-7"
    assert http.get("/health", headers={"X-Request-Id": "probe-1"}).headers["x-request-id"] == "probe-1"


def test_request_id_is_made_when_missing(http):
    ids = []
    for response in (
        http.post("/v1/completions", json={"prompt": "x", "max_tokens": 1}),
        http.get("/v1/models"),
        http.get("/health"),
        http.get("/no-such-route"),
    ):
        assert re.fullmatch(r"[0-9a-f]{32}", response.headers["x-request-id"]), response.headers
        ids.append(response.headers["x-request-id"])
    assert len(set(ids)) == len(ids)


def test_request_id_on_errors_and_streams(http):
    error = http.post("/v1/chat/completions", json={"messages": []}, headers={"X-Request-Id": "bad-1"})
    assert error.status_code == 400 and error.headers["x-request-id"] == "bad-1"
    with http.stream(
        "POST",
        "/v1/chat/completions",
        json={"messages": MESSAGES, "max_tokens": 2, "stream": True},
        headers={"X-Request-Id": "stream-1"},
    ) as response:
        assert response.headers["x-request-id"] == "stream-1"
        assert response.headers["content-type"].startswith("text/event-stream")
        assert '"id":"chatcmpl-stream-1"' in response.read().decode()


# -- CORS ---------------------------------------------------------------------------------------


def preflight(http, origin):
    return http.options(
        "/v1/chat/completions",
        headers={
            "Origin": origin,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type",
        },
    )


def test_cors_preflight_from_an_allowed_origin(ops_http):
    response = preflight(ops_http, OK_ORIGIN)
    assert response.status_code == 200
    assert response.headers["access-control-allow-origin"] == OK_ORIGIN
    assert "POST" in response.headers["access-control-allow-methods"]
    assert "authorization" in response.headers["access-control-allow-headers"].lower()


def test_cors_preflight_from_another_origin(ops_http):
    response = preflight(ops_http, "https://evil.example")
    assert "access-control-allow-origin" not in response.headers
    assert response.status_code >= 400


def test_cors_on_actual_requests(ops_http):
    ok = ops_http.get("/v1/models", headers={"Origin": OK_ORIGIN})
    assert ok.headers["access-control-allow-origin"] == OK_ORIGIN
    assert "x-request-id" in ok.headers["access-control-expose-headers"].lower()
    evil = ops_http.get("/v1/models", headers={"Origin": "https://evil.example"})
    assert evil.status_code == 200 and "access-control-allow-origin" not in evil.headers


def test_no_cors_unless_configured(http):
    response = preflight(http, OK_ORIGIN)
    assert "access-control-allow-origin" not in response.headers


# -- the API key ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def auth_http(auth_server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=auth_server.url, timeout=60) as c:
        yield c


AUTH_ROUTES = [
    ("POST", "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 1}),
    ("POST", "/v1/completions", {"prompt": "The quick", "max_tokens": 1}),
    ("GET", "/v1/models", None),
    ("POST", "/tokenize", {"prompt": "hello"}),
    ("POST", "/detokenize", {"tokens": [5, 6]}),
]


@pytest.mark.parametrize(
    "key",
    [None, "wrong", API_KEY.lower(), API_KEY.upper(), API_KEY + "x", API_KEY[:-1], ""],
    ids=["none", "wrong", "lower", "upper", "longer", "shorter", "empty"],
)
@pytest.mark.parametrize(("method", "path", "body"), AUTH_ROUTES, ids=[r[1] for r in AUTH_ROUTES])
def test_wrong_or_missing_key_is_refused(auth_http, key, method, path, body):
    headers = {} if key is None else {"Authorization": f"Bearer {key}".strip()}
    response = auth_http.request(method, path, json=body, headers=headers)
    error = assert_error(response, 401)
    assert error["type"] == "authentication_error"
    assert response.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize(("method", "path", "body"), AUTH_ROUTES, ids=[r[1] for r in AUTH_ROUTES])
def test_right_key_is_accepted(auth_http, method, path, body):
    for scheme in ("Bearer", "bearer"):
        response = auth_http.request(method, path, json=body, headers={"Authorization": f"{scheme} {API_KEY}"})
        assert response.status_code == 200, response.text


def test_key_in_another_scheme_is_refused(auth_http):
    response = auth_http.get("/v1/models", headers={"Authorization": f"Basic {API_KEY}"})
    assert_error(response, 401)
    assert_error(auth_http.get("/v1/models", headers={"X-Api-Key": "wrong"}), 401)
    assert_error(auth_http.get("/v1/models", headers={"X-Api-Key": API_KEY.upper()}), 401)
    # Anthropic's SDKs send the key as x-api-key: the same key is accepted there
    assert auth_http.get("/v1/models", headers={"X-Api-Key": API_KEY}).status_code == 200


@pytest.mark.parametrize("path", ["/health", "/metrics", "/live", "/version", "/load", "/openapi.json"])
def test_probes_need_no_key(auth_http, path):
    assert auth_http.get(path).status_code == 200


def test_sdk_with_and_without_the_key(auth_server):
    with openai.OpenAI(base_url=auth_server.api_url, api_key="nope", max_retries=0) as sdk:
        with pytest.raises(openai.AuthenticationError):
            sdk.models.list()
    with openai.OpenAI(base_url=auth_server.api_url, api_key=API_KEY, max_retries=0) as sdk:
        assert [m.id for m in sdk.models.list().data] == [ALIAS]


# -- served model name ------------------------------------------------------------------------


def test_served_model_name_alias(auth_server, tiny):
    with openai.OpenAI(base_url=auth_server.api_url, api_key=API_KEY, max_retries=0) as sdk:
        model = sdk.models.list().data[0].model_dump()
        assert model["id"] == ALIAS and model["root"] == str(tiny.path)
        assert model["max_model_len"] == SHORT_CONTEXT
        chat = sdk.chat.completions.create(model=ALIAS, messages=MESSAGES, max_tokens=2)
        assert chat.model == ALIAS
        completion = sdk.completions.create(model=ALIAS, prompt="The quick", max_tokens=2)
        assert completion.model == ALIAS
        with pytest.raises(openai.NotFoundError) as info:
            sdk.chat.completions.create(model=tiny.name, messages=MESSAGES, max_tokens=2)
        assert info.value.body["param"] == "model"
        with pytest.raises(openai.NotFoundError):
            sdk.completions.create(model=tiny.name, prompt="x", max_tokens=2)


def test_alias_is_echoed_for_an_empty_model(auth_http):
    response = auth_http.post(
        "/v1/chat/completions",
        json={"model": "", "messages": MESSAGES, "max_tokens": 1},
        headers={"Authorization": f"Bearer {API_KEY}"},
    )
    assert response.status_code == 200 and response.json()["model"] == ALIAS


def test_metrics_label_is_the_alias(auth_http):
    assert f'model_name="{ALIAS}"' in auth_http.get("/metrics").text


# -- tokens as ids ------------------------------------------------------------------------------


def test_logprobs_as_token_ids(ops_http, tiny):
    body = {
        "prompt": "The quick brown fox",
        "max_tokens": 6,
        "temperature": 0,
        "ignore_eos": True,
        "logprobs": 3,
        "return_token_ids": True,
    }
    choice = ops_http.post("/v1/completions", json=body).json()["choices"][0]
    logprobs = choice["logprobs"]
    assert logprobs["tokens"] == [f"token_id:{t}" for t in choice["token_ids"]]
    for token, value, top in zip(logprobs["tokens"], logprobs["token_logprobs"], logprobs["top_logprobs"], strict=True):
        assert len(top) in (3, 4), top  # the top 3, and the sampled token if it is not among them
        assert top[token] == value == max(top.values())  # greedy: the sampled token is the most likely
    zero = ops_http.post("/v1/completions", json={**body, "logprobs": 0}).json()["choices"][0]["logprobs"]
    assert all(
        top == {token: value}
        for token, value, top in zip(zero["tokens"], zero["token_logprobs"], zero["top_logprobs"], strict=True)
    )


def test_chat_logprobs_as_token_ids(ops_http):
    body = {
        "messages": MESSAGES,
        "max_tokens": 4,
        "temperature": 0,
        "ignore_eos": True,
        "logprobs": True,
        "top_logprobs": 3,
        "return_token_ids": True,
    }
    choice = ops_http.post("/v1/chat/completions", json=body).json()["choices"][0]
    content = choice["logprobs"]["content"]
    assert [e["token"] for e in content] == [f"token_id:{t}" for t in choice["token_ids"]]
    assert all(len(e["top_logprobs"]) == 3 and e["top_logprobs"][0]["token"] == e["token"] for e in content)


# -- metrics -----------------------------------------------------------------------------------


def test_metrics_are_prometheus_text(ops_http):
    response = ops_http.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    for name in (
        "llmp_num_requests_running",
        "llmp_num_requests_waiting",
        "llmp_kv_cache_usage_perc",
        "llmp_prompt_tokens_total",
        "llmp_generation_tokens_total",
        "llmp_time_to_first_token_seconds_count",
        "llmp_inter_token_latency_seconds_count",
        "llmp_e2e_request_latency_seconds_count",
        "llmp_request_queue_time_seconds_count",
        "llmp_request_prefill_time_seconds_count",
        "llmp_request_decode_time_seconds_count",
        "llmp_iteration_tokens_count",
    ):
        assert re.search(rf"^{name}\{{", response.text, re.M), name
    assert "vllm:" not in response.text  # vLLM's names only with --metrics-names vllm (tests/serve/test_metrics.py)
    assert ops_http.get(f"{ROOT_PATH}/metrics").status_code == 200


def test_metrics_count_finished_requests(ops_http):
    wait_idle(ops_http)
    before = metrics(ops_http)
    prompts, generated = [[5, 6, 7], [8, 9, 10, 11, 12], list(range(20, 27))], 6
    for i, prompt in enumerate(prompts):
        body = {"prompt": prompt, "max_tokens": generated, "temperature": 0, "ignore_eos": True, "stream": i == 2}
        response = ops_http.post("/v1/completions", json=body)
        assert response.status_code == 200, response.text
    wait_idle(ops_http)
    after = metrics(ops_http)

    def grew(name: str, **labels: str) -> float:
        return metric(after, name, **labels) - metric(before, name, **labels)

    n = len(prompts)
    assert grew("llmp_request_success_total") == n
    assert grew("llmp_request_success_total", finished_reason="length") == n
    assert grew("llmp_generation_tokens_total") == n * generated
    assert grew("llmp_prompt_tokens_total") == sum(map(len, prompts))
    assert grew("llmp_time_to_first_token_seconds_count") == n
    assert grew("llmp_e2e_request_latency_seconds_count") == n
    assert grew("llmp_inter_token_latency_seconds_count") == n * (generated - 1)
    assert grew("llmp_request_prompt_tokens_sum") == sum(map(len, prompts))
    assert grew("llmp_request_generation_tokens_sum") == n * generated
    assert grew("llmp_time_to_first_token_seconds_sum") > 0
    assert grew("llmp_request_failure_total") == 0
    assert metric(after, "llmp_kv_cache_usage_perc") == 0


def test_metrics_count_n_choices(ops_http):
    wait_idle(ops_http)
    before = metrics(ops_http)
    body = {"prompt": [5, 6, 7], "max_tokens": 4, "n": 3, "temperature": 1, "ignore_eos": True}
    assert ops_http.post("/v1/completions", json=body).json()["usage"]["completion_tokens"] == 12
    wait_idle(ops_http)
    after = metrics(ops_http)
    assert metric(after, "llmp_generation_tokens_total") - metric(before, "llmp_generation_tokens_total") == 12
    assert metric(after, "llmp_request_success_total") - metric(before, "llmp_request_success_total") == 1


# -- usage: the prompt tokens read from the prefix cache -------------------------------------


def _unique_prompt(tag: str) -> str:
    return f"{tag} " + " ".join(f"word{i} {tag}" for i in range(6))  # several KV blocks, in no other test


def test_prompt_tokens_details_count_the_prefix_cache(ops_http, http):
    """--enable-prompt-tokens-details: the second run of a prompt reads its whole blocks from the cache."""
    messages = [{"role": "user", "content": _unique_prompt("chat-cache")}]
    body = {"messages": messages, "max_tokens": 2}
    first = ops_http.post("/v1/chat/completions", json=body).json()["usage"]
    second = ops_http.post("/v1/chat/completions", json=body).json()["usage"]
    assert first["prompt_tokens_details"] == {"cached_tokens": 0}, first
    cached = second["prompt_tokens_details"]["cached_tokens"]
    assert 0 < cached < second["prompt_tokens"], second
    streamed = ops_http.post(
        "/v1/chat/completions", json={**body, "stream": True, "stream_options": {"include_usage": True}}
    )
    last = [line for line in streamed.text.splitlines() if line.startswith("data: {")][-1]
    assert '"prompt_tokens_details":{"cached_tokens":%d}' % cached in last, last

    prompts = [_unique_prompt("completion-cache-a"), _unique_prompt("completion-cache-b")]
    body = {"prompt": prompts, "max_tokens": 2}
    assert ops_http.post("/v1/completions", json=body).json()["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    usage = ops_http.post("/v1/completions", json=body).json()["usage"]
    assert 0 < usage["prompt_tokens_details"]["cached_tokens"] < usage["prompt_tokens"], usage

    # off by default (vLLM's flag); the Responses API always reports its input_tokens_details
    assert (
        "prompt_tokens_details"
        not in http.post("/v1/chat/completions", json=body | {"messages": messages}).json()["usage"]
    )
    request = {"input": _unique_prompt("responses-cache"), "max_output_tokens": 2}
    first = http.post("/v1/responses", json=request).json()["usage"]
    second = http.post("/v1/responses", json=request).json()["usage"]
    assert first["input_tokens_details"] == {"cached_tokens": 0}, first
    assert 0 < second["input_tokens_details"]["cached_tokens"] < second["input_tokens"], second
