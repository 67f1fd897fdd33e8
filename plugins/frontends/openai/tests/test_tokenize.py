"""``/tokenize`` and ``/detokenize``: the server's tokenizer, as transformers has it."""

from __future__ import annotations

import pytest
from openai_frontend_support import assert_error

TEXTS = ["The quick brown fox jumps over the lazy dog.", "Café, naïve, Zürich; 東京 🙂", "def add(a, b):\n    return a"]


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(http, tiny, text):
    tokenized = http.post("/tokenize", json={"prompt": text}).json()
    assert tokenized["tokens"] == tiny.tokenizer.encode(text)
    assert tokenized["count"] == len(tokenized["tokens"])
    assert tokenized["max_model_len"] == 512
    assert tokenized["token_strs"] is None
    assert http.post("/detokenize", json={"tokens": tokenized["tokens"]}).json() == {"prompt": text}


def test_token_strs(http, tiny):
    tokenized = http.post("/tokenize", json={"prompt": TEXTS[0], "return_token_strs": True}).json()
    assert tokenized["token_strs"] == tiny.tokenizer.convert_ids_to_tokens(tokenized["tokens"])
    assert len(tokenized["token_strs"]) == tokenized["count"]


def test_chat_form_is_the_chat_template_applied(http, tiny):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "The quick brown fox"}]
    tokenized = http.post("/tokenize", json={"messages": messages}).json()
    assert tokenized["tokens"] == tiny.chat_ids(messages)
    text = tiny.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert http.post("/detokenize", json={"tokens": tokenized["tokens"]}).json()["prompt"] == text
    without = http.post("/tokenize", json={"messages": messages, "add_generation_prompt": False}).json()
    expected = tiny.tokenizer.apply_chat_template(messages, add_generation_prompt=False, tokenize=False)
    assert without["tokens"] == tiny.tokenizer.encode(expected, add_special_tokens=False)
    assert without["count"] < tokenized["count"]


def test_chat_form_equals_the_chat_prompt(http):
    messages = [{"role": "user", "content": "Continuous batching?"}]
    tokens = http.post("/tokenize", json={"messages": messages}).json()["tokens"]
    chat = http.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 1, "return_token_ids": True})
    assert chat.json()["prompt_token_ids"] == tokens
    assert chat.json()["usage"]["prompt_tokens"] == len(tokens)


def test_model_name_accepted(http, tiny):
    assert http.post("/tokenize", json={"model": tiny.name, "prompt": "x"}).status_code == 200
    assert http.post("/detokenize", json={"model": tiny.name, "tokens": [5]}).status_code == 200


def test_bad_detokenize(http):
    assert_error(http.post("/detokenize", json={"tokens": [-1]}), 400, param="tokens")
    assert_error(http.post("/detokenize", json={"tokens": "abc"}), 400)


def test_tokenizer_info_is_off_without_its_flag(http):
    assert http.get("/tokenizer_info").status_code == 404
