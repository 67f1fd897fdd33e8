"""``/api/chat`` and ``/api/generate`` through the official ``ollama`` client, checked against the
OpenAI front-end of the same server (greedy answers must be equal) and against Ollama's shapes."""

from __future__ import annotations

import json

import httpx
import jsonschema
import ollama
import pytest

GREEDY = {"temperature": 0, "num_predict": 12}
FOX = [{"role": "user", "content": "The quick brown fox"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["c", "f"]}},
            "required": ["city", "unit"],
        },
    },
}


def openai_chat(http: httpx.Client, messages: list[dict], max_tokens: int, **extra) -> dict:
    body = {"model": "tiny", "messages": messages, "max_tokens": max_tokens, "temperature": 0, **extra}
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def ndjson(response: httpx.Response) -> list[dict]:
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/x-ndjson")
    return [json.loads(line) for line in response.text.splitlines() if line]


def error_of(excinfo: pytest.ExceptionInfo, status: int) -> str:
    assert excinfo.value.status_code == status, excinfo.value
    return excinfo.value.error


# -- chat -----------------------------------------------------------------------


def test_chat_greedy_equals_openai(client, http):
    reply = client.chat(model="tiny", messages=FOX, options=GREEDY, stream=False)
    reference = openai_chat(http, FOX, 12)
    assert reply.message.role == "assistant" and reply.model == "tiny" and reply.done
    assert reply.message.content == reference["choices"][0]["message"]["content"]
    assert reply.done_reason == reference["choices"][0]["finish_reason"] == "length"
    assert reply.prompt_eval_count == reference["usage"]["prompt_tokens"]
    assert reply.eval_count == reference["usage"]["completion_tokens"] == 12
    for duration in ("total_duration", "load_duration", "prompt_eval_duration", "eval_duration"):
        assert getattr(reply, duration) > 0, duration
    assert reply.total_duration >= reply.prompt_eval_duration + reply.eval_duration
    assert reply.created_at.endswith("Z") and "T" in reply.created_at


def test_chat_stream_adds_up_to_the_whole(client, http):
    whole = client.chat(model="tiny:latest", messages=FOX, options=GREEDY, stream=False)
    parts = list(client.chat(model="tiny:latest", messages=FOX, options=GREEDY, stream=True))
    assert len(parts) > 2 and all(not part.done for part in parts[:-1]) and parts[-1].done
    assert "".join(part.message.content for part in parts) == whole.message.content
    assert parts[-1].done_reason == "length" and parts[-1].eval_count == 12 and parts[-1].message.content == ""
    # NDJSON on the wire, and Ollama streams unless told not to
    lines = ndjson(http.post("/api/chat", json={"model": "tiny", "messages": FOX, "options": GREEDY}))
    assert [line["done"] for line in lines] == [False] * (len(lines) - 1) + [True]


def test_chat_history_with_tool_results_equals_openai(client, http):
    call = {"function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}}
    history = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "18 degrees", "tool_name": "get_weather"},
    ]
    reply = client.chat(model="tiny", messages=history, options=GREEDY, stream=False)
    openai_call = {
        "id": "call_2_0",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "c"}'},
    }
    reference = openai_chat(
        http,
        [
            *history[:2],
            {"role": "assistant", "content": "", "tool_calls": [openai_call]},
            {"role": "tool", "content": "18 degrees", "name": "get_weather", "tool_call_id": "call_2_0"},
        ],
        12,
    )
    assert reply.message.content == reference["choices"][0]["message"]["content"]
    assert reply.prompt_eval_count == reference["usage"]["prompt_tokens"]


def test_options_are_sampling_parameters(client, http):
    options = {
        "temperature": 0.8,
        "top_k": 5,
        "top_p": 0.9,
        "min_p": 0.05,
        "seed": 7,
        "repeat_penalty": 1.2,
        "num_predict": 10,
    }
    reply = client.chat(model="tiny", messages=FOX, options=options, stream=False)
    reference = openai_chat(
        http, FOX, 10, temperature=0.8, top_k=5, top_p=0.9, min_p=0.05, seed=7, repetition_penalty=1.2
    )
    assert reply.message.content == reference["choices"][0]["message"]["content"]
    greedy = client.chat(model="tiny", messages=FOX, options=GREEDY, stream=False).message.content
    stop = {**GREEDY, "stop": [greedy[3:6]]}
    stopped = client.chat(model="tiny", messages=FOX, options=stop, stream=False)
    assert stopped.done_reason == "stop" and len(stopped.message.content) <= 3


