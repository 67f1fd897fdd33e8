"""Fuzzing the live server: schemathesis over its own OpenAPI schema, and hypothesis throwing
arbitrary JSON at every route. No input may produce a 5xx or stop the server answering."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

from llmp.testing import LiveServer, save_tiny_llama, serving

FUZZ_SETTINGS = settings(max_examples=20, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    path: Path = tmp_path_factory.mktemp("fuzz-model")
    save_tiny_llama(path, max_position_embeddings=64)
    # small caps keep random requests cheap: every one is answered within seconds
    with serving(
        path,
        "--dtype",
        "float32",
        "--max-n",
        "4",
        "--max-logprobs",
        "5",
        "--request-timeout",
        "30",
        "--disable-access-log",
    ) as server:
        yield server


def schema_operations(url: str) -> list:
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    return [result.ok() for result in schema.get_all_operations()]


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_no_schema_driven_request_gets_a_server_error(fuzz_server, mode):
    # schemathesis' own pytest plugin does not support pytest 9 yet: drive its strategies with hypothesis
    operations = schema_operations(fuzz_server.url)
    assert any(op.path == "/v1/chat/completions" for op in operations)
    calls, unsatisfiable = 0, []
    for operation in operations:
        if mode is GenerationMode.NEGATIVE and operation.method.upper() != "POST":
            continue  # nothing to break in a GET without parameters

        @given(case=operation.as_strategy(generation_mode=mode))
        @FUZZ_SETTINGS
        def check(case) -> None:
            nonlocal calls
            calls += 1
            case.call_and_validate(base_url=fuzz_server.url, checks=[not_a_server_error], timeout=60)

        try:
            check()
        except Unsatisfiable:  # schemathesis found no way to make this body invalid
            unsatisfiable.append(operation.path)
    assert "/v1/chat/completions" not in unsatisfiable
    assert calls >= 5 * len([op for op in operations if op.method.upper() == "POST"])
    print(
        f"schemathesis ({mode.value}): {calls} requests over {len(operations)} operations, no 5xx"
        + (f"; no invalid bodies for {', '.join(unsatisfiable)}" if unsatisfiable else "")
    )


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=12,
)
FIELDS = [
    "model",
    "messages",
    "prompt",
    "input",
    "max_tokens",
    "n",
    "stream",
    "temperature",
    "top_p",
    "logprobs",
    "top_logprobs",
    "stop",
    "tools",
    "tool_choice",
    "response_format",
    "seed",
    "stream_options",
    "echo",
    "logit_bias",
    "prompt_logprobs",
    "chat_template_kwargs",
    "encoding_format",
    "tokens",
    "instructions",
]
ROUTES = ["/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings", "/tokenize", "/detokenize"]


@given(route=st.sampled_from(ROUTES), body=JSON | st.dictionaries(st.sampled_from(FIELDS), JSON, max_size=6))
@settings(max_examples=120, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_arbitrary_json_bodies_get_a_client_error_or_an_answer(fuzz_server, route, body):
    with httpx.Client(base_url=fuzz_server.url, timeout=60) as http:
        response = http.post(route, json=body)
        assert response.status_code < 500, (route, body, response.text)
        if response.status_code >= 400:
            assert set(response.json()["error"]) >= {"message", "type", "param", "code"}
        assert http.get("/live").status_code == 200


@given(route=st.sampled_from(ROUTES), raw=st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_bodies_that_are_not_json_get_a_400(fuzz_server, route, raw):
    import json

    try:
        json.loads(raw)
        return  # valid JSON is the other test's business
    except ValueError:
        pass
    with httpx.Client(base_url=fuzz_server.url, timeout=60) as http:
        response = http.post(route, content=raw, headers={"content-type": "application/json"})
        if route == "/v1/embeddings":  # not mounted for a model that generates
            assert response.status_code == 404, (route, raw, response.text)
            return
        assert response.status_code == 400, (route, raw, response.text)
        assert response.json()["error"]["type"] == "invalid_request_error"
