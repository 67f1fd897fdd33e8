"""Bad requests get 4xx with an OpenAI error body (never a 500), and the server keeps serving after each."""

from __future__ import annotations

import json

import httpx
import pytest
from openai_frontend_support import ALIAS, API_KEY, BODY_LIMIT, SHORT_CONTEXT, assert_error, extra

from llmp.testing import serving

MESSAGES = [{"role": "user", "content": "The quick brown fox"}]


@pytest.fixture
def still_serves(http):
    """After the test, a plain request must still succeed."""
    yield
    response = http.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 2})
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] >= 1


pytestmark = pytest.mark.usefixtures("still_serves")


def chat(http, **fields):
    return http.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 2, **fields})


def completion(http, **fields):
    return http.post("/v1/completions", json={"prompt": "The quick", "max_tokens": 2, **fields})


# -- the body ---------------------------------------------------------------------------


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions", "/tokenize"])
def test_malformed_json(http, route):
    response = http.post(route, content=b'{"messages": [', headers={"Content-Type": "application/json"})
    error = assert_error(response, 400, contains="not valid JSON at byte 14")
    assert error["param"] is None  # no field to name (pydantic's loc holds the byte offset)


@pytest.mark.parametrize(
    "fields",
    [
        {"messages": "hello"},
        {"max_tokens": "many"},
        {"temperature": "hot"},
        {"n": 1.5},
        {"stop": 3},
        {"logit_bias": ["a"]},
        {"stream": "yes please"},
        {"messages": [{"content": "no role"}]},
        {"messages": [{"role": "user", "content": 42}]},
        {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": "zzz"}]},
        {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [{"function": {}}]}]},
    ],
    ids=lambda f: "-".join(map(str, f)),
)
def test_wrong_types(http, fields):
    error = assert_error(chat(http, **fields), 400)
    assert error["type"] == "invalid_request_error"
    assert error["param"] is not None


def test_wrong_prompt_type(http):
    for body in ({"prompt": {"text": "x"}}, {}):
        error = assert_error(http.post("/v1/completions", json=body), 400)
        assert error["param"].startswith("prompt"), error


@pytest.mark.parametrize("seed", [2**63, -(2**63) - 1, 10**30])
def test_seed_beyond_int64(http, seed):
    error = assert_error(chat(http, seed=seed), 400, param="seed")
    assert "less_than_equal" in error["message"] or "greater_than_equal" in error["message"]


def test_seed_at_the_int64_limits_is_accepted(http):
    for seed in (2**63 - 1, -(2**63)):
        assert chat(http, seed=seed).status_code == 200


def test_body_not_an_object(http):
    assert_error(http.post("/v1/chat/completions", json=[1, 2]), 400)


def test_wrong_content_type(http):
    body = json.dumps({"messages": MESSAGES, "max_tokens": 2})
    error = assert_error(
        http.post("/v1/chat/completions", content=body, headers={"Content-Type": "text/plain"}),
        400,
        contains="text/plain",
    )
    assert error["type"] == "invalid_request_error"
    form = http.post("/v1/completions", data={"prompt": "x"})  # application/x-www-form-urlencoded
    assert_error(form, 400)
    # parameters of the media type are fine
    ok = http.post("/v1/chat/completions", content=body, headers={"Content-Type": "application/json; charset=utf-8"})
    assert ok.status_code == 200, ok.text


def test_body_over_the_limit(http):
    response = chat(http, messages=[{"role": "user", "content": "x" * (BODY_LIMIT + 10)}])
    assert_error(response, 413, contains=str(BODY_LIMIT))


def test_chunked_body_over_the_limit(http):
    payload = json.dumps({"messages": [{"role": "user", "content": "x" * (BODY_LIMIT + 10)}]}).encode()

    def chunks():
        for i in range(0, len(payload), 8192):
            yield payload[i : i + 8192]

    response = http.post("/v1/chat/completions", content=chunks(), headers={"Content-Type": "application/json"})
    assert_error(response, 413)


# -- the model and the context ---------------------------------------------------------


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"])
def test_unknown_model(http, route):
    body = {"model": "no-such-model", "messages": MESSAGES, "prompt": "x", "max_tokens": 1}
    error = assert_error(http.post(route, json=body), 404, param="model", contains="no-such-model")
    assert error["type"] == "NotFoundError"


def test_unknown_model_on_tokenize(http):
    assert_error(http.post("/tokenize", json={"model": "nope", "prompt": "x"}), 404, param="model")
    assert_error(http.post("/detokenize", json={"model": "nope", "tokens": [5]}), 404, param="model")


def test_max_tokens_above_max_model_len(http):
    error = assert_error(chat(http, max_tokens=100_000), 400, param="max_tokens", contains="max_model_len=512")
    assert "100000" in error["message"]
    assert_error(completion(http, max_tokens=513), 400, param="max_tokens")