def test_num_ctx_is_the_request_window(client):
    long = [{"role": "user", "content": "paged attention keeps the cache " * 8}]
    reply = client.chat(
        model="tiny", messages=long, options={"temperature": 0, "num_ctx": 24, "num_predict": -1}, stream=False
    )
    assert reply.prompt_eval_count <= 23  # the prompt keeps its end and leaves room to generate
    assert reply.prompt_eval_count + reply.eval_count <= 24 and reply.done_reason == "length"
    until_full = client.chat(
        model="tiny", messages=FOX, options={"temperature": 0, "num_ctx": 40, "num_predict": -1}, stream=False
    )
    assert until_full.prompt_eval_count + until_full.eval_count == 40 or until_full.done_reason == "stop"


def test_logprobs(client):
    reply = client.chat(model="tiny", messages=FOX, options=GREEDY, logprobs=True, top_logprobs=2, stream=False)
    assert len(reply.logprobs) == reply.eval_count
    first = reply.logprobs[0]
    assert first.logprob <= 0 and len(first.top_logprobs) == 2 and first.top_logprobs[0].logprob == first.logprob


# -- generate ---------------------------------------------------------------------


def test_generate_equals_openai_chat_and_completion(client, http):
    reply = client.generate(model="tiny", prompt="The quick brown fox", options=GREEDY, stream=False)
    assert reply.response == openai_chat(http, FOX, 12)["choices"][0]["message"]["content"]
    raw = client.generate(model="tiny", prompt="The quick brown fox", raw=True, options=GREEDY, stream=False)
    completion = http.post(
        "/v1/completions", json={"model": "tiny", "prompt": "The quick brown fox", "max_tokens": 12, "temperature": 0}
    ).json()
    assert raw.response == completion["choices"][0]["text"] and raw.context is None
    streamed = list(client.generate(model="tiny", prompt="The quick brown fox", options=GREEDY, stream=True))
    assert "".join(part.response for part in streamed) == reply.response and streamed[-1].done


def test_generate_context_continues_the_conversation(client):
    first = client.generate(model="tiny", prompt="Hello", options=GREEDY, stream=False)
    assert len(first.context) == first.prompt_eval_count + first.eval_count
    second = client.generate(model="tiny", prompt="More", context=first.context, options=GREEDY, stream=False)
    alone = client.generate(model="tiny", prompt="More", options=GREEDY, stream=False)
    assert second.prompt_eval_count == len(first.context) + alone.prompt_eval_count


def test_load_and_unload_replies(client, http):
    assert client.chat(model="tiny", messages=[]).done_reason == "load"
    assert (
        http.post("/api/chat", json={"model": "tiny", "messages": [], "keep_alive": 0}).json()["done_reason"]
        == "unload"
    )
    loaded = client.generate(model="tiny")
    assert loaded.done and loaded.done_reason == "load" and loaded.response == ""


# -- structured outputs --------------------------------------------------------------


def test_format_json_and_schema(client):
    schema = {
        "type": "object",
        "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 99}, "ok": {"type": "boolean"}},
        "required": ["age", "ok"],
        "additionalProperties": False,
    }
    reply = client.chat(
        model="tiny", messages=FOX, format=schema, options={"temperature": 0, "num_predict": 200}, stream=False
    )
    assert reply.done_reason == "stop", reply
    jsonschema.validate(json.loads(reply.message.content), schema)
    generated = client.generate(
        model="tiny", prompt="JSON please", format="json", options={"temperature": 0, "num_predict": 200}, stream=False
    )
    assert generated.done_reason == "stop", generated
    assert isinstance(json.loads(generated.response), dict)
    with pytest.raises(ollama.ResponseError) as excinfo:
        client.chat(model="tiny", messages=FOX, format={"type": "no-such-type"}, stream=True).__next__()
    assert "format" in error_of(excinfo, 400) or "schema" in error_of(excinfo, 400).lower()


# -- tools and thinking ------------------------------------------------------------------


def test_tools_need_a_tool_parser(client):
    with pytest.raises(ollama.ResponseError) as excinfo:
        client.chat(model="tiny", messages=FOX, tools=[WEATHER], stream=False)
    message = error_of(excinfo, 400)
    assert (
        "does not support tools" in message
        and "--tool-call-parser" in message
        and "--enable-auto-tool-choice" in message
    )


