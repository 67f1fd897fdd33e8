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
    # Ollama's default host and namespace name the same model
    for name in ("library/tiny", "registry.ollama.ai/library/tiny:latest"):
        assert client.chat(model=name, messages=FOX, options=GREEDY, stream=False).message == whole.message
    parts = list(client.chat(model="tiny:latest", messages=FOX, options=GREEDY, stream=True))
    assert len(parts) > 2 and all(not part.done for part in parts[:-1]) and parts[-1].done
    assert "".join(part.message.content for part in parts) == whole.message.content
    assert parts[-1].done_reason == "length" and parts[-1].eval_count == 12 and parts[-1].message.content == ""
    # NDJSON on the wire, and Ollama streams unless told not to
    lines = ndjson(http.post("/api/chat", json={"model": "tiny", "messages": FOX, "options": GREEDY}))
    assert [line["done"] for line in lines] == [False] * (len(lines) - 1) + [True]


def test_chat_history_with_tool_calls_reaches_the_template_as_openai_does(tools_server):
    client = ollama.Client(host=tools_server.url, timeout=60)
    call = {"function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}}
    history = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "18 degrees", "tool_name": "get_weather"},
    ]
    reply = client.chat(model="tiny", messages=history, options=GREEDY, stream=False)
    without_call = [*history[:2], {"role": "assistant", "content": ""}, history[3]]
    # the template renders the call's name and arguments.city: both reach it, the arguments as a mapping
    plain = client.chat(model="tiny", messages=without_call, options=GREEDY, stream=False)
    assert reply.prompt_eval_count > plain.prompt_eval_count + 2
    openai_call = {
        "id": "call_2_0",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "c"}'},
    }
    with httpx.Client(base_url=tools_server.url, timeout=60) as http:
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


@pytest.mark.parametrize("stream", [False, True])
def test_logprobs_cover_the_text_a_stop_string_leaves(client, stream):
    # as Ollama's runner: the tokens of the stop string go with it, so the logprobs spell the text returned
    free = client.generate(model="tiny", prompt="The quick brown fox", options=GREEDY, logprobs=True, stream=False)
    tokens = [entry.token for entry in free.logprobs]
    whole = "".join(tokens)
    cut = next(
        k for k in range(2, len(tokens)) if tokens[k].strip() and whole.find(tokens[k]) == len("".join(tokens[:k]))
    )
    options = {**GREEDY, "stop": [tokens[k] for k in (cut,)]}
    chunks = client.generate(model="tiny", prompt="The quick brown fox", options=options, logprobs=True, stream=stream)
    chunks = list(chunks) if stream else [chunks]
    text = "".join(chunk.response for chunk in chunks)
    kept = [entry.token for chunk in chunks for entry in chunk.logprobs or ()]
    assert chunks[-1].done_reason == "stop" and text == "".join(tokens[:cut])
    assert kept == tokens[:cut]


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
    message = error_of(excinfo, 400)
    assert message.startswith("invalid format: ") and "schema" in message, message  # Ollama's field, not vLLM's


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
    assert thinker.chat(model="tiny", messages=FOX, think="max", options=GREEDY, stream=False).message.thinking
    # think false: no thinking parser, as Ollama's; every token is the answer (and format covers it all)
    off = thinker.chat(model="tiny", messages=FOX, think=False, options=GREEDY, stream=False).message
    assert off.content == reply.message.thinking and not off.thinking
    parts = list(thinker.chat(model="tiny", messages=FOX, think=False, options=GREEDY, stream=True))
    assert "".join(p.message.content for p in parts) == off.content
    said = thinker.generate(model="tiny", prompt="The quick brown fox", think=False, options=GREEDY, stream=False)
    assert said.response and not said.thinking
    shaped = thinker.chat(model="tiny", messages=FOX, think=False, format="json", options={**GREEDY, "num_predict": 24})
    assert shaped.message.content.lstrip().startswith("{") and not shaped.message.thinking
    with pytest.raises(ollama.ResponseError) as excinfo:
        client.chat(model="tiny", messages=FOX, think=True, stream=False)
    assert "does not support thinking" in error_of(excinfo, 400) and "--reasoning-parser" in excinfo.value.error


