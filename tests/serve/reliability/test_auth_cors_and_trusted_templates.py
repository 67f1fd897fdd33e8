"""A locked-down server (cases 4 with 429, 19, 21 trusted, 24 with an allowed origin, and --request-timeout):
every front-end mounted (openai, anthropic, sagemaker, mcp over HTTP, grpc on its own port),
``--api-key`` on every route and RPC that reaches the model, CORS for one origin, request chat templates
trusted but still sandboxed, overload answered 429 (529 on Anthropic's paths), and requests cut off
after 8 s.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from reliability_support import (
    EVIL_ORIGIN,
    KEY,
    LONG,
    OK_ORIGIN,
    StreamReader,
    anthropic_body,
    burst,
    chat_body,
    check_anthropic_error,
    check_refusal,
    data_lines,
    metric,
    scrape,
    wait_idle,
)

from llmp.testing import LiveServer, assert_openai_error, free_port, serving

AUTH = {"Authorization": f"Bearer {KEY}"}
OPEN_PATHS = {
    "/health",
    "/ready",
    "/live",
    "/ping",
    "/version",
    "/metrics",
    "/load",
    "/docs",
    "/redoc",
    "/openapi.json",
    "/docs/oauth2-redirect",
}
REQUEST_TIMEOUT = 8


@pytest.fixture(scope="module")
def locked_server(tiny_model) -> Iterator[LiveServer]:
    grpc_port = free_port()
    frontends = [arg for name in ("openai", "anthropic", "sagemaker", "mcp", "grpc") for arg in ("--frontend", name)]
    with serving(
        tiny_model,
        "--dtype",
        "float32",
        "--api-key",
        KEY,
        "--overload-status",
        "429",
        "--max-num-seqs",
        "4",
        "--max-queue-len",
        "4",
        "--allowed-origins",
        OK_ORIGIN,
        "--trust-request-chat-template",
        "--request-timeout",
        str(REQUEST_TIMEOUT),
        *frontends,
        "--grpc-port",
        str(grpc_port),
    ) as live:
        live.grpc_port = grpc_port  # type: ignore[attr-defined]
        yield live
        assert live.process.poll() is None, f"the server died during the tests:\n{live.log()[-5000:]}"


@pytest.fixture(scope="module")
def routes(locked_server) -> list[tuple[str, str]]:
    """Every (method, path) of the server's own OpenAPI schema that is not a probe or the docs, path
    parameters filled in, plus an unknown route (which must not tell a caller without a key it is unknown)."""
    paths = httpx.get(f"{locked_server.url}/openapi.json", timeout=30).json()["paths"]
    found = [
        (method.upper(), path.replace("{response_id}", "resp_0"))
        for path, ops in paths.items()
        for method in ops
        if path not in OPEN_PATHS
    ]
    for route in (
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/completions"),
        ("POST", "/v1/messages"),
        ("POST", "/invocations"),
    ):
        assert route in found, found
    # MCP's streamable HTTP endpoint is not in the schema
    return [*found, ("POST", "/mcp"), ("POST", "/mcp/"), ("GET", "/v1/no-such-route"), ("POST", "/v1/no-such-route")]


BAD_CREDENTIALS = {
    "none": {},
    "wrong-key": {"Authorization": "Bearer not-the-key"},
    "lower-cased-key": {"Authorization": f"Bearer {KEY.lower()}"},
    "upper-cased-key": {"Authorization": f"Bearer {KEY.upper()}"},
    "key-without-scheme": {"Authorization": KEY},
    "basic-scheme": {"Authorization": f"Basic {KEY}"},
    "token-scheme": {"Authorization": f"Token {KEY}"},
    "bearer-without-key": {"Authorization": "Bearer"},
    "bearer-twice": {"Authorization": f"Bearer Bearer {KEY}"},
    "key-prefix": {"Authorization": f"Bearer {KEY[:-1]}"},
    "key-plus-one": {"Authorization": f"Bearer {KEY}x"},
    "two-keys": {"Authorization": f"Bearer {KEY},{KEY}"},
    "wrong-x-api-key": {"x-api-key": "not-the-key"},
    "cookie": {"Cookie": f"api_key={KEY}"},
}


@pytest.mark.parametrize("credentials", list(BAD_CREDENTIALS), ids=list(BAD_CREDENTIALS))
def test_every_inference_route_refuses_a_missing_or_wrong_key(locked_server, routes, credentials):
    headers = BAD_CREDENTIALS[credentials]
    with httpx.Client(base_url=locked_server.url, timeout=30) as client:
        for method, path in routes:
            response = client.request(method, path, json={} if method == "POST" else None, headers=headers)
            if path.startswith("/v1/messages"):  # the Anthropic front-end's own error shape
                check_anthropic_error(response, 401, "authentication_error")
            elif path.startswith("/mcp"):  # MCP's: a JSON-RPC error of no request
                assert response.status_code == 401, (path, response.text)
                body = response.json()
                assert body["id"] is None and body["error"]["code"] == -32600, (path, body)
                assert "API key" in body["error"]["message"], (path, body)
            else:
                error = assert_openai_error(response, 401)
                assert error["type"] == "authentication_error" and error["code"] == "invalid_api_key", (path, error)
            assert response.headers["www-authenticate"] == "Bearer", (path, response.headers)
        # a key in the query string is not a key either
        response = client.get("/v1/models", params={"api_key": KEY, "key": KEY}, headers=headers)
        assert response.status_code == 401


def test_the_right_key_opens_every_route(locked_server, routes, tiny_model):
    with httpx.Client(base_url=locked_server.url, timeout=60) as client:
        for method, path in routes:
            response = client.request(method, path, json={} if method == "POST" else None, headers=AUTH)
            assert response.status_code not in (401, 403) and response.status_code < 500, (path, response.text)
        # Anthropic's clients send the key in x-api-key
        response = client.post(
            "/v1/messages", json=anthropic_body(tiny_model, max_tokens=1), headers={"x-api-key": KEY}
        )
        assert response.status_code == 200, response.text


@pytest.fixture(scope="module")
def grpc_stub(locked_server) -> Iterator[Any]:
    import grpc
    from llmp_frontend_grpc import llmp_pb2_grpc

    with grpc.insecure_channel(f"127.0.0.1:{locked_server.grpc_port}") as channel:
        grpc.channel_ready_future(channel).result(timeout=30)  # the port opens a moment after /health
        yield llmp_pb2_grpc.LlmpStub(channel)


@pytest.mark.parametrize("credentials", list(BAD_CREDENTIALS), ids=list(BAD_CREDENTIALS))
def test_every_grpc_call_but_health_refuses_a_missing_or_wrong_key(grpc_stub, credentials):
    import grpc
    from llmp_frontend_grpc import llmp_pb2 as pb

    metadata = [(k.lower(), v) for k, v in BAD_CREDENTIALS[credentials].items()] or None
    calls = [
        (grpc_stub.Generate, pb.GenerateRequest(text="hi", max_tokens=1)),
        (grpc_stub.Tokenize, pb.TokenizeRequest(text="hi")),
        (grpc_stub.ListModels, pb.ListModelsRequest()),
        (lambda *a, **k: list(grpc_stub.GenerateStream(*a, **k)), pb.GenerateRequest(text="hi", max_tokens=1)),
    ]
    for call, request in calls:
        with pytest.raises(grpc.RpcError) as refused:
            call(request, metadata=metadata, timeout=30)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED, (request, refused.value.details())
    assert grpc_stub.Health(pb.HealthRequest(), metadata=metadata, timeout=30).status == pb.HealthResponse.SERVING
    reply = grpc_stub.Generate(
        pb.GenerateRequest(text="hi", max_tokens=1), metadata=[("authorization", f"Bearer {KEY}")], timeout=60
    )
    assert len(reply.token_ids) == 1


@pytest.mark.parametrize("path", sorted(OPEN_PATHS - {"/docs/oauth2-redirect", "/redoc"}))
def test_probes_metrics_and_docs_need_no_key(locked_server, path):
    assert httpx.get(f"{locked_server.url}{path}", timeout=30).status_code == 200


def test_the_key_never_appears_in_the_log(locked_server):
    marker = "Wrong-Key-Marker-0123"
    with httpx.Client(base_url=locked_server.url, timeout=60) as client:
        assert client.post("/v1/completions", json={"prompt": "x", "max_tokens": 1}, headers=AUTH).status_code == 200
        assert client.get("/v1/models", headers={"Authorization": f"Bearer {marker}"}).status_code == 401
        assert (
            client.post("/v1/chat/completions", json=chat_body(max_tokens=1), headers={"x-api-key": marker}).status_code
            == 401
        )
    # request lines whose URL carries a query string are left out: a client putting its key in the
    # URL (the matrix above checks such a key is refused) writes it into every access log on its way
    log = "\n".join(line for line in locked_server.log().splitlines() if not re.search(r'"[A-Z]+ \S*\?', line))
    assert KEY not in log and KEY.lower() not in log and marker not in log
    assert "Bearer" not in log


# -- case 24: CORS with one allowed origin ----------------------------------------------------------------


def preflight(url: str, origin: str) -> httpx.Response:
    return httpx.options(
        f"{url}/v1/chat/completions",
        timeout=30,
        headers={
            "Origin": origin,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type",
        },
    )


def test_the_allowed_origin_passes_preflight_without_a_key_and_no_other_does(locked_server):
    ok = preflight(locked_server.url, OK_ORIGIN)
    assert ok.status_code == 200, ok.text
    assert ok.headers["access-control-allow-origin"] == OK_ORIGIN
    assert "POST" in ok.headers["access-control-allow-methods"]
    assert "authorization" in ok.headers["access-control-allow-headers"].lower()
    assert "access-control-allow-credentials" not in ok.headers  # --allow-credentials is off
    for origin in (EVIL_ORIGIN, "https://ok.example.evil.example", "http://ok.example", "null"):
        refused = preflight(locked_server.url, origin)
        assert "access-control-allow-origin" not in refused.headers, (origin, dict(refused.headers))
        assert refused.status_code >= 400


def test_actual_requests_carry_cors_headers_for_the_allowed_origin_only(locked_server):
    url = locked_server.url
    allowed = httpx.post(
        f"{url}/v1/completions",
        json={"prompt": "x", "max_tokens": 1},
        headers={**AUTH, "Origin": OK_ORIGIN},
        timeout=60,
    )
    assert allowed.status_code == 200 and allowed.headers["access-control-allow-origin"] == OK_ORIGIN
    # a refusal is readable by the allowed page too (it can tell the user the key is wrong)
    refused = httpx.get(f"{url}/v1/models", headers={"Origin": OK_ORIGIN}, timeout=30)
    assert refused.status_code == 401 and refused.headers["access-control-allow-origin"] == OK_ORIGIN
    evil = httpx.get(f"{url}/v1/models", headers={**AUTH, "Origin": EVIL_ORIGIN}, timeout=30)
    assert evil.status_code == 200
    assert "access-control-allow-origin" not in evil.headers, dict(evil.headers)
    assert "access-control-allow-credentials" not in evil.headers, dict(evil.headers)


# -- case 21 (trusted): the sandbox still holds --------------------------------------------------------------


def escapes(marker: Path) -> list[str]:
    return [
        "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
        f"{{{{ cycler.__init__.__globals__.os.popen('touch {marker}').read() }}}}",
        f"{{{{ joiner.__init__.__globals__.os.system('touch {marker}') }}}}",
        f"{{{{ namespace.__init__.__globals__.os.system('touch {marker}') }}}}",
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ self.__init__.__globals__.__builtins__ }}",
        "{{ messages.__class__.__base__.__subclasses__() }}",
        f"{{{{ lipsum.__globals__['os'].popen('touch {marker}').read() }}}}",
        "{% for x in range(10**9) %}{% endfor %}",
        "{{ raise_exception('refused by the template') }}",
        "{% if %}",
    ]


def test_a_trusted_request_template_cannot_escape_the_sandbox(locked_server, tmp_path):
    marker = tmp_path / "escaped"
    with httpx.Client(base_url=locked_server.url, timeout=60, headers=AUTH) as client:
        for template in escapes(marker):
            for route in ("/v1/chat/completions", "/tokenize"):
                response = client.post(route, json=chat_body(max_tokens=1, chat_template=template))
                assert response.status_code == 400, (template, response.text)
                error = assert_openai_error(response, 400, contains="chat template")
                assert "uid=" not in error["message"]
        assert not marker.exists(), "a request's chat template ran a command"
        # a harmless trusted template is used as given
        response = client.post(
            "/tokenize",
            json={"messages": [{"role": "user", "content": "hi"}], "chat_template": "{{ messages[0]['content'] }}"},
        )
        plain = client.post("/tokenize", json={"prompt": "hi", "add_special_tokens": False})
        assert response.status_code == 200 and response.json()["tokens"] == plain.json()["tokens"]
    assert httpx.get(f"{locked_server.url}/ready", timeout=30).status_code == 200


def test_trusted_template_kwargs_cannot_override_the_renderers_own_arguments(locked_server):
    messages = [{"role": "user", "content": "hi"}]
    overrides = {
        "tokenize": True,
        "return_dict": True,
        "return_tensors": "pt",
        "add_generation_prompt": False,
        "continue_final_message": True,
        "messages": [],
        "conversation": [{"role": "x", "content": "y"}],
        "chat_template": "{{ 'replaced' }}",
        "tools": "x",
        "documents": "x",
    }
    with httpx.Client(base_url=locked_server.url, timeout=60, headers=AUTH) as client:
        plain = client.post("/tokenize", json={"messages": messages}).json()["tokens"]
        response = client.post("/tokenize", json={"messages": messages, "chat_template_kwargs": overrides})
        assert response.status_code == 200, response.text
        assert response.json()["tokens"] == plain
        chat = client.post(
            "/v1/chat/completions", json=chat_body(max_tokens=1, chat_template_kwargs=overrides, return_token_ids=True)
        )
        assert chat.status_code == 200, chat.text
        assert chat.json()["prompt_token_ids"] == plain


def test_a_template_that_loops_over_content_gets_text_parts(locked_server):
    """vLLM's --chat-template-content-format auto: a template iterating a message's content gets
    OpenAI's text parts (a text message becomes one), a template reading it as text gets the text."""
    loops = "{% for m in messages %}{{ m.role }}:{% for p in m['content'] %}[{{ p['text'] }}]{% endfor %};{% endfor %}"
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    with httpx.Client(base_url=locked_server.url, timeout=60, headers=AUTH) as client:

        def tokens(body: dict) -> list[int]:
            response = client.post("/tokenize", json=body)
            assert response.status_code == 200, response.text
            return response.json()["tokens"]

        def rendered(content: Any, template: str) -> list[int]:
            return tokens({"messages": [{"role": "user", "content": content}], "chat_template": template})

        assert rendered("hi", loops) == tokens({"prompt": "user:[hi];", "add_special_tokens": False})
        assert rendered(parts, loops) == tokens({"prompt": "user:[a][b];", "add_special_tokens": False})
        joined = tokens({"prompt": "a\nb", "add_special_tokens": False})
        assert rendered(parts, "{{ messages[0]['content'] }}") == joined
        # a part spelling a special token stays that text, and a part of its own
        [eos] = tokens({"prompt": "</s>", "add_special_tokens": False})
        spelled = rendered([{"type": "text", "text": "a</s>"}, {"type": "text", "text": "b"}], loops)
        text = client.post("/detokenize", json={"tokens": spelled}).json()["prompt"]
        assert eos not in spelled and text == "user:[a</s>][b];", (spelled, text)