def test_tool_calls_in_ollamas_shape(tools_server):
    client = ollama.Client(host=tools_server.url, timeout=60)
    assert "tools" in client.show("tiny").capabilities
    # a random model may or may not call: auto is accepted and answered
    assert client.chat(model="tiny", messages=FOX, tools=[WEATHER], options=GREEDY, stream=False).done
    # llmp's tool_choice extension forces a call (constrained decoding), to check the reply's shape
    body = {
        "model": "tiny",
        "messages": FOX,
        "tools": [WEATHER],
        "options": {"temperature": 0, "num_predict": 60},
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    }
    with httpx.Client(base_url=tools_server.url, timeout=60) as http:
        whole = ollama.ChatResponse.model_validate(http.post("/api/chat", json={**body, "stream": False}).json())
        lines = ndjson(http.post("/api/chat", json=body))
    (call,) = whole.message.tool_calls
    assert call.function.name == "get_weather" and isinstance(call.function.arguments, dict)
    jsonschema.validate(call.function.arguments, WEATHER["function"]["parameters"])
    streamed = [c for line in lines for c in line["message"].get("tool_calls", [])]
    assert [c["function"] for c in streamed] == [
        {"index": 0, "name": "get_weather", "arguments": call.function.arguments}
    ]


def test_think(thinking_server, client):
    thinker = ollama.Client(host=thinking_server.url, timeout=60)
    assert "thinking" in thinker.show("tiny").capabilities
    reply = thinker.chat(model="tiny", messages=FOX, think=True, options=GREEDY, stream=False)
    assert reply.message.thinking  # deepseek_r1 reads a completion without its end marker as reasoning
    parts = list(thinker.chat(model="tiny", messages=FOX, think=True, options=GREEDY, stream=True))
    assert "".join(p.message.thinking or "" for p in parts) == reply.message.thinking
    generated = thinker.generate(model="tiny", prompt="The quick brown fox", think="high", options=GREEDY, stream=False)
    assert generated.thinking
    with pytest.raises(ollama.ResponseError) as excinfo:
        client.chat(model="tiny", messages=FOX, think=True, stream=False)
    assert "does not support thinking" in error_of(excinfo, 400) and "--reasoning-parser" in excinfo.value.error


# -- refusals ---------------------------------------------------------------------------


def test_images_are_refused(client):
    for call in (
        lambda: client.chat(
            model="tiny", messages=[{"role": "user", "content": "what is it?", "images": [b"\x89PNG"]}]
        ),
        lambda: client.generate(model="tiny", prompt="what is it?", images=[b"\x89PNG"]),
    ):
        with pytest.raises(ollama.ResponseError) as excinfo:
            call()
        assert error_of(excinfo, 400) == "images are not supported: llmp serves text-only models"


def test_unknown_model_is_ollamas_404(client):
    with pytest.raises(ollama.ResponseError) as excinfo:
        client.chat(model="llama3.2", messages=FOX)
    assert error_of(excinfo, 404) == 'model "llama3.2" not found, try pulling it first'


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"mirostat": 2}, "options.mirostat"),
        ({"typical_p": 0.5}, "options.typical_p"),
        ({"tfs_z": 0.9}, "options.tfs_z"),
        ({"temperature": "hot"}, "options.temperature"),
        ({"no_such_option": 1}, "options.no_such_option"),
        ({"repeat_penalty": 1.3, "repeat_last_n": 64}, "options.repeat_last_n"),
        ({"num_ctx": 1}, "options.num_ctx"),
    ],
)
def test_options_llmp_cannot_honour_are_400s(client, options, named):
    with pytest.raises(ollama.ResponseError) as excinfo:
        client.chat(model="tiny", messages=FOX, options=options)
    assert named in error_of(excinfo, 400)


def test_runner_options_and_off_values_are_accepted(client):
    options = {
        **GREEDY,
        "num_gpu": 99,
        "num_thread": 4,
        "use_mmap": True,
        "mirostat": 0,
        "typical_p": 1.0,
        "repeat_last_n": 64,
    }
    reference = client.chat(model="tiny", messages=FOX, options=GREEDY, stream=False)
    assert (
        client.chat(model="tiny", messages=FOX, options=options, stream=False).message.content
        == reference.message.content
    )


def test_unsupported_fields_are_400s(client, http):
    with pytest.raises(ollama.ResponseError) as excinfo:
        client.generate(model="tiny", prompt="def f(", suffix="return x")
    assert "suffix" in error_of(excinfo, 400)
    response = http.post("/api/generate", json={"model": "tiny", "prompt": "x", "template": "{{ .Prompt }}"})
    assert response.status_code == 400 and "template" in response.json()["error"]