def test_tools_need_a_template_that_renders_them(thinking_server):
    # this server has a tool parser, but the tiny tokenizer's template never shows the model its tools
    client = ollama.Client(host=thinking_server.url, timeout=60)
    assert "tools" not in client.show("tiny").capabilities
    with pytest.raises(ollama.ResponseError) as excinfo:
        client.chat(model="tiny", messages=FOX, tools=[WEATHER], stream=False)
    assert error_of(excinfo, 400).startswith('"tiny" does not support tools') and "--chat-template" in (
        excinfo.value.error
    )


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
    assert error_of(excinfo, 404) == "model 'llama3.2' not found"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"temperature": "hot"}, 'option "temperature" must be of type float32'),
        ({"top_k": "5"}, 'option "top_k" must be of type integer'),
        ({"use_mmap": "yes"}, 'option "use_mmap" must be of type boolean'),
        ({"stop": [1]}, 'option "stop" must be an array of strings'),
        ({"num_ctx": 0}, "options.num_ctx must be at least 1"),
        ({"num_ctx": 1}, "options.num_ctx=1 leaves no room to generate"),
    ],
)
def test_options_of_the_wrong_type_are_400s(client, options, message):
    with pytest.raises(ollama.ResponseError) as excinfo:
        client.chat(model="tiny", messages=FOX, options=options)
    assert message in error_of(excinfo, 400)


def test_unset_sampling_options_take_ollamas_defaults(client):
    """The tiny model's generation config sets no sampling: Ollama's temperature 0.8, top_k 40, top_p 0.9."""

    def said(**options) -> str:
        return client.generate(
            model="tiny", prompt="The quick brown fox", options={"seed": 7, "num_predict": 24, **options}
        ).response

    assert said() == said(temperature=0.8, top_k=40, top_p=0.9)
    assert said(top_k=1) == said(temperature=0)  # a request's own option still wins


# Ollama's docs/api.md "Generate request (With options)", as written (its curl -d sends a form content type)
DOCS_EXAMPLE = """{
  "model": "tiny",
  "prompt": "Why is the sky blue?",
  "stream": false,
  "options": {
    "num_keep": 5, "seed": 42, "num_predict": 100, "draft_num_predict": 4, "top_k": 20, "top_p": 0.9,
    "min_p": 0.0, "typical_p": 0.7, "repeat_last_n": 33, "temperature": 0.8, "repeat_penalty": 1.2,
    "presence_penalty": 1.5, "frequency_penalty": 1.0, "penalize_newline": true, "stop": ["\\n", "user:"],
    "numa": false, "num_ctx": 1024, "num_batch": 2, "num_gpu": 1, "main_gpu": 0, "use_mmap": true,
    "num_thread": 8
  }
}"""
CURL_FORM = {"Content-Type": "application/x-www-form-urlencoded"}


def test_ollamas_documented_options_example_works_with_one_warning(server, http):
    response = http.post("/api/generate", content=DOCS_EXAMPLE, headers=CURL_FORM)
    assert response.status_code == 200, response.text
    assert response.json()["done"] and response.json()["eval_count"] > 0
    warnings = [line for line in server.log().splitlines() if "options accepted but not applied" in line]
    (warning,) = [line for line in warnings if "penalize_newline" in line]
    assert "numa" in warning and "typical_p" not in warning and "draft_num_predict" not in warning
    # options Ollama dropped, and unknown ones, are accepted; the reply is what the honoured ones give
    dropped = {**GREEDY, "mirostat": 2, "mirostat_eta": 0.1, "tfs_z": 0.9, "no_such_option": 1, "num_gpu": 99}
    reference = client_chat(http, GREEDY)
    assert client_chat(http, dropped) == reference
    # repeat_last_n 0 turns the penalty off (Ollama's "no window"); -1 is llmp's whole-context penalty
    assert client_chat(http, {**GREEDY, "repeat_penalty": 3.0, "repeat_last_n": 0}) == reference
    assert client_chat(http, {**GREEDY, "repeat_penalty": 3.0, "repeat_last_n": -1}) == client_chat(
        http, {**GREEDY, "repeat_penalty": 3.0}
    )


