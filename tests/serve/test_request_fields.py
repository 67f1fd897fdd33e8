"""Every front-end turns a request into sampling parameters the same way (the front-end kit's one
path), and no request field is accepted and then ignored.

One live server mounts all five front-ends (OpenAI, Anthropic, SageMaker, MCP at /mcp, gRPC) over a
tiny Llama whose ``generation_config.json`` sets every default a model can set, and whose chat
template prints the variables a request's ``reasoning_effort`` sets.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import pytest
from llmp_frontend_grpc import llmp_pb2 as pb
from llmp_frontend_grpc import llmp_pb2_grpc as pb_grpc

from llmp.testing import LiveServer, assert_openai_error, free_port, save_tiny_llama, serving

MAX_NEW_TOKENS = 6
# min_p 1.0 keeps only the likeliest token, so sampling at temperature 1 is greedy; the strong
# repetition penalty changes which token that is. A front-end that drops either answers otherwise.
GENERATION_CONFIG = {
    "temperature": 1.0,
    "top_p": 0.9,
    "top_k": 50,
    "min_p": 0.5,
    "repetition_penalty": 5.0,
    "max_new_tokens": 3 * MAX_NEW_TOKENS,
}
# --override-generation-config: its values over the file's (the file's min_p and length would answer otherwise)
OVERRIDES = {"min_p": 1.0, "max_new_tokens": MAX_NEW_TOKENS}
TEMPLATE_DEFAULTS = {"enable_thinking": "server"}  # --default-chat-template-kwargs
TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}"
    "[effort={{ reasoning_effort | default('unset') }} thinking={{ enable_thinking | default('unset') }}]"
    "{% if documents %}[documents={{ documents | length }}]{% endif %}"
    "{% if add_generation_prompt %}<s>assistant: {% endif %}"
)
MESSAGES = [{"role": "user", "content": "Paged attention keeps the cache"}]


class Servers:
    def __init__(self, live: LiveServer, grpc_port: int, model: str) -> None:
        self.live, self.model = live, model  # the served name (the path), which Anthropic's API requires
        self.http = httpx.Client(base_url=live.url, timeout=60)
        self.channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
        grpc.channel_ready_future(self.channel).result(timeout=30)
        self.grpc = pb_grpc.LlmpStub(self.channel)


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    path = tmp_path_factory.mktemp("tiny-llama-defaults")
    save_tiny_llama(path)
    (path / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG))
    template = path / "template.jinja"
    template.write_text(TEMPLATE)
    port = free_port()
    frontends = [arg for name in ("openai", "anthropic", "sagemaker", "mcp", "grpc") for arg in ("--frontend", name)]
    with serving(
        path,
        "--dtype",
        "float32",
        "--chat-template",
        str(template),
        "--override-generation-config",
        json.dumps(OVERRIDES),
        "--default-chat-template-kwargs",
        json.dumps(TEMPLATE_DEFAULTS),
        *frontends,
        env={"LLMP_GRPC_PORT": str(port)},
    ) as live:
        servers = Servers(live, port, str(path))
        try:
            yield servers
        finally:
            servers.channel.close()
            servers.http.close()
        assert live.process.poll() is None, f"the server died during the tests:\n{live.log()}"


def post(servers: Servers, path: str, body: dict[str, Any], status: int = 200) -> dict[str, Any]:
    response = servers.http.post(path, json=body)
    assert response.status_code == status, response.text
    return response.json()


def chat_text(servers: Servers, **fields: Any) -> str:
    return post(servers, "/v1/chat/completions", {"messages": MESSAGES, **fields})["choices"][0]["message"]["content"]


# -- generation-config defaults, one way for every front-end -----------------------------------------


@pytest.fixture(scope="module")
def expected(servers: Servers) -> str:
    """Greedy with the model's repetition penalty, the model's max_new_tokens long: what every front-end
    must answer with no sampling field set."""
    # the defaults matter here: without the penalty, or sampling without min_p, the answer differs
    greedy = {"temperature": 0, "max_tokens": MAX_NEW_TOKENS, "ignore_eos": True}
    assert chat_text(servers, **greedy, repetition_penalty=5.0) != chat_text(servers, **greedy, repetition_penalty=1.0)
    unfiltered = {"min_p": 0.0, "top_p": 1.0, "top_k": 0, "max_tokens": MAX_NEW_TOKENS, "ignore_eos": True}
    sampled = {chat_text(servers, **unfiltered, seed=seed) for seed in range(4)}
    assert sampled != {chat_text(servers, **{**unfiltered, "min_p": 1.0}, seed=0)}
    return chat_text(servers, temperature=0, repetition_penalty=5.0, max_tokens=MAX_NEW_TOKENS)


def test_openai_chat_applies_every_default(servers, expected):
    assert chat_text(servers) == expected


def test_anthropic_applies_every_default(servers, expected):
    content = post(
        servers, "/v1/messages", {"model": servers.model, "messages": MESSAGES, "max_tokens": MAX_NEW_TOKENS}
    )["content"]
    assert content == [{"type": "text", "text": expected}]


def test_sagemaker_applies_every_default(servers, expected):
    assert post(servers, "/invocations", {"messages": MESSAGES})["choices"][0]["message"]["content"] == expected


def test_mcp_applies_every_default(servers, expected):
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "chat", "arguments": {}}}
    call["params"]["arguments"]["messages"] = MESSAGES
    response = servers.http.post("/mcp", json=call, headers={"Accept": "application/json, text/event-stream"})
    assert response.status_code == 200, response.text
    result = response.json()["result"]
    assert not result["isError"], result
    assert result["content"][0]["text"] == expected


def test_grpc_applies_every_default(servers, expected):
    chat = pb.Chat(messages=[pb.ChatMessage(role=m["role"], content=m["content"]) for m in MESSAGES])
    assert servers.grpc.Generate(pb.GenerateRequest(chat=chat)).text == expected


def test_the_overridden_max_new_tokens_caps_every_request(servers):
    """vLLM's rule: --override-generation-config's max_new_tokens is a ceiling, not only a default."""
    body = {"messages": MESSAGES, "max_tokens": 3 * MAX_NEW_TOKENS, "ignore_eos": True}
    assert post(servers, "/v1/chat/completions", body)["usage"]["completion_tokens"] == MAX_NEW_TOKENS
    completion = {"prompt": "Paged attention", "max_tokens": 3 * MAX_NEW_TOKENS, "ignore_eos": True}
    assert post(servers, "/v1/completions", completion)["usage"]["completion_tokens"] == MAX_NEW_TOKENS
    fewer = post(servers, "/v1/completions", {**completion, "max_tokens": 2})
    assert fewer["usage"]["completion_tokens"] == 2


def test_explicit_values_override_the_defaults(servers):
    fields = {"min_p": 0.0, "top_p": 1.0, "top_k": 0, "seed": 1, "max_tokens": MAX_NEW_TOKENS, "ignore_eos": True}
    sampled = chat_text(servers, **fields)
    assert (
        post(servers, "/invocations", {"messages": MESSAGES, **fields})["choices"][0]["message"]["content"] == sampled
    )


# -- errors name the field as the request spells it ---------------------------------------------------


def test_errors_name_the_request_field_in_every_front_end(servers):
    error = post(servers, "/v1/chat/completions", {"messages": MESSAGES, "max_completion_tokens": 0}, 400)["error"]
    assert error["param"] == "max_completion_tokens" and error["message"].startswith("max_completion_tokens"), error
    error = post(servers, "/v1/responses", {"input": "hi", "max_output_tokens": 10**6}, 400)["error"]
    assert error["param"] == "max_output_tokens" and "max_output_tokens=1000000" in error["message"], error
    error = post(servers, "/invocations", {"messages": MESSAGES, "top_p": 0}, 400)["error"]
    assert error["param"] == "top_p", error
    error = post(
        servers, "/v1/messages", {"model": servers.model, "messages": MESSAGES, "max_tokens": 2, "top_k": -5}, 400
    )
    assert error["error"]["type"] == "invalid_request_error" and "top_k" in error["error"]["message"], error
    with pytest.raises(grpc.RpcError) as info:
        servers.grpc.Generate(pb.GenerateRequest(text="hi", max_tokens=2, top_p=2.0))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "top_p" in info.value.details()


# -- reasoning_effort reaches the chat template ---------------------------------------------------------


def rendered_prompt(servers: Servers, **fields: Any) -> str:
    body = {"messages": MESSAGES, "max_tokens": 1, "return_token_ids": True, **fields}
    ids = post(servers, "/v1/chat/completions", body)["prompt_token_ids"]
    return post(servers, "/detokenize", {"tokens": ids})["prompt"]


def test_reasoning_effort_is_a_chat_template_variable(servers):
    assert "[effort=unset thinking=server]" in rendered_prompt(servers)  # --default-chat-template-kwargs
    kwargs = {"enable_thinking": "request"}
    assert "[effort=unset thinking=request]" in rendered_prompt(servers, chat_template_kwargs=kwargs)
    assert "[effort=high thinking=True]" in rendered_prompt(servers, reasoning_effort="high")
    assert "[effort=none thinking=False]" in rendered_prompt(servers, reasoning_effort="none")
    # the top-level field wins over chat_template_kwargs' value; an explicit enable_thinking is kept
    kwargs = {"reasoning_effort": "low", "enable_thinking": False}
    got = rendered_prompt(servers, reasoning_effort="medium", chat_template_kwargs=kwargs)
    assert "[effort=medium thinking=False]" in got
    error = post(servers, "/v1/chat/completions", {"messages": MESSAGES, "reasoning_effort": "extreme"}, 400)["error"]
    assert error["param"] == "reasoning_effort", error


def test_responses_reasoning_effort_is_the_same_variable(servers):
    def input_tokens(**fields: Any) -> int:
        return post(servers, "/v1/responses", {"input": MESSAGES, "max_output_tokens": 1, **fields})["usage"][
            "input_tokens"
        ]

    def chat_tokens(**fields: Any) -> int:
        body = {"messages": MESSAGES, "max_tokens": 1, **fields}
        return post(servers, "/v1/chat/completions", body)["usage"]["prompt_tokens"]

    assert input_tokens(reasoning={"effort": "medium"}) == chat_tokens(reasoning_effort="medium")
    assert input_tokens(reasoning={"effort": "medium"}) != input_tokens()
    error = post(servers, "/v1/responses", {"input": "hi", "reasoning": {"effort": "extreme"}}, 400)["error"]
    assert error["param"].startswith("reasoning"), error


# -- bad_words: validated by the front-end, banned by the engine -----------------------------------------


def banned_word(servers: Servers, token_ids: list[int]) -> tuple[str, int]:
    """A generated token whose text tokenizes back to it alone, and that text."""
    for token in token_ids:
        word = post(servers, "/detokenize", {"tokens": [token]})["prompt"]
        if word.strip() and "\ufffd" not in word:
            if post(servers, "/tokenize", {"prompt": word, "add_special_tokens": False})["tokens"] == [token]:
                return word, token
    raise AssertionError(f"no generated token of {token_ids} spells a word")


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"])
def test_bad_words_are_banned(servers, route):
    body = {"max_tokens": 12, "temperature": 0, "ignore_eos": True, "return_token_ids": True}
    body |= {"prompt": "Paged attention keeps"} if route == "/v1/completions" else {"messages": MESSAGES}
    free = post(servers, route, body)["choices"][0]["token_ids"]
    word, token = banned_word(servers, free)
    banned = post(servers, route, {**body, "bad_words": [word]})["choices"][0]["token_ids"]
    assert token not in banned and banned[: free.index(token)] == free[: free.index(token)], (word, free, banned)


def test_sagemaker_bad_words_are_banned(servers):
    body = {"messages": MESSAGES, "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    free = post(servers, "/v1/chat/completions", {**body, "return_token_ids": True})["choices"][0]["token_ids"]
    word, token = banned_word(servers, free)
    want = post(servers, "/v1/chat/completions", {**body, "bad_words": [word]})["choices"][0]["message"]["content"]
    got = post(servers, "/invocations", {**body, "bad_words": [word]})["choices"][0]["message"]["content"]
    assert got == want != post(servers, "/invocations", body)["choices"][0]["message"]["content"]


@pytest.mark.parametrize("bad_words", [[""], "word", [3]], ids=["empty", "not-a-list", "not-strings"])
def test_invalid_bad_words_are_400(servers, bad_words):
    body = {"messages": MESSAGES, "max_tokens": 2, "bad_words": bad_words}
    error = assert_openai_error(servers.http.post("/v1/chat/completions", json=body), 400)
    assert error["param"].startswith("bad_words"), error


# -- priority: the engine's policy, reported as a 400 naming the field --------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions", "/v1/responses"])
def test_priority_under_fcfs_is_400(servers, route, stream):
    body = {"max_tokens": 2, "priority": 1, "stream": stream}
    body |= (
        {"prompt": "hi"}
        if route == "/v1/completions"
        else {"input": "hi"}
        if route == "/v1/responses"
        else {"messages": MESSAGES}
    )
    if route == "/v1/responses":
        body["max_output_tokens"] = body.pop("max_tokens")
    assert_openai_error(servers.http.post(route, json=body), 400, param="priority")


# -- fields a protocol has no place for are refused, not dropped -------------------------------------------


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"echo": True}, "echo"),
        ({"prompt_logprobs": 1}, "prompt_logprobs"),
        ({"return_token_ids": True}, "return_token_ids"),
        ({"top_logprobs": 3}, "top_logprobs"),  # without the include that returns them
        ({"use_beam_search": True}, "use_beam_search"),
        ({"length_penalty": 0.5}, "length_penalty"),
    ],
)
def test_responses_refuses_fields_it_cannot_honour(servers, fields, param):
    body = {"input": "hi", "max_output_tokens": 2, **fields}
    assert_openai_error(servers.http.post("/v1/responses", json=body), 400, param=param)


def test_responses_accepts_what_codex_sends(servers):
    body = {"input": "hi", "max_output_tokens": 2, "include": ["reasoning.encrypted_content"], "store": False}
    assert post(servers, "/v1/responses", body)["status"] in ("completed", "incomplete")


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"n": 2, "temperature": 1}, "n"),
        ({"logprobs": True}, "logprobs"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
    ],
)
def test_sagemaker_refuses_fields_it_cannot_honour(servers, fields, param):
    body = {"messages": MESSAGES, "max_tokens": 2, **fields}
    assert_openai_error(servers.http.post("/invocations", json=body), 400, param=param)


def test_chat_documents_reach_the_template(servers):
    assert "[documents=" not in rendered_prompt(servers)
    assert "[documents=2]" in rendered_prompt(
        servers, documents=[{"title": "a", "text": "x"}, {"title": "b", "text": "y"}]
    )
