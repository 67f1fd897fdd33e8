"""`llmp chat` and `llmp complete` as real subprocesses against a real `llmp serve` of a tiny model.

The server requires an API key, so the same server also checks authentication;
the other tests pass the key through `LLMP_API_KEY`, the settings pattern.
Expected replies come from non-streamed requests to the same server at
temperature 0, sent with httpx directly.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmp.testing import LiveServer, free_port, run_llmp, save_tiny_llama, serving

KEY = "secret"
WITH_KEY = {"LLMP_API_KEY": KEY, "OPENAI_API_KEY": ""}  # an inherited OpenAI key must not leak in
MAX_TOKENS = "6"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    model_dir = tmp_path_factory.mktemp("tiny-llama")
    save_tiny_llama(model_dir)
    with serving(model_dir, "--api-key", KEY) as live:
        yield live


def unstreamed(server: LiveServer, path: str, **body: Any) -> str:
    """The reply of a non-streamed request at temperature 0, sent with httpx directly."""
    import httpx

    model = httpx.get(f"{server.api_url}/models", headers={"Authorization": f"Bearer {KEY}"}).json()["data"][0]["id"]
    response = httpx.post(
        f"{server.api_url}/{path}",
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=60,
        json={"model": model, "max_tokens": int(MAX_TOKENS), "temperature": 0.0, **body},
    )
    response.raise_for_status()
    choice = response.json()["choices"][0]
    return choice["message"]["content"] if "message" in choice else choice["text"]


def llmp_with_stdin(*args: str, stdin: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`python -m llmp ARGS` fed ``stdin``, with no inherited LLMP_* variables (like `run_llmp`)."""
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("LLMP_")} | env
    return subprocess.run(
        [sys.executable, "-m", "llmp", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=child_env,
        timeout=120,
        check=False,
    )


def assert_one_line_error(result: subprocess.CompletedProcess[str], *fragments: str, status: int = 1) -> None:
    assert result.returncode == status, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("llmp: error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0]


def test_complete_quick_prints_the_streamed_completion(server: LiveServer) -> None:
    prompt = "The quick brown fox"
    out = run_llmp(
        "complete",
        "--url",
        server.api_url,
        "--max-tokens",
        MAX_TOKENS,
        "--temperature",
        "0",
        "-q",
        prompt,
        env=WITH_KEY,
    )
    assert out.stdout == unstreamed(server, "completions", prompt=prompt) + "\n"


def test_chat_quick_prints_the_streamed_reply_to_system_and_user(server: LiveServer) -> None:
    out = run_llmp(
        "chat",
        "--url",
        server.api_url,
        "--max-tokens",
        MAX_TOKENS,
        "--temperature",
        "0",
        "--system-prompt",
        "Be brief.",
        "--quick",
        "Paged attention?",
        env=WITH_KEY,
    )
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Paged attention?"}]
    assert out.stdout == unstreamed(server, "chat/completions", messages=messages) + "\n"


def test_chat_repl_keeps_the_history_and_stops_at_exit(server: LiveServer) -> None:
    result = llmp_with_stdin(
        "chat",
        "--url",
        server.api_url,
        "--max-tokens",
        MAX_TOKENS,
        "--temperature",
        "0",
        stdin="Hello there\nWhat did I say?\nexit\nnot sent\n",
        env=WITH_KEY,
    )
    assert result.returncode == 0, result.stderr
    first = [{"role": "user", "content": "Hello there"}]
    reply1 = unstreamed(server, "chat/completions", messages=first)
    second = [*first, {"role": "assistant", "content": reply1}, {"role": "user", "content": "What did I say?"}]
    reply2 = unstreamed(server, "chat/completions", messages=second)
    assert result.stdout == f"{reply1}\n{reply2}\n"
    assert reply2 != unstreamed(server, "chat/completions", messages=second[-1:])  # the history made a difference


def test_complete_repl_completes_each_line_on_its_own(server: LiveServer) -> None:
    result = llmp_with_stdin(
        "complete",
        "--url",
        server.api_url,
        "--max-tokens",
        MAX_TOKENS,
        "--temperature",
        "0",
        stdin="Continuous batching\n\nThe KV cache\n",
        env=WITH_KEY,
    )
    assert result.returncode == 0, result.stderr
    expected = [unstreamed(server, "completions", prompt=p) for p in ("Continuous batching", "The KV cache")]
    assert result.stdout == "".join(f"{text}\n" for text in expected)


def test_a_bad_request_spoils_one_turn_not_the_session(server: LiveServer) -> None:
    too_long = " ".join(["word"] * 5000)  # far past the tiny model's 512 positions
    result = llmp_with_stdin(
        "complete",
        "--url",
        server.api_url,
        "--max-tokens",
        MAX_TOKENS,
        "--temperature",
        "0",
        stdin=f"{too_long}\nThe KV cache\n",
        env=WITH_KEY,
    )
    assert result.returncode == 1, result.stderr  # piped: the next line still runs, the status tells a script
    assert result.stderr.startswith("llmp: error: HTTP 400 from ") and "Traceback" not in result.stderr
    assert result.stdout == unstreamed(server, "completions", prompt="The KV cache") + "\n"


def test_a_wrong_url_is_one_line_and_a_failure() -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    for command in ("chat", "complete"):
        result = run_llmp(command, "--url", url, "-q", "hi", check=False)
        assert_one_line_error(result, "cannot connect to", "Connection refused")
        assert result.stdout == ""


def test_an_unknown_model_is_one_line_and_a_failure(server: LiveServer) -> None:
    result = run_llmp(
        "chat", "--url", server.api_url, "--model", "no-such-model", "-q", "hi", env=WITH_KEY, check=False
    )
    assert_one_line_error(result, "HTTP 404 from", "no-such-model")


def test_the_api_key_is_sent_as_a_bearer_token(server: LiveServer) -> None:
    keyed = run_llmp(
        "chat",
        "--url",
        server.api_url,
        "--api-key",
        KEY,
        "--max-tokens",
        MAX_TOKENS,
        "-q",
        "hi",
        env={"OPENAI_API_KEY": ""},
    )
    assert keyed.stdout.strip()
    from_openai_variable = run_llmp(
        "complete", "--url", server.api_url, "--max-tokens", MAX_TOKENS, "-q", "hi", env={"OPENAI_API_KEY": KEY}
    )
    assert from_openai_variable.stdout.strip()
    for extra in ((), ("--model", "anything")):  # refused at GET /models, and at the chat request itself
        refused = run_llmp("chat", "--url", server.api_url, *extra, "-q", "hi", env={"OPENAI_API_KEY": ""}, check=False)
        assert_one_line_error(refused, "HTTP 401 from")
    wrong = run_llmp("chat", "--url", server.api_url, "--api-key", "nope", "-q", "hi", check=False)
    assert_one_line_error(wrong, "HTTP 401 from")


def test_options_come_from_a_config_file(server: LiveServer, tmp_path: Path) -> None:
    config = tmp_path / "client.yaml"
    config.write_text(f"url: {server.api_url}\nmax-tokens: {MAX_TOKENS}\ntemperature: 0\napi-key: {KEY}\n")
    out = run_llmp("complete", "--config", str(config), "-q", "The quick brown fox", env={"OPENAI_API_KEY": ""})
    assert out.stdout == unstreamed(server, "completions", prompt="The quick brown fox") + "\n"
    bad = run_llmp("chat", "--max-tokens", "0", "-q", "hi", check=False)
    assert bad.returncode == 2 and "--max-tokens" in bad.stderr


@pytest.mark.parametrize("command", ["chat", "complete"])
def test_an_empty_quick_message_is_a_usage_error(command: str) -> None:
    for empty in ("", "  "):
        result = run_llmp(command, "--url", f"http://127.0.0.1:{free_port()}", "-q", empty, check=False)
        assert_one_line_error(result, "-q needs text to send", status=2)


def test_a_local_model_that_cannot_be_run_is_a_usage_error_before_any_engine_starts(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    cases = {
        "/nonexistent": "model '/nonexistent' not found",
        str(empty): "holds no config.json",
        "no-such-org/no-such-model": "is not on this machine",
        "sentence-transformers/all-MiniLM-L6-v2": "chat and complete need a model that generates text",
    }
    for command in ("chat", "complete"):
        for model, why in cases.items():
            result = run_llmp(command, model, "-q", "hi", check=False)
            assert_one_line_error(result, f"cannot run {model}: ", why, status=2)
            assert result.stdout == ""