# -- case 4 with --overload-status 429 ----------------------------------------------------------------------


def test_overload_is_429_with_retry_after_when_configured(locked_server, tiny_model):
    url = locked_server.url
    wait_idle(url)
    before = scrape(url)
    sent = 40
    result = burst(
        url,
        sent,
        headers=AUTH,
        probes=[("/v1/messages", anthropic_body(tiny_model)), ("/invocations", {"prompt": "x", "max_tokens": 1})],
    )
    print(
        f"\n[figure] overload 429: sent={sent} accepted={result.accepted} refused={len(result.refused)} "
        f"lost={len(result.lost)} slowest refusal={max(result.refusal_seconds, default=0):.2f} s"
    )
    assert not result.lost, result.lost
    assert result.accepted == 8 and len(result.refused) == sent - 8
    for response in [*result.refused, result.refused_while_full, result.probes[1]]:
        check_refusal(response, 429, "rate_limit_error")
    check_anthropic_error(result.probes[0], 529, "overloaded_error")  # Anthropic's overload, whatever the flag
    wait_idle(url)
    rejected = metric(scrape(url), "llmp_requests_rejected_total", reason="overloaded") - metric(
        before, "llmp_requests_rejected_total", reason="overloaded"
    )
    assert rejected == sent - 8 + 3