def client_chat(http: httpx.Client, options: dict, messages: list[dict] = FOX) -> str:
    body = {"model": "tiny", "messages": messages, "options": options, "stream": False}
    response = http.post("/api/chat", json=body)
    assert response.status_code == 200, response.text
    return response.json()["message"]["content"]


def test_form_typed_bodies_are_json_unless_a_browser_sends_them(http):
    body = json.dumps({"model": "tiny", "messages": FOX, "options": GREEDY, "stream": False})
    assert http.post("/api/chat", content=body, headers=CURL_FORM).json()["done"]
    browser = http.post("/api/chat", content=body, headers={**CURL_FORM, "Origin": "http://evil.example"})
    assert browser.status_code == 400 and set(browser.json()) == {"error"}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"stream": "no"}, 'stream: must be a valid boolean, got "no"'),
        (
            {"think": "extreme"},
            'invalid think value: "extreme" (must be "high", "medium", "low", "max", true, or false)',
        ),
        ({"think": 1}, "think must be a boolean or string"),
        ({"keep_alive": "soon"}, 'keep_alive: invalid duration "soon"'),
        ({"keep_alive": [5]}, "keep_alive must be a duration"),
        ({"messages": [{"content": "hi"}]}, "messages.0.role is required"),
        ({"messages": [{"role": " ", "content": "hi"}]}, "role must not be empty"),
        ({"tools": [{"type": "function"}]}, "every tool must be a function with a name"),
        ({"model": None}, "model: must be a valid string, got null"),
        ({"top_logprobs": 21, "logprobs": True}, "top_logprobs must be between 0 and 20"),
    ],
)
def test_invalid_bodies_are_one_line_400s(http, body, message):
    response = http.post("/api/chat", json={"model": "tiny", "messages": FOX, **body})
    assert response.status_code == 400 and set(response.json()) == {"error"}, response.text
    error = response.json()["error"]
    assert message in error and "\n" not in error and "pydantic" not in error


def test_lenient_fields_as_ollama_reads_them(client, http):
    reference = client.chat(model="tiny", messages=FOX, options=GREEDY, stream=False)
    shouted = [{"role": "USER", "content": FOX[0]["content"]}]  # roles are lower-cased, as Ollama's
    assert client_chat(http, GREEDY, shouted) == reference.message.content
    for keep_alive in ("5m", "1h30m", -1, 300, "-1", "0.5s"):
        assert client.chat(model="tiny", messages=FOX, options=GREEDY, keep_alive=keep_alive, stream=False).done
    unload = http.post("/api/generate", json={"model": "tiny", "keep_alive": "0s"}).json()
    assert unload["done_reason"] == "unload"
    # top_logprobs without logprobs is ignored, as Ollama does
    ignored = client.chat(model="tiny", messages=FOX, options=GREEDY, top_logprobs=3, stream=False)
    assert ignored.logprobs is None and ignored.message.content == reference.message.content


def test_raw_refuses_template_system_and_context(http):
    for extra in ({"system": "Be brief."}, {"context": [1, 2]}, {"template": "{{ .Prompt }}"}):
        response = http.post("/api/generate", json={"model": "tiny", "prompt": "x", "raw": True, **extra})
        assert response.status_code == 400
        assert response.json() == {"error": "raw mode does not support template, system, or context"}


def test_chat_drops_whole_old_messages_to_fit_as_ollama_does(client):
    system = {"role": "system", "content": "Be brief."}
    old = [
        {"role": "user", "content": "paged attention keeps the cache " * 3},
        {"role": "assistant", "content": "the scheduler batches requests " * 3},
    ]
    last = {"role": "user", "content": "The quick brown fox"}
    options = {"temperature": 0, "num_predict": 4}
    alone = client.chat(model="tiny", messages=[system, last], options=options, stream=False)
    with_one = client.chat(model="tiny", messages=[system, old[1], last], options=options, stream=False)
    # with num_predict's room (4 tokens) too small for [system, *old, last]: old[0] goes, then old[1]
    window = with_one.prompt_eval_count + 3
    kept = client.chat(
        model="tiny", messages=[system, *old, last], options={**options, "num_ctx": window}, stream=False
    )
    assert kept.prompt_eval_count == alone.prompt_eval_count  # system and last user message, whole
    assert kept.message.content == alone.message.content
    roomier = client.chat(
        model="tiny", messages=[system, *old, last], options={**options, "num_ctx": window + 1}, stream=False
    )
    assert roomier.prompt_eval_count == with_one.prompt_eval_count  # only the oldest message went


