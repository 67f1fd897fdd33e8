"""``/v1/chat/completions/render`` and ``/v1/completions/render``: vLLM's ``GenerateRequest`` of a
request (prompt, token ids, sampling parameters), equal to what the generating route runs, with no
engine request made.

One server for the module, with a chat template that renders the tools and reads a variable
(``greeting``), so ``tools`` and ``chat_template_kwargs`` show in the rendered prompt.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from openai_frontend_support import API_KEY, assert_error, metric, metrics

from llmp.testing import LiveServer, hf_greedy, serving

TEMPLATE = (
    "{% if tools %}<s>tools: {% for t in tools %}{{ t['function']['name'] }};{% endfor %}</s>{% endif %}"
    "{% if greeting %}<s>{{ greeting }}</s>{% endif %}"
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant: {% endif %}"
)
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "The quick brown fox"}]
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
MAX_MODEL_LEN = 512
TOKENIZER_INFO = ("--enable-tokenizer-info-endpoint",)
# vLLM's GenerateRequest, plus the rendered text ("prompt")
FIELDS = {
    "request_id",
    "prompt",
    "token_ids",
    "features",
    "sampling_params",
    "model",
    "stream",
    "stream_options",
    "cache_salt",
    "priority",
    "kv_transfer_params",
}


@pytest.fixture(scope="module")
def render_server(tiny, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    template = Path(tmp_path_factory.mktemp("render")) / "template.jinja"
    template.write_text(TEMPLATE)
    with serving(
        tiny.path, "--chat-template", str(template), "--api-key", API_KEY, "--enable-admin-api", *TOKENIZER_INFO
    ) as live:
        yield live
        assert live.process.poll() is None, f"the server died during the tests:\n{live.log()}"


@pytest.fixture(scope="module")
def api(render_server: LiveServer) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {API_KEY}"}
    with httpx.Client(base_url=render_server.url, headers=headers, timeout=60) as client:
        yield client


def rendered(api: httpx.Client, path: str, body: dict) -> dict | list:
    response = api.post(path, json=body)
    assert response.status_code == 200, response.text
    return response.json()


def expected_text(tiny, messages: list[dict], **variables) -> str:
    return tiny.tokenizer.apply_chat_template(
        messages, chat_template=TEMPLATE, add_generation_prompt=True, tokenize=False, **variables
    )


def test_chat_render_is_the_prompt_the_chat_runs(api, tiny):
    body = {"messages": MESSAGES, "max_tokens": 3, "temperature": 0}
    out = rendered(api, "/v1/chat/completions/render", body)
    assert set(out) == FIELDS
    text = expected_text(tiny, MESSAGES)
    assert out["prompt"] == text
    assert out["token_ids"] == tiny.tokenizer.encode(text, add_special_tokens=False)
    assert out["request_id"].startswith("chatcmpl-")
    assert (out["model"], out["stream"], out["stream_options"], out["priority"]) == (None, False, None, 0)
    assert (out["features"], out["cache_salt"], out["kv_transfer_params"]) == (None, None, None)
    chat = api.post("/v1/chat/completions", json={**body, "return_token_ids": True}).json()
    assert chat["prompt_token_ids"] == out["token_ids"]
    assert chat["usage"]["prompt_tokens"] == len(out["token_ids"])


def test_chat_render_has_the_tools_and_template_variables(api, tiny):
    body = {"messages": MESSAGES, "tools": [TOOL], "chat_template_kwargs": {"greeting": "Hello there"}}
    out = rendered(api, "/v1/chat/completions/render", body)
    assert out["prompt"] == expected_text(tiny, MESSAGES, tools=[TOOL], greeting="Hello there")
    assert out["prompt"].startswith("<s>tools: get_weather;</s><s>Hello there</s>")
    chat = api.post("/v1/chat/completions", json={**body, "max_tokens": 1, "return_token_ids": True}).json()
    assert chat["prompt_token_ids"] == out["token_ids"]
    # tool_choice none hides nothing by default (vLLM's --exclude-tools-when-tool-choice-none is off)
    hidden = rendered(api, "/v1/chat/completions/render", {**body, "tool_choice": "none"})
    assert hidden["token_ids"] == out["token_ids"]


def test_chat_render_sampling_params(api):
    body = {
        "messages": MESSAGES,
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 7,
        "n": 2,
        "seed": 11,
        "stop": "fox",
        "logprobs": True,
        "top_logprobs": 3,
        "max_completion_tokens": 5,
        "logit_bias": {"5": 2.5},
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}},
        "stream": True,
        "stream_options": {"include_usage": True},
        "model": None,
    }
    out = rendered(api, "/v1/chat/completions/render", body)
    params = out["sampling_params"]
    assert {k: params[k] for k in ("temperature", "top_p", "top_k", "n", "seed", "max_tokens", "logprobs")} == {
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 7,
        "n": 2,
        "seed": 11,
        "max_tokens": 5,
        "logprobs": 3,
    }
    assert params["stop"] == ["fox"]
    assert params["logit_bias"] == {"5": 2.5}
    assert params["structured_outputs"]["json"] == {"type": "object"}
    assert (out["stream"], out["stream_options"]) == (True, {"include_usage": True, "continuous_usage_stats": None})
    # max_tokens unset: the rest of the context, as the generating route resolves it
    rest = rendered(api, "/v1/chat/completions/render", {"messages": MESSAGES})
    assert rest["sampling_params"]["max_tokens"] == MAX_MODEL_LEN - len(rest["token_ids"])
    assert rest["sampling_params"]["stop"] == []


TEXTS = ["The quick brown fox", "over the lazy dog"]


def test_completion_render_of_texts(api, tiny):
    body = {"prompt": TEXTS, "max_tokens": 2, "temperature": 0}
    out = rendered(api, "/v1/completions/render", body)
    assert isinstance(out, list) and len(out) == 2
    assert all(set(item) == FIELDS for item in out)
    assert [(item["prompt"], item["token_ids"]) for item in out] == [(t, tiny.tokenizer.encode(t)) for t in TEXTS]
    assert out[0]["request_id"].startswith("cmpl-") and out[0]["request_id"].endswith("-0")
    assert out[1]["request_id"] == out[0]["request_id"][:-1] + "1"
    assert [item["sampling_params"]["max_tokens"] for item in out] == [2, 2]
    generated = api.post("/v1/completions", json={**body, "return_token_ids": True}).json()
    assert [c["prompt_token_ids"] for c in generated["choices"]] == [item["token_ids"] for item in out]
    assert generated["usage"]["prompt_tokens"] == sum(len(item["token_ids"]) for item in out)
    # with echo and logprobs the prompt's logprobs are part of the request
    echoed = rendered(api, "/v1/completions/render", {"prompt": "The quick", "echo": True, "logprobs": 2})
    assert echoed[0]["sampling_params"]["prompt_logprobs"] == 2


def test_completion_render_of_token_ids(api, tiny):
    ids = [tiny.tokenizer.encode(t, add_special_tokens=False) for t in TEXTS]
    out = rendered(api, "/v1/completions/render", {"prompt": ids})
    assert [(item["prompt"], item["token_ids"]) for item in out] == [(tiny.tokenizer.decode(i), i) for i in ids]
    # one prompt: one item, its id the response's own (no index)
    single = rendered(api, "/v1/completions/render", {"prompt": ids[0]})
    assert len(single) == 1 and single[0]["token_ids"] == ids[0]
    assert single[0]["request_id"].startswith("cmpl-") and not single[0]["request_id"].endswith("-0")
    generated = api.post("/v1/completions", json={"prompt": ids[0], "max_tokens": 1, "return_token_ids": True})
    assert generated.json()["choices"][0]["prompt_token_ids"] == ids[0]


def test_request_id_follows_the_request(api):
    by_header = api.post("/v1/chat/completions/render", json={"messages": MESSAGES}, headers={"X-Request-Id": "t-1"})
    assert by_header.json()["request_id"] == "chatcmpl-t-1"
    by_body = rendered(api, "/v1/completions/render", {"prompt": "x", "request_id": "mine"})
    assert by_body[0]["request_id"] == "cmpl-mine"


CHAT_ERRORS = [
    ({"model": "no-such-model"}, 404, "model"),
    ({"temperature": -1}, 400, "temperature"),
    ({"top_logprobs": 2}, 400, "top_logprobs"),
    ({"messages": []}, 400, "messages"),
    ({"max_tokens": 10_000}, 400, "max_tokens"),
    ({"chat_template_kwargs": {"tokenize": True}}, 400, "chat_template_kwargs"),
    ({"chat_template": "{{ messages }}"}, 400, "chat_template"),
    ({"tool_choice": "required"}, 400, "tool_choice"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 5}}}}, 400, None),
    ({"stream_options": {"include_usage": True}}, 400, "stream_options"),
]
COMPLETION_ERRORS = [
    ({"model": "no-such-model"}, 404, "model"),
    ({"prompt": ""}, 400, "prompt"),
    ({"prompt": [10_000]}, 400, "prompt"),
    ({"best_of": 2}, 400, "best_of"),
    ({"suffix": "x"}, 400, "suffix"),
    ({"stop": [""]}, 400, "stop"),
    ({"n": 2, "temperature": 0}, 400, "n"),
]


@pytest.mark.parametrize(
    ("path", "base", "change", "status", "param"),
    [
        *[("/v1/chat/completions", {"messages": MESSAGES}, *case) for case in CHAT_ERRORS],
        *[("/v1/completions", {"prompt": "The quick"}, *case) for case in COMPLETION_ERRORS],
    ],
)
def test_bad_fields_are_the_generating_routes_errors(api, path, base, change, status, param):
    body = {**base, **change}
    render = api.post(f"{path}/render", json=body)
    assert_error(render, status, param=param)
    assert render.json() == api.post(path, json=body).json()


def test_render_makes_no_engine_request(api):
    before = metrics(api)
    for _ in range(3):
        rendered(api, "/v1/chat/completions/render", {"messages": MESSAGES, "tools": [TOOL]})
        rendered(api, "/v1/completions/render", {"prompt": ["The quick brown fox", "over the lazy dog"]})
    after = metrics(api)
    names = ("llmp_request_success_total", "llmp_prompt_tokens_total", "llmp_prefix_cache_queries_total")
    assert [metric(after, name) for name in names] == [metric(before, name) for name in names]
    api.post("/v1/completions", json={"prompt": "The quick", "max_tokens": 1})
    generated = metrics(api)
    assert all(metric(generated, name) > metric(after, name) for name in names)


def test_render_needs_the_api_key(render_server):
    for path, body in (
        ("/v1/chat/completions/render", {"messages": MESSAGES}),
        ("/v1/completions/render", {"prompt": "x"}),
    ):
        assert_error(httpx.post(render_server.url + path, json=body, timeout=30), 401)


def test_render_echoes_the_cache_salt_and_refuses_what_the_route_refuses(api):
    body = {"messages": MESSAGES, "max_tokens": 1}
    assert rendered(api, "/v1/chat/completions/render", {**body, "cache_salt": "tenant-a"})["cache_salt"] == "tenant-a"
    [out] = rendered(api, "/v1/completions/render", {"prompt": "hi", "cache_salt": "t"})
    assert out["cache_salt"] == "t"
    refused = api.post("/v1/chat/completions/render", json={**body, "kv_transfer_params": {"a": 1}})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "kv_transfer_params"


# -- GET /tokenizer_info (vLLM's, with --enable-tokenizer-info-endpoint) -------------------------------


def test_tokenizer_info_is_the_tokenizers_arguments_and_the_servers_template(api, tiny):
    info = api.get("/tokenizer_info").json()
    tokenizer = tiny.tokenizer  # transformers' own, loaded from the same directory
    assert info["tokenizer_class"] == type(tokenizer).__name__
    assert info["chat_template"] == TEMPLATE  # --chat-template's, over the tokenizer's own
    assert "vocab_file" not in info and "merges_file" not in info
    for name in ("bos_token", "eos_token"):
        assert info[name] == getattr(tokenizer, name)
    added = {int(key): text for key, text in info["added_tokens_decoder"].items()}
    assert added == {key: token.content for key, token in tokenizer.added_tokens_decoder.items()}


# -- POST /inference/v1/generate: a rendered request run as it is --------------------------------------


def sse_payloads(response) -> list:
    lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line[6:]) for line in lines[:-1]]


def test_a_rendered_chat_generates_what_the_chat_does(api, tiny):
    body = {"messages": MESSAGES, "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    out = rendered(api, "/v1/chat/completions/render", body)
    response = api.post("/inference/v1/generate", json=out)
    assert response.status_code == 200, response.text
    generated = response.json()
    chat = api.post("/v1/chat/completions", json={**body, "return_token_ids": True}).json()
    [choice] = generated["choices"]
    assert choice["token_ids"] == chat["choices"][0]["token_ids"]
    assert choice["token_ids"] == hf_greedy(tiny.model, out["token_ids"], 6)
    assert (choice["index"], choice["finish_reason"], choice["logprobs"]) == (0, "length", None)
    assert generated["request_id"] == out["request_id"]
    assert generated["usage"] == {
        "prompt_tokens": len(out["token_ids"]),
        "completion_tokens": 6,
        "total_tokens": len(out["token_ids"]) + 6,
    }
    assert (generated["prompt_logprobs"], generated["kv_transfer_params"]) == (None, None)


def test_generate_streams_token_ids_and_logprobs(api, tiny):
    ids = tiny.tokenizer.encode("The quick brown fox", add_special_tokens=False)
    params = {"max_tokens": 5, "temperature": 0, "ignore_eos": True, "logprobs": 2, "detokenize": False}
    whole = api.post("/inference/v1/generate", json={"token_ids": ids, "sampling_params": params}).json()
    [choice] = whole["choices"]
    assert choice["token_ids"] == hf_greedy(tiny.model, ids, 5)
    content = choice["logprobs"]["content"]
    assert [entry["token"] for entry in content] == [f"token_id:{t}" for t in choice["token_ids"]]
    assert all(len(entry["top_logprobs"]) == 2 for entry in content)
    body = {"token_ids": ids, "sampling_params": params, "stream": True, "stream_options": {"include_usage": True}}
    with api.stream("POST", "/inference/v1/generate", json=body) as response:
        assert response.status_code == 200
        chunks = sse_payloads(response)
    *steps, last = chunks
    assert [t for chunk in steps for t in chunk["choices"][0]["token_ids"]] == choice["token_ids"]
    assert steps[-1]["choices"][0]["finish_reason"] == "length"
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 5


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"sampling_params": {"temprature": 0}}, "sampling_params.temprature"),
        ({"sampling_params": {"max_tokens": 10_000}}, "sampling_params.max_tokens"),
        ({"sampling_params": {"temperature": -1}}, "sampling_params.temperature"),
        ({"sampling_params": {"logprobs": 100}}, "sampling_params.logprobs"),
        ({"sampling_params": {"output_kind": 2}}, "sampling_params.output_kind"),
        ({"sampling_params": {"structured_outputs": {"regex": "("}}}, "sampling_params.structured_outputs"),
        ({"token_ids": []}, "token_ids"),
        ({"token_ids": [1, 10**6]}, "token_ids"),
        ({"features": {"image": [1]}}, "features"),
        ({"kv_transfer_params": {"do_remote_prefill": True}}, "kv_transfer_params"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"cache_salt": ""}, "cache_salt"),
    ],
)
def test_bad_generate_requests_name_the_field(api, change, param):
    body = {"token_ids": [5, 6, 7], "sampling_params": {"max_tokens": 2}, **change}
    assert_error(api.post("/inference/v1/generate", json=body), 400, param=param)


def test_generate_needs_sampling_params_as_vllm_does(api):
    response = api.post("/inference/v1/generate", json={"token_ids": [5, 6, 7]})
    assert response.status_code == 400 and "sampling_params" in response.json()["error"]["message"]