# -- --request-timeout ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def timeout_server(tiny_model) -> Iterator[LiveServer]:
    # a limit far below the time the long request needs on any machine (1500 tokens, eager steps: seconds; with
    # the CPU's decode traces the tiny model ran them in under a second)
    args = ("--dtype", "float32", "--enforce-eager", "--api-key", KEY, "--request-timeout", str(SHORT_TIMEOUT))
    with serving(tiny_model, *args) as live:
        yield live


SHORT_TIMEOUT = 0.5


def test_a_request_past_the_request_timeout_gets_408_and_is_aborted(timeout_server):
    url = timeout_server.url
    wait_idle(url)
    before = scrape(url)
    body = {"prompt": "The quick brown fox", "max_tokens": LONG, "ignore_eos": True}
    stream = StreamReader(url, "/v1/completions", {**body, "stream": True}, headers=AUTH, timeout=60)
    stream.start()
    started = time.monotonic()
    response = httpx.post(f"{url}/v1/completions", json=body, headers=AUTH, timeout=60)
    elapsed = time.monotonic() - started
    stream.join(60)
    error = assert_openai_error(response, 408, contains="--request-timeout")
    assert error["code"] == "request_timeout" and error["type"] == "timeout_error", error
    assert SHORT_TIMEOUT - 0.5 < elapsed < SHORT_TIMEOUT + 15, elapsed  # generous: CI machines are slow
    payloads = data_lines(stream.lines)
    assert stream.status == 200 and payloads and "[DONE]" not in payloads, payloads[-3:]
    last = json.loads(payloads[-1])
    assert last["error"]["code"] == "request_timeout", last
    idle = wait_idle(url, timeout=30)
    assert idle == {"running": 0, "waiting": 0, "kv": 0}
    after = scrape(url)
    assert metric(after, "llmp_request_timeout_total") - metric(before, "llmp_request_timeout_total") == 2