def test_prompt_plus_max_tokens_beyond_the_context(http):
    response = completion(http, prompt=[5] * 500, max_tokens=20)
    error = assert_error(response, 400, contains="maximum context length is 512")
    assert (
        "520" in error["message"]
        and "500 in the input" in error["message"]
        and "20 for the completion" in error["message"]
    )


def test_prompt_longer_than_a_short_context(auth_server):
    import httpx

    headers = {"Authorization": f"Bearer {API_KEY}"}
    with httpx.Client(base_url=auth_server.url, headers=headers, timeout=60) as http:
        long_chat = [{"role": "user", "content": "The quick brown fox jumps over the lazy dog. " * 8}]
        response = http.post("/v1/chat/completions", json={"model": ALIAS, "messages": long_chat})
        error = assert_error(response, 400, contains=f"maximum context length is {SHORT_CONTEXT} tokens")
        prompt_len = len(http.post("/tokenize", json={"messages": long_chat}).json()["tokens"])
        assert prompt_len > SHORT_CONTEXT
        assert f"{prompt_len} in the input" in error["message"], error
        response = http.post("/v1/completions", json={"prompt": [5] * 70, "max_tokens": 1})
        error = assert_error(response, 400, contains=str(SHORT_CONTEXT))
        assert "70 in the input" in error["message"]
        # exactly full: 63 prompt tokens + 1 fits; unset max_tokens means the rest of the context
        ok = http.post("/v1/completions", json={"prompt": [5] * 63, "max_tokens": 1, "ignore_eos": True})
        assert ok.status_code == 200, ok.text
        rest = http.post("/v1/completions", json={"prompt": [5] * 60, "max_tokens": None, "ignore_eos": True})
        assert rest.status_code == 200, rest.text
        assert rest.json()["usage"]["completion_tokens"] == 4
        short_chat = [{"role": "user", "content": "hi"}]
        chat = http.post("/v1/chat/completions", json={"messages": short_chat, "ignore_eos": True})  # no max_tokens
        usage = chat.json()["usage"]
        assert (
            usage["total_tokens"] == SHORT_CONTEXT
            and usage["completion_tokens"] == SHORT_CONTEXT - usage["prompt_tokens"]
        )


# -- sampling values ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", -1),
        ("top_p", 2),
        ("top_p", 0),
        ("max_tokens", 0),
        ("max_tokens", -5),
        ("top_k", -2),
        ("min_p", 1.5),
        ("presence_penalty", 3),
        ("frequency_penalty", -3),
        ("repetition_penalty", 0),
        ("min_tokens", -1),
        ("n", 0),
    ],
)
@pytest.mark.parametrize("route", ["chat", "completions"])
def test_out_of_range_sampling_values(http, route, field, value):
    response = (chat if route == "chat" else completion)(http, **{field: value})
    assert_error(response, 400, param=field, contains=field)


@pytest.mark.parametrize(
    "field",
    ["temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias"],
)
def test_nan_sampling_values_are_refused(http, field):
    """NaN compares false with every bound, so range checks of the form ``value < low`` let it through."""
    value = '{"5": NaN}' if field == "logit_bias" else "NaN"  # Python's json (the server's) reads NaN
    body = '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "%s": %s}' % (field, value)
    response = http.post("/v1/chat/completions", content=body, headers={"Content-Type": "application/json"})
    assert_error(response, 400, param=field)


@pytest.mark.parametrize(
    "fields",
    [{"top_k": 10**20}, {"priority": 10**30}, {"stop_token_ids": [10**20]}],
    ids=["top_k", "priority", "stop_token_ids"],
)
def test_huge_integers_are_refused(server, fields):
    """Past 2**64 msgpack cannot encode the engine request: once a 500 (OverflowError in AsyncLLM._send)."""
    # a fresh connection: were it a 500, the server would close the connection it came on
    response = httpx.post(
        f"{server.url}/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 2, **fields}, timeout=60
    )
    assert response.status_code != 500, response.text
    assert_error(response, 400, param=next(iter(fields)))


def test_top_k_past_int64_does_not_kill_the_server(tiny):
    """2**63 fits msgpack's uint64 but not the engine's int64: once, the engine process died of it and took the
    server down (503, then connection refused). Its own server, so a regression cannot take the shared one."""
    with serving(tiny.path) as victim:
        response = httpx.post(
            f"{victim.url}/v1/chat/completions",
            json={"messages": MESSAGES, "max_tokens": 2, "top_k": 2**63},
            timeout=60,
        )
        after = (
            httpx.post(f"{victim.url}/v1/completions", json={"prompt": "x", "max_tokens": 1}, timeout=60)
            if victim.process.poll() is None
            else None
        )
        assert response.status_code == 400, response.text
        assert after is not None and after.status_code == 200


def test_min_tokens_above_max_tokens(http):
    assert_error(completion(http, min_tokens=5, max_tokens=2), 400, contains="min_tokens")


@pytest.mark.parametrize("bias", [{"512": 1.0}, {"-1": 1.0}, {"abc": 1.0}, {"5": 101}])
def test_bad_logit_bias(http, bias):
    assert_error(chat(http, logit_bias=bias), 400, param="logit_bias")