def test_a_prompt_too_long_alone_keeps_num_keep_tokens_and_its_end(client, http):
    text = "The quick brown fox " + "paged attention keeps the cache " * 8
    ids = http.post("/tokenize", json={"model": "tiny", "prompt": text}).json()["tokens"]
    assert len(ids) > 30
    cut = client.generate(
        model="tiny", prompt=text, raw=True, logprobs=True, options={**GREEDY, "num_ctx": 24}, stream=False
    )
    # Ollama's default num_keep (4) and the end, num_predict's 12 tokens (half the window) left to generate
    kept = ids[:4] + ids[-8:]
    reference = http.post(
        "/v1/completions", json={"model": "tiny", "prompt": kept, "max_tokens": 12, "temperature": 0, "logprobs": 1}
    ).json()["choices"][0]
    assert cut.prompt_eval_count == 12 and cut.eval_count == 12 and cut.response == reference["text"]
    assert [e.logprob for e in cut.logprobs] == pytest.approx(reference["logprobs"]["token_logprobs"], abs=1e-4)
    # num_predict unset: one token of room, as the runner leaves
    one = client.generate(model="tiny", prompt=text, raw=True, options={"temperature": 0, "num_ctx": 24}, stream=False)
    assert one.prompt_eval_count == 23 and one.eval_count == 1


