"""A LoRA adapter (``--enable-lora --lora-modules a=PATH``) as the ``model`` of ``/v1/messages``,
through the ``anthropic`` SDK, checked against the OpenAI front-end of the same server (whose
adapter tokens the OpenAI plugin's tests check against the offline engine)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import pytest
from anthropic_frontend_support import sse_events

from llmp.testing import LiveServer, save_random_lora, serving

GREEDY = {"extra_body": {"temperature": 0}}
FOX = [{"role": "user", "content": "The quick brown fox"}]
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def lora_server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    adapter = save_random_lora(model_dir, tmp_path_factory.mktemp("lora") / "a", seed=1)
    with serving(
        model_dir,
        "--dtype",
        "float32",
        "--frontend",
        "anthropic",
        "--frontend",
        "openai",
        "--enable-lora",
        "--lora-modules",
        f"a={adapter}",
    ) as live:
        yield live
        assert live.process.poll() is None, f"the server died during the tests:\n{live.log()}"


@pytest.fixture(scope="module")
def sdk(lora_server: LiveServer) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=lora_server.url, api_key="unused", max_retries=0, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def http(lora_server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=lora_server.url, timeout=60) as client:
        yield client


def openai_chat(http: httpx.Client, model: str) -> dict:
    body = {"model": model, "messages": FOX, "max_tokens": MAX_TOKENS, "temperature": 0}
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def test_messages_on_an_adapter_equal_openai_chat(sdk, http, model_dir):
    message = sdk.messages.create(model="a", messages=FOX, max_tokens=MAX_TOKENS, **GREEDY)
    reference = openai_chat(http, "a")
    assert message.model == "a"
    assert message.content[0].text == reference["choices"][0]["message"]["content"]
    assert message.usage.output_tokens == reference["usage"]["completion_tokens"]
    base = sdk.messages.create(model=str(model_dir), messages=FOX, max_tokens=MAX_TOKENS, **GREEDY)
    assert base.model == str(model_dir)
    assert base.content[0].text == openai_chat(http, str(model_dir))["choices"][0]["message"]["content"]
    assert base.content[0].text != message.content[0].text  # the adapter is applied


def test_streamed_message_names_the_adapter(http):
    body = {"model": "a", "messages": FOX, "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True}
    response = http.post("/v1/messages", json=body)
    assert response.status_code == 200, response.text
    events = sse_events(response.text)
    assert events[0][1]["message"]["model"] == "a"
    text = "".join(data["delta"].get("text", "") for kind, data in events if kind == "content_block_delta")
    assert text == openai_chat(http, "a")["choices"][0]["message"]["content"]


def test_count_tokens_takes_an_adapter(sdk):
    assert sdk.messages.count_tokens(model="a", messages=FOX).input_tokens > 0


def test_unknown_model_is_anthropics_404(sdk):
    with pytest.raises(anthropic.NotFoundError) as caught:
        sdk.messages.create(model="b", messages=FOX, max_tokens=4)
    body = caught.value.response.json()
    assert body["type"] == "error" and body["error"]["type"] == "not_found_error", body
    message = body["error"]["message"]
    assert message.startswith("model: b ") and message.endswith(", a)"), message  # the adapter is listed as served
