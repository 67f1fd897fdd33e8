"""One URL convention for every client command (`llmp chat`, `llmp complete`, `llmp bench serve`):
`--url` takes the server with or without `/v1` (and a trailing slash), against a real `llmp serve`;
a wrong path, a server that is not running and a URL that is none each say what to try."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from llmp.testing import LiveServer, free_port, run_llmp, save_tiny_llama, serving

NO_KEY = {"OPENAI_API_KEY": ""}
SHORT = ("--max-tokens", "3", "--temperature", "0")
BENCH = ("--num-prompts", "2", "--input-len", "4", "--output-len", "2", "--json")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    model_dir = tmp_path_factory.mktemp("tiny-llama")
    save_tiny_llama(model_dir)
    with serving(model_dir) as live:
        yield live


@pytest.fixture(scope="module")
def expected(server: LiveServer) -> dict[str, str]:
    """The replies of the quick clients, asked of the server directly."""
    import httpx

    model = httpx.get(f"{server.api_url}/models").json()["data"][0]["id"]
    body = {"model": model, "max_tokens": 3, "temperature": 0.0}
    text = httpx.post(f"{server.api_url}/completions", json={**body, "prompt": "Hello"}, timeout=60).json()
    messages = [{"role": "user", "content": "Hello"}]
    reply = httpx.post(f"{server.api_url}/chat/completions", json={**body, "messages": messages}, timeout=60).json()
    return {"complete": text["choices"][0]["text"], "chat": reply["choices"][0]["message"]["content"]}


FORMS = ("{root}", "{root}/", "{root}/v1", "{root}/v1/", "127.0.0.1:{port}")


@pytest.mark.parametrize("form", FORMS)
def test_every_client_takes_every_form_of_the_url(server: LiveServer, expected: dict[str, str], form: str) -> None:
    url = form.format(root=server.url, port=server.port)
    for command in ("complete", "chat"):
        out = run_llmp(command, "--url", url, *SHORT, "-q", "Hello", env=NO_KEY)
        assert out.stdout == expected[command] + "\n", command
    report = json.loads(run_llmp("bench", "serve", "--url", url, *BENCH, env=NO_KEY).stdout)
    assert report["successful"] == 2 and report["failed"] == 0


@pytest.mark.parametrize("endpoint", ["/v1/chat/completions", "/chat/completions", "completions"])
def test_bench_endpoints_with_or_without_v1_and_the_vllm_flag_name(server: LiveServer, endpoint: str) -> None:
    args = ("--base-url", f"{server.url}/v1", "--endpoint", endpoint, *BENCH)  # --base-url: vLLM's name
    report = json.loads(run_llmp("bench", "serve", *args, env=NO_KEY).stdout)
    assert report["successful"] == 2 and report["endpoint"] == endpoint


def one_error_line(args: tuple[str, ...], status: int = 1) -> str:
    result = run_llmp(*args, env=NO_KEY, check=False)
    assert result.returncode == status, result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("llmp: error: "), result.stderr
    return lines[0]


CLIENTS = (("chat", "-q", "hi"), ("complete", "-q", "hi"), ("bench", "serve"))


@pytest.mark.parametrize("client", CLIENTS, ids=lambda c: c[0])
def test_a_404_names_the_url_tried_and_what_to_try(server: LiveServer, client: tuple[str, ...]) -> None:
    line = one_error_line((*client, "--url", f"{server.url}/not-here"))
    assert f"HTTP 404 from {server.url}/not-here/v1/models" in line
    assert f"no OpenAI API answers under {server.url}/not-here/v1" in line and "check --url" in line


def test_an_unknown_model_says_where_the_served_models_are_listed(server: LiveServer) -> None:
    line = one_error_line(("chat", "--url", server.url, "--model", "no-such-model", "-q", "hi"))
    assert "no-such-model" in line and f"GET {server.url}/v1/models lists the models" in line and "--model" in line


@pytest.mark.parametrize("client", CLIENTS, ids=lambda c: c[0])
def test_no_server_running_says_so_and_how_to_start_one(client: tuple[str, ...]) -> None:
    root = f"http://127.0.0.1:{free_port()}"
    line = one_error_line((*client, "--url", root))
    assert f"cannot connect to {root}/v1/models: Connection refused: no server is running at {root}" in line
    assert "llmp serve MODEL" in line


@pytest.mark.parametrize("client", CLIENTS, ids=lambda c: c[0])
def test_a_url_that_is_no_server_address_is_a_usage_error(client: tuple[str, ...]) -> None:
    line = one_error_line((*client, "--url", "ftp://example.org"), status=2)
    assert "'ftp://example.org' is not a server address" in line


BAD_URLS = {  # --url: why it names no server
    "http://127.0.0.1:99999": "the port must be a number from 1 to 65535",
    "http://127.0.0.1:0": "the port must be a number from 1 to 65535",
    "http://127.0.0.1:abc": "the port must be a number from 1 to 65535",
    "http://[::1": "IPv6",
    "http://:8200": "no host",
    "": "it is empty",
    "http://127.0.0.1:8000/v1?key=x": "?query",
}


@pytest.mark.parametrize("client", CLIENTS, ids=lambda c: c[0])
def test_every_bad_url_is_one_line_and_a_usage_error_before_anything_is_sent(client: tuple[str, ...]) -> None:
    for url, why in BAD_URLS.items():
        started = time.monotonic()
        line = one_error_line((*client, "--url", url), status=2)
        assert line.startswith(f"llmp: error: --url {url!r} is not a server address (") and why in line, line
        assert time.monotonic() - started < 30  # refused up front, not after a connection attempt


@pytest.mark.parametrize("command", ["chat", "complete"])
def test_a_local_model_and_a_server_are_one_or_the_other(command: str) -> None:
    for server_option in (("--url", "http://127.0.0.1:8000"), ("--model", "name")):
        line = one_error_line((command, "some-model-dir", *server_option, "-q", "hi"), status=2)
        assert "MODEL runs a model in this process" in line and server_option[0] in line


def test_a_server_still_loading_is_waited_for_then_its_models_listed() -> None:
    # `llmp chat`/`bench serve` right after `llmp serve &`: the 503s of a server still loading are waited
    # out (as `ollama run` waits), with one notice; any other failure, or waiting longer than asked, is not
    import asyncio
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import httpx

    from llmp.cli.sse import ServerError, served_models

    statuses = [503, 503, 200]
    message = ["the model is warming up"]

    class Loading(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            status = statuses.pop(0) if len(statuses) > 1 else statuses[0]
            loading = {"error": {"message": message[0], "code": 503}}
            body = json.dumps(loading if status == 503 else {"object": "list", "data": [{"id": "tiny"}]}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Loading)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_port}/v1/models"

    async def listed(wait_s: float) -> list[str]:
        async with httpx.AsyncClient() as client:
            return await served_models(client, url, None, wait_s=wait_s)

    try:
        assert asyncio.run(listed(30)) == ["tiny"] and statuses == [200]
        statuses[:] = [503, 503, 503]
        with pytest.raises(ServerError, match="HTTP 503.*warming up") as caught:
            asyncio.run(listed(0))  # no wait asked: the first 503 is the answer
        assert caught.value.status == 503
        message[0] = "the server is shutting down"  # not starting: no wait, however long one is allowed
        started = time.monotonic()
        with pytest.raises(ServerError, match="shutting down"):
            asyncio.run(listed(30))
        assert time.monotonic() - started < 5
    finally:
        httpd.shutdown()
