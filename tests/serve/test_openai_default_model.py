"""``llmp serve`` with no MODEL: SmolLM2-135M-Instruct from the packaged GGUF, through the SDK."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest


@pytest.fixture(scope="module")
def sdk(default_server) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=default_server.api_url, api_key="x", max_retries=0, timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def model(sdk) -> str:
    models = sdk.models.list().data
    assert len(models) == 1
    return models[0].id


def test_the_default_model_is_smollm2(model):
    assert "SmolLM2-135M-Instruct" in model


def test_chat_answers(sdk, model):
    response = sdk.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Say hello."}], max_tokens=12, temperature=0
    )
    text = response.choices[0].message.content
    assert text.strip()
    assert response.choices[0].finish_reason in ("stop", "length")
    assert response.model == model


def test_streamed_equals_non_streamed(sdk, model):
    messages = [{"role": "user", "content": "Name a colour."}]
    whole = sdk.chat.completions.create(model=model, messages=messages, max_tokens=12, temperature=0)
    chunks = list(
        sdk.chat.completions.create(model=model, messages=messages, max_tokens=12, temperature=0, stream=True)
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == [
        whole.choices[0].finish_reason
    ]
