"""LoRA adapters on ``/invocations``: named by the ``X-Amzn-SageMaker-Adapter-Identifier`` header
(SageMaker's inference components) or the body's ``model``, checked against the OpenAI routes of the
same server; and ``POST /adapters`` / ``DELETE /adapters/{adapter_name}`` with
``--enable-lora-runtime-updates``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from llmp.testing import LiveServer, assert_openai_error, save_random_lora, serving

HEADER = "X-Amzn-SageMaker-Adapter-Identifier"
PROMPT = "The quick brown fox"
MESSAGES = [{"role": "user", "content": "Paged attention keeps"}]
GREEDY = {"max_tokens": 8, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def adapters(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("loras")
    return {name: save_random_lora(model_dir, root / name, seed=seed) for seed, name in enumerate("ac", 1)}


@pytest.fixture(scope="module")
def lora_http(model_dir: Path, adapters: dict[str, Path]) -> Iterator[httpx.Client]:
    with serving(
        model_dir,
        "--dtype",
        "float32",
        "--frontend",
        "sagemaker",
        "--frontend",
        "openai",
        "--enable-lora",
        "--lora-modules",
        f"a={adapters['a']}",
        "--enable-lora-runtime-updates",
    ) as live:
        with httpx.Client(base_url=live.url, timeout=60) as client:
            yield client
        assert_alive(live)


def assert_alive(live: LiveServer) -> None:
    assert live.process.poll() is None, f"the server died during the tests:\n{live.log()}"


def openai_text(http: httpx.Client, model: str, route: str = "completions") -> str:
    body = {"model": model, **GREEDY, **({"prompt": PROMPT} if route == "completions" else {"messages": MESSAGES})}
    response = http.post(f"/v1/{route}", json=body)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    return choice["text"] if route == "completions" else choice["message"]["content"]


def invoke(http: httpx.Client, body: dict, adapter: str | None = None) -> httpx.Response:
    return http.post("/invocations", json=body, headers={HEADER: adapter} if adapter else {})


def test_header_names_the_adapter(lora_http, model_dir):
    response = invoke(lora_http, {"prompt": PROMPT, **GREEDY}, adapter="a")
    assert response.status_code == 200, response.text
    assert response.json()["model"] == "a"
    text = response.json()["choices"][0]["text"]
    assert text == openai_text(lora_http, "a") != openai_text(lora_http, str(model_dir))


def test_header_wins_over_the_body_model(lora_http, model_dir):
    response = invoke(lora_http, {"model": str(model_dir), "messages": MESSAGES, **GREEDY}, adapter="a")
    assert response.status_code == 200, response.text
    assert response.json()["model"] == "a"
    assert response.json()["choices"][0]["message"]["content"] == openai_text(lora_http, "a", "chat/completions")


def test_body_model_names_the_adapter(lora_http):
    response = invoke(lora_http, {"model": "a", "prompt": PROMPT, **GREEDY})
    assert response.status_code == 200, response.text
    assert response.json()["model"] == "a"
    assert response.json()["choices"][0]["text"] == openai_text(lora_http, "a")


def test_unknown_adapter_is_a_404(lora_http):
    assert_openai_error(invoke(lora_http, {"prompt": PROMPT, **GREEDY}, adapter="nope"), 404)


def test_adapters_load_and_unload(lora_http, adapters):
    loaded = lora_http.post("/adapters", json={"name": "c", "src": str(adapters["c"])})
    assert loaded.status_code == 200, loaded.text
    response = invoke(lora_http, {"prompt": PROMPT, **GREEDY}, adapter="c")
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["text"] == openai_text(lora_http, "c")
    assert_openai_error(lora_http.post("/adapters", json={"name": "c", "src": str(adapters["c"])}), 400)

    unloaded = lora_http.delete("/adapters/c")
    assert unloaded.status_code == 200, unloaded.text
    assert_openai_error(invoke(lora_http, {"prompt": PROMPT, **GREEDY}, adapter="c"), 404)
    assert_openai_error(lora_http.delete("/adapters/c"), 404)


def test_adapter_routes_need_runtime_updates(http):
    assert http.post("/adapters", json={"name": "c", "src": "/tmp"}).status_code in (404, 405)
    assert http.delete("/adapters/c").status_code in (404, 405)
