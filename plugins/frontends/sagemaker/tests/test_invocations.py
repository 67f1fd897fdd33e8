"""``POST /invocations`` routed by body shape, checked against the OpenAI front-end of the same server."""

from __future__ import annotations

import httpx

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "The quick brown fox"}]


def post(http: httpx.Client, path: str, body: dict, status: int = 200) -> dict:
    response = http.post(path, json=body)
    assert response.status_code == status, response.text
    return response.json()


def test_messages_is_a_chat_completion(http, model_dir):
    body = {"messages": MESSAGES, "max_tokens": 12, "temperature": 0}
    got = post(http, "/invocations", body)
    want = post(http, "/v1/chat/completions", body)
    assert got["object"] == "chat.completion" and got["id"].startswith("chatcmpl-")
    assert got["model"] == want["model"] == str(model_dir)
    [choice] = got["choices"]
    assert choice["message"] == {"role": "assistant", "content": want["choices"][0]["message"]["content"]}
    assert choice["message"]["content"]
    assert (choice["finish_reason"], choice["stop_reason"]) == (
        want["choices"][0]["finish_reason"],
        want["choices"][0]["stop_reason"],
    )
    assert got["usage"] == want["usage"]
    parts = {
        "messages": [MESSAGES[0], {"role": "user", "content": [{"type": "text", "text": "The quick brown fox"}]}],
        "max_tokens": 12,
        "temperature": 0,
    }
    assert post(http, "/invocations", parts)["choices"][0]["message"] == choice["message"]


def test_prompt_is_a_completion(http):
    body = {"prompt": "Paged attention keeps", "max_tokens": 10, "temperature": 0, "stop": None}
    got = post(http, "/invocations", body)
    want = post(http, "/v1/completions", body)
    assert got["object"] == "text_completion" and got["id"].startswith("cmpl-")
    assert got["choices"][0]["text"] == want["choices"][0]["text"] and got["choices"][0]["text"]
    assert got["choices"][0]["finish_reason"] == "length" == want["choices"][0]["finish_reason"]
    assert (
        got["usage"]
        == want["usage"]
        == {
            "prompt_tokens": want["usage"]["prompt_tokens"],
            "completion_tokens": 10,
            "total_tokens": want["usage"]["prompt_tokens"] + 10,
        }
    )
    ids = post(http, "/tokenize", {"prompt": "Paged attention keeps"})["tokens"]
    by_ids = post(http, "/invocations", {**body, "prompt": ids})
    assert by_ids["choices"][0]["text"] == got["choices"][0]["text"]


def test_stop_string(http):
    body = {"prompt": "Paged attention keeps", "max_tokens": 20, "temperature": 0}
    full = post(http, "/invocations", body)["choices"][0]["text"]
    stop = full[5:8]
    got = post(http, "/invocations", {**body, "stop": [stop]})["choices"][0]
    assert (got["text"], got["finish_reason"], got["stop_reason"]) == (full[: full.index(stop)], "stop", stop)


def test_bad_bodies(http):
    error = post(http, "/invocations", {"foo": 1}, 400)["error"]
    assert error["type"] == "invalid_request_error"
    assert error["message"] == "cannot tell the request type: give messages (chat completion) or prompt (completion)"
    assert "JSON object" in post(http, "/invocations", [1, 2], 400)["error"]["message"]
    assert "streaming" in post(http, "/invocations", {"prompt": "x", "stream": True}, 400)["error"]["message"]
    post(http, "/invocations", {"prompt": "x", "max_tokens": 2, "stream": None}, 200)  # null is false (vLLM's)
    assert post(http, "/invocations", {"prompt": "x", "max_tokens": "many"}, 400)["error"]["param"] == "max_tokens"
    assert "embed" in post(http, "/invocations", {"input": "x"}, 400)["error"]["message"]  # not an embedding model
    assert post(http, "/invocations", {"messages": [], "max_tokens": 2}, 400)["error"]["param"] == "messages"
    assert post(http, "/invocations", {"prompt": "x", "model": "nope"}, 404)["error"]["param"] == "model"
    assert post(http, "/invocations", {"prompt": "x", "max_tokens": 100_000}, 400)["error"]["param"] == "max_tokens"


def test_ping(http):
    response = http.get("/ping")
    assert response.status_code == 200


