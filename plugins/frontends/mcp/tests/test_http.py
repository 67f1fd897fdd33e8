"""The MCP front-end over streamable HTTP at /mcp on a live ``llmp serve``, checked against the OpenAI routes."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from mcp_frontend_support import AUTH, MAX_TOKENS, MESSAGES, PROMPT, run_client, server_model, text_of

from llmp.testing import LiveServer


def http_target(server: LiveServer, headers: dict[str, str] | None = AUTH) -> Any:
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    client = httpx2.AsyncClient(headers=headers or {}, timeout=httpx2.Timeout(30, read=120))
    return streamable_http_client(f"{server.url}/mcp", http_client=client)


def call(server: LiveServer, name: str, arguments: dict[str, Any]) -> Any:
    return run_client(http_target(server), lambda c: c.call_tool(name, arguments))


def test_lists_the_tools(server: LiveServer) -> None:
    async def work(client: Any) -> Any:
        return await client.list_tools()

    tools = {t.name: t for t in run_client(http_target(server), work).tools}
    assert sorted(tools) == ["chat", "generate", "tokenize"]
    sampling = {"max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "model"}
    assert set(tools["generate"].input_schema["properties"]) == {"prompt", *sampling}
    assert set(tools["chat"].input_schema["properties"]) == {"messages", *sampling}
    assert all(tool.input_schema["additionalProperties"] is False for tool in tools.values())
    assert tools["generate"].input_schema["required"] == ["prompt"]
    assert tools["chat"].input_schema["required"] == ["messages"]


def test_generate_stop_string(server: LiveServer, expected_completion: str) -> None:
    stop = expected_completion[len(expected_completion) // 2 :][:2]
    cut = expected_completion.index(stop)
    result = call(server, "generate", {"prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0, "stop": [stop]})
    assert not result.is_error, result
    assert text_of(result) == expected_completion[:cut]


def test_sampling_arguments_are_applied(server: LiveServer, expected_completion: str) -> None:
    # top_k 1 (or a tiny top_p) at temperature 1 is greedy; a seed gives the OpenAI route's seeded text
    base = {"prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 1}
    assert text_of(call(server, "generate", {**base, "top_k": 1})) == expected_completion
    assert text_of(call(server, "generate", {**base, "top_p": 1e-6})) == expected_completion
    response = httpx.post(
        f"{server.url}/v1/completions",
        headers=AUTH,
        timeout=60,
        json={"model": server_model(server), **base, "seed": 7},
    )
    assert response.status_code == 200, response.text
    seeded = response.json()["choices"][0]["text"]
    assert text_of(call(server, "generate", {**base, "seed": 7})) == seeded
    assert text_of(call(server, "chat", {"messages": MESSAGES, "max_tokens": MAX_TOKENS, "top_k": 1})) == text_of(
        call(server, "chat", {"messages": MESSAGES, "max_tokens": MAX_TOKENS, "temperature": 0})
    )


def test_chat_matches_openai_chat_completions(server: LiveServer) -> None:
    response = httpx.post(
        f"{server.url}/v1/chat/completions",
        headers=AUTH,
        timeout=60,
        json={"model": server_model(server), "messages": MESSAGES, "max_tokens": MAX_TOKENS, "temperature": 0},
    )
    assert response.status_code == 200, response.text
    expected = response.json()["choices"][0]["message"]["content"]
    result = call(server, "chat", {"messages": MESSAGES, "max_tokens": MAX_TOKENS, "temperature": 0})
    assert not result.is_error, result
    assert text_of(result) == expected
    assert expected


def test_tokenize_matches_openai_tokenize(server: LiveServer) -> None:
    text = "Café, naïve, Zürich: the quick brown fox."
    response = httpx.post(
        f"{server.url}/tokenize", headers=AUTH, timeout=30, json={"model": server_model(server), "prompt": text}
    )
    assert response.status_code == 200, response.text
    expected = response.json()["tokens"]
    result = call(server, "tokenize", {"text": text})
    assert not result.is_error, result
    assert result.structured_content == {"tokens": expected, "count": len(expected), "max_model_len": 512}
    assert json.loads(text_of(result))["tokens"] == expected


def test_models_resource(server: LiveServer) -> None:
    name = server_model(server)

    async def work(client: Any) -> Any:
        listed = await client.list_resources()
        models = await client.read_resource("llmp://models")
        one = await client.read_resource(f"llmp://models/{name}")
        try:
            await client.read_resource("llmp://models/nope")
        except Exception as exc:  # the SDK's McpError, carrying the JSON-RPC error
            missing = exc
        return listed, models, one, missing

    listed, models, one, missing = run_client(http_target(server), work)
    # an unknown model is the SDK's resource-not-found (invalid params), not an internal error
    assert missing.error.code == -32602 and "'nope' is not served here" in missing.error.message
    assert [str(r.uri) for r in listed.resources] == ["llmp://models"]
    data = json.loads(models.contents[0].text)
    assert data["models"] == [
        {"name": name, "max_model_len": 512, "task": "generate", "root": data["models"][0]["root"], "vocab_size": 512}
    ]
    assert json.loads(one.contents[0].text)["name"] == name


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"prompt": PROMPT, "temperature": -1}, "temperature"),
        ({"prompt": PROMPT, "max_tokens": 100000}, "max_tokens=100000 cannot be greater than max_model_len=512"),
        ({"prompt": ""}, "prompt must not hold an empty string"),
        ({"prompt": PROMPT, "stop": [""]}, "stop strings must not be empty"),
        ({"prompt": PROMPT, "temprature": 0}, "temprature"),  # a typo is refused, not ignored
        ({"prompt": PROMPT, "max_tokens": "5"}, "max_tokens"),  # a wrong type is refused, not coerced
        ({"prompt": PROMPT, "top_p": 0}, "top_p"),
    ],
)
def test_bad_arguments_are_tool_errors(server: LiveServer, arguments: dict, message: str) -> None:
    result = call(server, "generate", arguments)
    assert result.is_error
    assert message in text_of(result)


def test_errors_do_not_break_the_server(server: LiveServer, expected_completion: str) -> None:
    async def work(client: Any) -> Any:
        bad = await client.call_tool("chat", {"messages": [], "max_tokens": 2})
        good = await client.call_tool("generate", {"prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0})
        return bad, good

    bad, good = run_client(http_target(server), work)
    assert bad.is_error and "messages" in text_of(bad)
    assert text_of(good) == expected_completion


def test_api_key_guards_mcp(server: LiveServer) -> None:
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    }
    headers = {"Accept": "application/json, text/event-stream"}
    refused = httpx.post(f"{server.url}/mcp", json=init, headers=headers, timeout=30)
    assert refused.status_code == 401, refused.text
    wrong = httpx.post(f"{server.url}/mcp", json=init, headers={**headers, "Authorization": "Bearer nope"}, timeout=30)
    assert wrong.status_code == 401
    accepted = httpx.post(f"{server.url}/mcp", json=init, headers={**headers, **AUTH}, timeout=30)
    assert accepted.status_code == 200, accepted.text
    assert accepted.json()["result"]["serverInfo"]["name"] == "llmp"
    try:  # the SDK client cannot even connect without the key
        run_client(http_target(server, headers=None), lambda c: c.list_tools())
    except BaseException as exc:  # noqa: BLE001 (the SDK wraps it in exception groups)
        from mcp.shared.exceptions import MCPError

        assert any(isinstance(e, MCPError) for e in leaves(exc)), repr(exc)
    else:
        raise AssertionError("the MCP client connected without the API key")


def leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in leaves(inner)]
    return [exc]
