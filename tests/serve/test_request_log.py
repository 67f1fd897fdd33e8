"""``--enable-log-requests``: a real ``llmp serve`` logs each request's id, route, sampling parameters and
prompt (cut to ``--max-log-len``) when the engine takes it, then its outcome; requests refused before
the engine get an outcome line too; the API key is never in the log. The same server traces to a
collector that is not there (``--otlp-traces-endpoint``): requests do not notice, shutdown is bounded."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from llmp.testing import LiveServer, free_port, save_tiny_llama, serving

pytestmark = pytest.mark.slow

KEY = "sk-request-log-7f3a9c1e"
MAX_LOG_LEN = 20
PROMPT = " ".join(f"w{i}" for i in range(30))
RECEIVED = re.compile(
    r"INFO llmp\.requests: Received request (\S+): route: (\S+) (\S+) \(X-Request-Id (\S+)\), prompt: '(.*?)', "
    r"params: (SamplingParams\(.*?\)|PoolingParams\(.*?\)), prompt_token_ids: (\[[\d, ]*\]|None), lora_request: None\."
)
FINISHED = re.compile(
    r"INFO llmp\.requests: Finished request (\S+): finish_reason: (\w+), prompt_tokens: (\d+), "
    r"generation_tokens: (\d+), duration: ([\d.]+) s(?:, time_to_first_token: ([\d.]+) s)?\."
)
REFUSED = re.compile(
    r"INFO llmp\.requests: Refused request (\S+): route: (\S+) (\S+), status: (\d+), error: (.*)\.$", re.M
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    model_dir: Path = tmp_path_factory.mktemp("tiny-llama-request-log")
    save_tiny_llama(model_dir, vocab_size=400)
    nobody = f"http://127.0.0.1:{free_port()}"  # no collector listens there
    with serving(
        model_dir,
        "--dtype",
        "float32",
        "--enable-log-requests",
        "--max-log-len",
        str(MAX_LOG_LEN),
        "--api-key",
        KEY,
        "--otlp-traces-endpoint",
        nobody,
        env={"OTEL_BSP_SCHEDULE_DELAY": "200"},  # export attempts (all failing) while the tests run
    ) as live:
        yield live


def _lines(server: LiveServer, pattern: re.Pattern, request_id: str, timeout: float = 10) -> list[re.Match]:
    """The log lines matching ``pattern`` that name ``request_id``, waited for (a line may lag its answer)."""
    deadline = time.monotonic() + timeout
    while True:
        found = [m for m in pattern.finditer(server.log()) if request_id in m.group(0)]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def test_a_completion_logs_its_route_params_cut_prompt_and_outcome(server):
    client = openai.OpenAI(base_url=server.api_url, api_key=KEY)
    started = time.monotonic()
    completion = client.completions.create(
        model=client.models.list().data[0].id,
        prompt=PROMPT,
        max_tokens=4,
        temperature=0.7,
        extra_body={"ignore_eos": True},
        extra_headers={"X-Request-Id": "log-test-1"},
    )
    assert time.monotonic() - started < 10  # the unreachable collector costs the request nothing
    [received] = _lines(server, RECEIVED, "log-test-1")
    engine_id, method, path, http_id, prompt, params, token_ids = received.groups()
    assert engine_id.startswith("cmpl-")  # the engine request's id: the outcome line names it too
    assert (method, path, http_id) == ("POST", "/v1/completions", "log-test-1")
    assert prompt == PROMPT[:MAX_LOG_LEN]
    assert "max_tokens=4" in params and "temperature=0.7" in params and "ignore_eos=True" in params
    ids = [int(i) for i in token_ids.strip("[]").split(",")]
    assert len(ids) == MAX_LOG_LEN < completion.usage.prompt_tokens
    [finished] = _lines(server, FINISHED, engine_id)
    _, reason, prompt_tokens, generated, duration, ttft = finished.groups()
    assert reason == completion.choices[0].finish_reason == "length"
    assert int(prompt_tokens) == completion.usage.prompt_tokens
    assert int(generated) == completion.usage.completion_tokens == 4
    assert 0 < float(ttft) <= float(duration)


def test_a_batch_lines_log_lines_name_its_batch_line_and_the_request_id_of_its_answer(server):
    import io
    import json

    client = openai.OpenAI(base_url=server.api_url, api_key=KEY)
    line = {"custom_id": "line-7", "method": "POST", "url": "/v1/completions"}
    line["body"] = {"model": client.models.list().data[0].id, "prompt": "batch line", "max_tokens": 2}
    upload = client.files.create(file=io.BytesIO(json.dumps(line).encode() + b"\n"), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/completions", completion_window="24h")
    deadline = time.monotonic() + 60
    while (batch := client.batches.retrieve(batch.id)).status != "completed" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert batch.status == "completed", batch
    [answer] = [json.loads(text) for text in client.files.content(batch.output_file_id).text.splitlines()]
    request_id = answer["response"]["request_id"]
    route = f"POST /v1/completions (X-Request-Id {request_id}) of batch {batch.id}, line line-7"
    [received] = _lines(server, re.compile(r"Received request (\S+): route: (.*?), prompt: 'batch line'"), request_id)
    assert received.group(2) == route
    assert _lines(server, FINISHED, received.group(1))  # and its outcome, by the engine request's id


def test_a_streamed_chat_logs_its_outcome_when_the_stream_ends(server):
    client = openai.OpenAI(base_url=server.api_url, api_key=KEY)
    stream = client.chat.completions.create(
        model=client.models.list().data[0].id,
        messages=[{"role": "user", "content": "tell me a long story please"}],
        max_tokens=3,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
        extra_headers={"X-Request-Id": "log-test-chat"},
    )
    usage = [chunk.usage for chunk in stream if chunk.usage is not None][-1]
    [received] = _lines(server, RECEIVED, "log-test-chat")
    assert received.group(2, 3) == ("POST", "/v1/chat/completions")
    assert len(received.group(5)) == MAX_LOG_LEN  # the rendered chat prompt, cut
    [finished] = _lines(server, FINISHED, received.group(1))
    assert finished.group(2) == "length"
    assert (int(finished.group(3)), int(finished.group(4))) == (usage.prompt_tokens, usage.completion_tokens)


def test_a_stream_the_client_leaves_is_logged_as_aborted(server):
    with httpx.stream(
        "POST",
        f"{server.api_url}/completions",
        json={"prompt": "go on", "max_tokens": 400, "ignore_eos": True, "stream": True},
        headers={"Authorization": f"Bearer {KEY}", "X-Request-Id": "log-test-abort"},
        timeout=30,
    ) as response:
        assert response.status_code == 200
        next(line for line in response.iter_lines() if line.startswith("data: {"))
    [received] = _lines(server, RECEIVED, "log-test-abort")
    [finished] = _lines(server, FINISHED, received.group(1))
    assert finished.group(2) == "abort"
    assert 1 <= int(finished.group(4)) < 400


def test_requests_refused_before_the_engine_get_an_outcome_line(server):
    url = f"{server.api_url}/completions"
    body = {"prompt": "hi", "max_tokens": 2}
    no_key = httpx.post(url, json=body, headers={"X-Request-Id": "log-test-401"}, timeout=30)
    assert no_key.status_code == 401
    bad = httpx.post(
        url,
        json={**body, "temperature": -1},
        headers={"Authorization": f"Bearer {KEY}", "X-Request-Id": "log-test-400"},
        timeout=30,
    )
    assert bad.status_code == 400
    too_long = httpx.post(
        url,
        json={"prompt": [5] * 600, "max_tokens": 2},
        headers={"Authorization": f"Bearer {KEY}", "X-Request-Id": "log-test-too-long"},
        timeout=30,
    )
    assert too_long.status_code == 400
    for request_id, status, words in (
        ("log-test-401", "401", "invalid or missing API key"),
        ("log-test-400", "400", "temperature must be >= 0.0"),
        ("log-test-too-long", "400", "maximum context length is 512 tokens"),
    ):
        [line] = _lines(server, REFUSED, request_id)
        assert line.group(1) == request_id
        assert line.group(2, 3, 4) == ("POST", "/v1/completions", status)
        assert words in line.group(5)
        assert not _lines(server, RECEIVED, request_id, timeout=0)  # never reached the engine
    healthy = httpx.get(f"{server.url}/health", timeout=10)
    assert healthy.status_code == 200
    assert "/health" not in "".join(m.group(0) for m in REFUSED.finditer(server.log()))


def test_the_api_key_is_never_logged(server):
    # the key in every header a client may send it in, on an answered request and a refused one
    for headers in ({"Authorization": f"Bearer {KEY}"}, {"x-api-key": KEY}):
        response = httpx.post(
            f"{server.api_url}/completions",
            json={"prompt": "key test", "max_tokens": 2},
            headers={**headers, "Cookie": f"session={KEY}", "X-Request-Id": "log-test-key"},
            timeout=30,
        )
        assert response.status_code == 200, response.text
    refused = httpx.get(f"{server.api_url}/models", headers={"Authorization": f"Bearer {KEY}x"}, timeout=30)
    assert refused.status_code == 401
    # ...and in the URL's query, which uvicorn's access log writes: its value is redacted
    in_url = httpx.post(
        f"{server.api_url}/completions?api_key={KEY}&n_keep=1",
        json={"prompt": "key test", "max_tokens": 2},
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=30,
    )
    assert in_url.status_code == 200, in_url.text
    deadline = time.monotonic() + 10
    while "/v1/completions?api_key=REDACTED&n_keep=1" not in server.log() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "/v1/completions?api_key=REDACTED&n_keep=1" in server.log()
    assert len(_lines(server, FINISHED, "cmpl-")) >= 2  # the requests were logged...
    assert KEY not in server.log()  # ...and the key was not


def test_an_engine_request_that_fails_logs_its_error(caplog):
    from llmp.frontend.errors import RequestTimeoutError
    from llmp.server.metrics import RequestRecord
    from llmp.server.request_log import RequestLogger

    record = RequestRecord("cmpl-9", "generate", "hi", None, None, start_time=100.0, end_time=102.5)
    record.error = RequestTimeoutError(2.5)
    with caplog.at_level("INFO", logger="llmp.requests"):
        RequestLogger(max_log_len=None).on_end(record)
    [line] = caplog.messages
    assert line.startswith("Failed request cmpl-9: 408 RequestTimeoutError: the request took longer")
    assert line.endswith(" after 2.500 s.")


def test_secret_query_parameters_are_redacted():
    from llmp.server.request_log import redact_query

    assert redact_query("/v1/models") == "/v1/models"
    assert redact_query("/sleep?level=1") == "/sleep?level=1"
    assert (
        redact_query("/v1/x?api_key=K&key=K&access_token=K&Password=K&model=m&flag")
        == "/v1/x?api_key=REDACTED&key=REDACTED&access_token=REDACTED&Password=REDACTED&model=m&flag"
    )
    assert redact_query("/v1/x?api%5Fkey=K") == "/v1/x?api%5Fkey=REDACTED"  # percent-encoded names too


def test_max_log_len_0_says_the_prompt_is_omitted(caplog):
    from llmp import Prompt
    from llmp.server.metrics import RequestRecord
    from llmp.server.request_log import RequestLogger

    with caplog.at_level("INFO", logger="llmp.requests"):
        for max_log_len in (0, None):
            record = RequestRecord("cmpl-7", "generate", Prompt(text="", token_ids=[]), None, None)
            RequestLogger(max_log_len=max_log_len).on_start(record)
    omitted, empty = caplog.messages
    assert "prompt: <omitted>," in omitted and "prompt_token_ids: <omitted>," in omitted
    assert "prompt: ''," in empty and "prompt_token_ids: []," in empty  # an empty prompt stays one


def test_shutdown_with_an_unreachable_collector_is_bounded(server):
    started = time.monotonic()
    assert server.stop() == 0
    assert time.monotonic() - started < 20
    log = server.log()
    assert "tracing: a span per request to http://127.0.0.1:" in log
    assert KEY not in log