def test_suffix_fills_in_the_middle_in_the_models_tokens(client, http, model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from llmp.testing import hf_greedy

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prefix, suffix = "the quick brown ", " over the lazy dog"
    ids = tokenizer.convert_tokens_to_ids(["<|fim_prefix|>"]) + tokenizer.encode(prefix, add_special_tokens=False)
    ids += tokenizer.convert_tokens_to_ids(["<|fim_suffix|>"]) + tokenizer.encode(suffix, add_special_tokens=False)
    ids += tokenizer.convert_tokens_to_ids(["<|fim_middle|>"])
    expected = hf_greedy(AutoModelForCausalLM.from_pretrained(model_dir), ids, 12)
    reply = client.generate(model="tiny", prompt=prefix, suffix=suffix, options=GREEDY, stream=False)
    assert reply.prompt_eval_count == len(ids)
    assert reply.response == tokenizer.decode(expected, skip_special_tokens=True)
    body = {
        "model": "tiny",
        "prompt": prefix,
        "suffix": suffix,
        "max_tokens": 12,
        "temperature": 0,
        "return_token_ids": True,
    }
    completion = http.post("/v1/completions", json=body).json()
    assert completion["choices"][0]["token_ids"] == expected  # OpenAI's completions suffix: the same prompt
    assert completion["choices"][0]["prompt_token_ids"] == ids
    for extra in ({"echo": True}, {"prompt": [5, 6]}, {"truncate_prompt_tokens": 4}, {"prompt": []}):
        assert http.post("/v1/completions", json={**body, **extra}).status_code == 400, extra
    # the cursor at the start of a file: an empty prefix still asks for the middle
    start = http.post("/v1/completions", json={**body, "prompt": ""}).json()["choices"][0]
    assert start["prompt_token_ids"] == [
        ids[0],
        *ids[-1 - len(tokenizer.encode(suffix, add_special_tokens=False)) - 1 :],
    ]
    assert (
        http.post("/api/generate", json={"model": "tiny", "prompt": "x", "suffix": "y", "think": True}).status_code
        == 400
    )
    with pytest.raises(ollama.ResponseError) as excinfo:
        client.generate(model="tiny", prompt=prefix, suffix=suffix, raw=True)
    assert "suffix" in error_of(excinfo, 400)


def test_unsupported_fields_are_400s(client, http):
    response = http.post("/api/generate", json={"model": "tiny", "prompt": "x", "template": "{{ .Prompt }}"})
    assert response.status_code == 400 and "template" in response.json()["error"]


def test_typical_p_is_locally_typical_sampling(client, http):
    """typical_p 0 keeps only the most typical token (and its ties) a step: the seed no longer matters;
    1 or more is off, as in llama.cpp; below 0 is a 400."""
    sampled = {"temperature": 1.0, "num_predict": 12}
    typical = [client_chat(http, {**sampled, "seed": seed, "typical_p": 0.0}) for seed in (1, 2, 3)]
    assert typical[0] == typical[1] == typical[2]
    free = [client_chat(http, {**sampled, "seed": seed}) for seed in (1, 2, 3)]
    assert len(set(free)) > 1
    assert client_chat(http, {**sampled, "seed": 1, "typical_p": 1.5}) == free[0]
    with pytest.raises(ollama.ResponseError) as excinfo:
        client.chat(model="tiny", messages=FOX, options={"typical_p": -0.5})
    assert "typical_p" in error_of(excinfo, 400)


# -- prefill, truncate, _debug_render_only, logprob bytes (Ollama's newer behaviours) ---------------------


def test_a_chat_ending_with_an_assistant_message_continues_it(client, http):
    prefill = [*FOX, {"role": "assistant", "content": "jumps over"}]
    reply = client.chat(model="tiny", messages=prefill, options=GREEDY, stream=False)
    # OpenAI's continue_final_message on the same server: the message left open, its continuation answered
    body = {"continue_final_message": True, "add_generation_prompt": False}
    reference = openai_chat(http, prefill, 12, **body)
    assert reply.message.content == reference["choices"][0]["message"]["content"]
    assert reply.prompt_eval_count == reference["usage"]["prompt_tokens"]
    closed = openai_chat(http, [*prefill, {"role": "user", "content": "again"}], 12)
    assert reply.prompt_eval_count < closed["usage"]["prompt_tokens"]


def test_debug_render_only_answers_the_prompt_and_generates_nothing(client, http):
    body = {"model": "tiny", "messages": FOX, "_debug_render_only": True, "stream": False}
    rendered = http.post("/api/chat", json=body).json()
    ids = http.post("/tokenize", json={"model": "tiny", "messages": FOX}).json()["tokens"]
    assert (
        rendered["_debug_info"]["rendered_template"] == http.post("/detokenize", json={"tokens": ids}).json()["prompt"]
    )
    assert rendered["done"] is False and rendered["message"]["content"] == ""
    raw = {"model": "tiny", "prompt": "The quick", "raw": True, "_debug_render_only": True}
    assert http.post("/api/generate", json=raw).json()["_debug_info"] == {"rendered_template": "The quick"}
    too_long = {**raw, "prompt": "paged attention keeps the cache " * 8, "truncate": False, "options": {"num_ctx": 16}}
    assert http.post("/api/generate", json=too_long).status_code == 400  # checked as a real request would be


def test_truncate_false_refuses_a_prompt_longer_than_the_window(http):
    text = "paged attention keeps the cache " * 8
    for path, body in (
        ("/api/generate", {"prompt": text, "raw": True}),
        ("/api/chat", {"messages": [{"role": "user", "content": text}]}),
    ):
        body = {"model": "tiny", "stream": False, "options": {"num_ctx": 16, "num_predict": 2}, **body}
        refused = http.post(path, json={**body, "truncate": False})
        assert refused.status_code == 400 and "exceeds the context length (16)" in refused.json()["error"], path
        assert http.post(path, json=body).json()["prompt_eval_count"] < 16  # truncate's default: cut to fit


def test_logprobs_carry_each_tokens_bytes(http):
    body = {"model": "tiny", "messages": FOX, "options": GREEDY, "logprobs": True, "top_logprobs": 2, "stream": False}
    entries = http.post("/api/chat", json=body).json()["logprobs"]
    # the OpenAI route's bytes on the same server (checked against the tokenizer's own in its tests)
    reference = openai_chat(http, FOX, 12, logprobs=True, top_logprobs=2)["choices"][0]["logprobs"]["content"]
    assert [e["bytes"] for e in entries] == [r["bytes"] for r in reference]
    assert [[t["bytes"] for t in e["top_logprobs"]] for e in entries] == [
        [t["bytes"] for t in r["top_logprobs"]] for r in reference
    ]