def test_logit_bias_steers_greedy_output(http):
    response = chat(http, logit_bias={"77": 100}, temperature=0, max_tokens=3, ignore_eos=True, return_token_ids=True)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["token_ids"] == [77, 77, 77]


def test_bad_allowed_token_ids(http):
    assert_error(chat(http, allowed_token_ids=[5, 9999]), 400, param="allowed_token_ids")
    assert_error(chat(http, allowed_token_ids=[]), 400)


def test_empty_stop_string(http):
    assert_error(chat(http, stop=[""]), 400, param="stop")


# -- messages ----------------------------------------------------------------------------------


def test_empty_messages(http):
    assert_error(chat(http, messages=[]), 400, param="messages")


def test_non_text_content_part(http):
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]
    assert_error(chat(http, messages=messages), 400, param="messages", contains="image_url")


def test_request_chat_template_needs_trust(http):
    assert_error(
        chat(http, chat_template="{{ messages[0]['content'] }}"),
        400,
        param="chat_template",
        contains="--trust-request-chat-template",
    )


def test_continue_final_message_with_generation_prompt(http):
    assert_error(
        chat(http, continue_final_message=True, add_generation_prompt=True), 400, param="continue_final_message"
    )


def test_tool_choice_without_tools(http):
    assert_error(chat(http, tool_choice="required"), 400, param="tool_choice")
    assert_error(chat(http, tools=[]), 400, param="tools")


def test_invalid_structured_outputs(http):
    assert_error(
        chat(http, response_format={"type": "json_schema", "json_schema": {"name": "x"}}), 400, param="response_format"
    )
    assert_error(chat(http, response_format={"type": "xml"}), 400, param="response_format")
    assert_error(chat(http, structured_outputs={"regex": "[a-"}), 400, contains="Unclosed")
    assert_error(chat(http, structured_outputs={"json": {"type": "foo"}}), 400, contains="not a valid JSON schema")
    assert_error(chat(http, structured_outputs={"grammar": "root ::= nothing"}), 400, contains="not defined")
    assert_error(chat(http, structured_outputs={"regex": "a", "choice": ["b"]}), 400, param="structured_outputs")
    assert_error(
        chat(http, structured_outputs={"choice": ["a"]}, response_format={"type": "json_object"}),
        400,
        param="structured_outputs",
    )
    assert_error(chat(http, structured_outputs={"pattern": "a"}), 400, param="structured_outputs")


def test_unknown_fields_are_ignored(http):
    plain = chat(http, temperature=0, max_tokens=6, ignore_eos=True)
    messages = [{"role": "user", "content": "The quick brown fox", "vendor_field": {"a": 1}, "cache_control": "x"}]
    extra_fields = chat(
        http,
        messages=messages,
        temperature=0,
        max_tokens=6,
        ignore_eos=True,
        some_vendor_option=True,
        metadata={"k": "v"},
        store=False,
    )
    assert extra_fields.status_code == 200, extra_fields.text
    assert extra_fields.json()["choices"][0]["message"] == plain.json()["choices"][0]["message"]


def test_text_parts_equal_string_content(http):
    as_string = chat(http, temperature=0, max_tokens=8, ignore_eos=True, return_token_ids=True).json()
    parts = [{"role": "user", "content": [{"type": "text", "text": "The quick brown fox"}]}]
    as_parts = chat(http, messages=parts, temperature=0, max_tokens=8, ignore_eos=True, return_token_ids=True)
    assert as_parts.status_code == 200, as_parts.text
    as_parts = as_parts.json()
    assert as_parts["prompt_token_ids"] == as_string["prompt_token_ids"]
    assert extra(as_parts["choices"][0], "token_ids") == extra(as_string["choices"][0], "token_ids")
    assert as_parts["choices"][0]["message"]["content"] == as_string["choices"][0]["message"]["content"]


def test_null_content_is_an_empty_message(http):
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None},
        {"role": "user", "content": "more"},
    ]
    assert chat(http, messages=messages).status_code == 200


# -- routes --------------------------------------------------------------------------------------


def test_unknown_route(http):
    response = http.get("/v1/no-such-route")
    error = assert_error(response, 404)
    assert error["type"] == "not_found_error"
    assert_error(http.post("/v1/no-such-route", json={}), 404)


def test_wrong_method(http):
    response = http.get("/v1/chat/completions")
    assert_error(response, 405)


def test_embeddings_on_a_generative_model(http):
    assert_error(http.post("/v1/embeddings", json={"input": "hello"}), 404)


def test_tokenize_needs_prompt_or_messages(http):
    assert_error(http.post("/tokenize", json={}), 400, param="prompt")
    assert_error(http.post("/tokenize", json={"prompt": "x", "messages": MESSAGES}), 400, param="prompt")


def test_detokenize_out_of_vocab(http):
    assert_error(http.post("/detokenize", json={"tokens": [5, 512]}), 400, param="tokens")