def test_every_openai_field_is_honoured_or_refused():
    """The bodies are OpenAI's (as vLLM's /invocations takes them): no field of theirs is dropped silently."""
    from llmp_frontend_openai import protocol as openai
    from llmp_frontend_sagemaker.frontend import UNSUPPORTED, ChatBody, CompletionBody

    # (the pooling bodies are the OpenAI routes' own, answered by their handlers)
    for theirs, ours, refused in (
        (openai.ChatCompletionRequest, ChatBody, UNSUPPORTED),
        (openai.CompletionRequest, CompletionBody, UNSUPPORTED),
    ):
        dropped = set(theirs.model_fields) - set(ours.model_fields) - set(refused)
        assert not dropped, f"{ours.__name__} drops {sorted(dropped)}"
        assert not set(ours.model_fields) & set(refused)


def test_vllm_fields_act_as_on_the_openai_routes(http):
    base = {"prompt": "Paged attention keeps", "max_tokens": 12, "temperature": 0}
    full = post(http, "/invocations", base)["choices"][0]["text"]
    stop = full[4:7]
    for extra in (
        {"stop": [stop], "include_stop_str_in_output": True},
        {"allowed_token_ids": [5, 6, 7]},
        {"skip_special_tokens": False, "spaces_between_special_tokens": False, "min_tokens": 3, "ignore_eos": True},
    ):
        body = {**base, **extra}
        got = post(http, "/invocations", body)["choices"][0]
        want = post(http, "/v1/completions", body)["choices"][0]
        assert (got["text"], got["finish_reason"]) == (want["text"], want["finish_reason"]), extra
    assert post(http, "/invocations", {**base, "stop": [stop], "include_stop_str_in_output": True})["choices"][0][
        "text"
    ].endswith(stop)
    chat = {
        "messages": [*MESSAGES, {"role": "assistant", "content": "It"}],
        "max_tokens": 6,
        "temperature": 0,
        "add_generation_prompt": False,
        "continue_final_message": True,
        "request_id": "mine",
    }
    got = post(http, "/invocations", chat)
    want = post(http, "/v1/chat/completions", chat)
    assert got["id"] == "chatcmpl-mine"
    assert got["choices"][0]["message"]["content"] == want["choices"][0]["message"]["content"]
    assert got["usage"] == want["usage"]


def test_fields_the_server_refuses_are_a_400_naming_them(http):
    base = {"prompt": "x", "max_tokens": 2}
    # priority needs --scheduling-policy priority, as on the OpenAI routes (and in vLLM)
    assert post(http, "/invocations", {**base, "priority": 1}, 400)["error"]["param"] == "priority"
    chat = {"messages": MESSAGES, "max_tokens": 2, "chat_template": "{{ messages }}"}
    assert post(http, "/invocations", chat, 400)["error"]["param"] == "chat_template"  # untrusted by default
    for field, value in (("n", 2), ("logprobs", 2), ("include_reasoning", False), ("parallel_tool_calls", False)):
        error = post(http, "/invocations", {**base, field: value}, 400)["error"]
        assert error["param"] == field and "not supported on /invocations" in error["message"], field
    for field, value in (("n", 1), ("include_reasoning", True), ("some_vendor_key", 1)):
        assert post(http, "/invocations", {**base, field: value})["choices"][0]["text"] is not None, field
    for field, value in (("use_beam_search", True), ("length_penalty", 0.5), ("vllm_xargs", {"a": 1})):
        assert post(http, "/invocations", {**base, field: value}, 400)["error"]["param"] == field
    for field, value in (("length_penalty", 1.0), ("vllm_xargs", {})):  # their defaults
        assert post(http, "/invocations", {**base, field: value})["choices"][0]["text"] is not None, field
    assert post(http, "/invocations", {**base, "cache_salt": ""}, 400)["error"]["param"] == "cache_salt"
    assert post(http, "/invocations", {**base, "truncate_prompt_tokens": 0}, 400)["error"]["param"] == (
        "truncate_prompt_tokens"
    )


def test_truncate_prompt_tokens_and_cache_salt_act_as_on_the_openai_routes(http):
    body = {"prompt": "one two three four five six seven", "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    for extra in ({"truncate_prompt_tokens": 3}, {"cache_salt": "tenant-a"}):
        got = post(http, "/invocations", {**body, **extra})
        want = post(http, "/v1/completions", {**body, **extra})
        assert (got["choices"][0]["text"], got["usage"]) == (want["choices"][0]["text"], want["usage"]), extra
    assert post(http, "/invocations", {**body, "truncate_prompt_tokens": 3})["usage"]["prompt_tokens"] == 3
