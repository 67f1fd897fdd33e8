"""The management routes of ``llmp serve --enable-admin-api`` (vLLM's): sleep and wake-up, the
prefix cache, profiles, collective_rpc, and the keys they take.

One real server (a tiny Llama, an API key and an admin key, a profile directory) for the routes;
the gate's key rules also on the real app in this process, over a real engine in a thread.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from llmp import AsyncLLM
from llmp.options import ServerOptions
from llmp.server.admin import mount_admin
from llmp.server.app import Limits, ServerState, build_app
from llmp.server.metrics import ServerMetrics
from llmp.testing import LiveServer, save_tiny_llama, serving

USER = {"Authorization": "Bearer user-key"}
ADMIN = {"Authorization": "Bearer admin-key"}
PROMPT = [5, 17, 42, 99, 7]
LONG_PROMPT = [(7 * i + 3) % 390 + 5 for i in range(40)]  # two full blocks of 16 for the prefix cache


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-admin")
    save_tiny_llama(path, vocab_size=400)
    return path


@pytest.fixture(scope="module")
def profiles(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("profiles")


@pytest.fixture(scope="module")
def live(model_dir: Path, profiles: Path) -> Iterator[LiveServer]:
    with serving(
        model_dir,
        "--dtype",
        "float32",
        "--max-model-len",
        "256",
        "--block-size",
        "16",
        "--served-model-name",
        "m",
        "--enable-admin-api",
        "--api-key",
        "user-key",
        "--admin-api-key",
        "admin-key",
        "--profiler-dir",
        str(profiles),
    ) as server:
        yield server


@pytest.fixture(scope="module")
def http(live: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live.url, timeout=60) as client:
        yield client


def complete(http: httpx.Client, prompt: list[int] = PROMPT, max_tokens: int = 8, **extra) -> httpx.Response:
    body = {"model": "m", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    return http.post("/v1/completions", json={**body, **extra}, headers=USER)


def greedy_text(http: httpx.Client) -> str:
    response = complete(http)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["text"]


def assert_sleeping_503(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    error = response.json()["error"]
    assert "sleeping" in error["message"] and "POST /wake_up" in error["message"]
    assert error["type"] == "service_unavailable_error"


def is_sleeping(http: httpx.Client) -> bool:
    response = http.get("/is_sleeping", headers=ADMIN)
    assert response.status_code == 200, response.text
    return response.json()["is_sleeping"]


def test_the_admin_routes_take_the_admin_key_alone(http):
    for headers in ({}, USER, {"Authorization": "Bearer nope"}):
        response = http.get("/is_sleeping", headers=headers)
        assert response.status_code == 401, response.text
        assert "--admin-api-key" in response.json()["error"]["message"]
    assert http.post("/sleep", headers=USER).status_code == 401  # the API key cannot put the engine to sleep
    assert http.get("/is_sleeping", headers=ADMIN).json() == {"is_sleeping": False}
    assert http.get("/is_sleeping", headers={"x-api-key": "admin-key"}).status_code == 200
    assert complete(http).status_code == 200  # the model routes still take the API key
    # a front-end's management routes (the OpenAI render routes) take the admin key too
    body = {"model": "m", "prompt": "hi"}
    assert http.post("/v1/completions/render", json=body, headers=USER).status_code == 401
    rendered = http.post("/v1/completions/render", json=body, headers=ADMIN)
    assert rendered.status_code == 200 and rendered.json()[0]["token_ids"], rendered.text


@pytest.mark.parametrize(("level", "wake"), [(1, ["weights", "kv_cache"]), (2, [])])
def test_sleep_then_a_request_is_503_then_wake_gives_the_same_answer(http, level, wake):
    before = greedy_text(http)
    response = http.post(f"/sleep?level={level}", headers=ADMIN)
    assert response.status_code == 200 and response.content == b""  # vLLM's empty 200
    assert is_sleeping(http)
    assert_sleeping_503(complete(http))
    assert_sleeping_503(complete(http, stream=True))  # refused before the stream starts
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": True}
    assert_sleeping_503(http.post("/v1/chat/completions", json=chat, headers=USER))
    if wake:  # vLLM's partial wake: one tag at a time
        assert http.post("/wake_up", params={"tags": wake[0]}, headers=ADMIN).status_code == 200
        assert is_sleeping(http)
        assert_sleeping_503(complete(http))
        assert http.post("/wake_up", params={"tags": wake[1:]}, headers=ADMIN).status_code == 200
    else:
        assert http.post("/wake_up", headers=ADMIN).status_code == 200
    assert not is_sleeping(http)
    assert greedy_text(http) == before


def test_asleep_describe_works_and_a_failed_wake_up_is_a_logged_500(http, live, model_dir, tmp_path):
    assert http.post("/sleep?level=2", headers=ADMIN).status_code == 200
    weights = model_dir / "model.safetensors"
    try:
        response = http.post("/collective_rpc", json={"method": "describe"}, headers=ADMIN)
        assert response.status_code == 200, response.text  # no model while asleep: described all the same
        assert response.json()["results"][0]["sleeping"] == ["kv_cache", "weights"]
        weights.rename(tmp_path / "away")
        response = http.post("/wake_up", headers=ADMIN)
        assert response.status_code == 500, response.text  # the server's failure, not the request's
        error = response.json()["error"]
        assert error["message"].startswith("wake-up failed on rank 0: ModelLoadError"), error
        assert error["type"] == "internal_server_error"
        assert re.search(r"ERROR .*management call failed: wake-up failed on rank 0", live.log())
    finally:
        if not weights.exists():
            (tmp_path / "away").rename(weights)
    assert is_sleeping(http)
    assert http.post("/wake_up", headers=ADMIN).status_code == 200  # the files are back: it wakes
    assert greedy_text(http)


def test_sleep_aborts_a_request_in_flight(http):
    chunks: list[dict] = []
    started = threading.Event()

    def stream() -> None:
        body = {"model": "m", "prompt": PROMPT, "max_tokens": 200, "temperature": 0, "ignore_eos": True, "stream": True}
        with http.stream("POST", "/v1/completions", json=body, headers=USER) as response:
            for line in response.iter_lines():
                if line.startswith("data: {"):
                    chunks.append(json.loads(line[6:]))
                    started.set()

    reader = threading.Thread(target=stream)
    reader.start()
    assert started.wait(60)
    assert http.post("/sleep", headers=ADMIN).status_code == 200  # mode=abort, vLLM's default
    reader.join(60)
    assert chunks[-1]["choices"][0]["finish_reason"] == "abort"
    assert http.post("/wake_up", headers=ADMIN).status_code == 200
    assert greedy_text(http)


class Streamer(threading.Thread):
    """A streamed completion read in a thread: its chunks, and an event set at the first."""

    def __init__(self, http: httpx.Client, max_tokens: int = 200) -> None:
        super().__init__()
        self.http, self.max_tokens = http, max_tokens
        self.chunks: list[dict] = []
        self.started = threading.Event()
        self.start()
        assert self.started.wait(60)

    def run(self) -> None:
        body = {"model": "m", "prompt": PROMPT, "max_tokens": self.max_tokens, "temperature": 0, "ignore_eos": True}
        with self.http.stream("POST", "/v1/completions", json={**body, "stream": True}, headers=USER) as response:
            for line in response.iter_lines():
                if line.startswith("data: {"):
                    self.chunks.append(json.loads(line[6:]))
                    self.started.set()

    def text(self) -> str:
        return "".join(chunk["choices"][0]["text"] for chunk in self.chunks)


def settled_count(streamer: Streamer, quiet_s: float = 0.5) -> int:
    """The number of chunks once none has come for ``quiet_s`` (at most 10 s)."""
    deadline = time.monotonic() + 10
    count = -1
    while count != len(streamer.chunks) and time.monotonic() < deadline:
        count = len(streamer.chunks)
        time.sleep(quiet_s)
    return count


@pytest.fixture(autouse=True)
def resumed(live: LiveServer) -> Iterator[None]:
    """Each test leaves the shared server generating, so a failure here is not every test's after."""
    yield
    with httpx.Client(base_url=live.url, timeout=60) as client:
        client.post("/resume", headers=ADMIN)
        client.post("/wake_up", headers=ADMIN)


def is_paused(http: httpx.Client) -> bool:
    response = http.get("/is_paused", headers=ADMIN)
    assert response.status_code == 200, response.text
    return response.json()["is_paused"]


def test_pause_abort_ends_the_stream_and_holds_new_requests_until_resume(http):
    before = greedy_text(http)
    streamer = Streamer(http)
    response = http.post("/pause", headers=ADMIN)  # mode=abort, vLLM's default
    assert response.status_code == 200 and response.json() == {"status": "paused"}
    streamer.join(60)
    assert streamer.chunks[-1]["choices"][0]["finish_reason"] == "abort"
    assert is_paused(http)
    held: list[httpx.Response] = []
    waiter = threading.Thread(target=lambda: held.append(complete(http)))
    waiter.start()
    waiter.join(1.5)
    assert waiter.is_alive() and not held  # taken, not refused: it waits for the resume
    # pausing again: still paused, the held request kept (mode=abort would abort it: it is in flight)
    assert http.post("/pause", params={"mode": "keep"}, headers=ADMIN).json() == {"status": "paused"}
    assert http.post("/resume", headers=ADMIN).json() == {"status": "resumed"}
    waiter.join(60)
    assert held[0].status_code == 200 and held[0].json()["choices"][0]["text"] == before
    assert not is_paused(http)
    assert http.post("/resume", headers=ADMIN).status_code == 200  # idempotent


def test_pause_keep_freezes_a_stream_that_resume_finishes_unchanged(http):
    whole = Streamer(http, max_tokens=240)
    whole.join(60)
    streamer = Streamer(http, max_tokens=240)
    assert http.post("/pause", params={"mode": "keep"}, headers=ADMIN).status_code == 200
    frozen = settled_count(streamer)  # the chunks made before the pause may still be on their way
    streamer.join(1.0)
    assert streamer.is_alive() and len(streamer.chunks) == frozen  # nothing generated while paused
    assert http.post("/resume", headers=ADMIN).status_code == 200
    streamer.join(60)
    assert streamer.chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert streamer.text() == whole.text()  # greedy: the same tokens, paused or not


@pytest.mark.parametrize("params", [{"mode": "wait"}, {"wait_for_inflight_requests": "true"}])
def test_pause_wait_returns_once_the_requests_in_flight_finish(http, params):
    streamer = Streamer(http, max_tokens=120)
    assert http.post("/pause", params=params, headers=ADMIN).status_code == 200
    streamer.join(5)  # already over: the pause answered once it was
    assert not streamer.is_alive()
    assert streamer.chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert http.post("/resume", headers=ADMIN).status_code == 200


def test_shutting_down_while_paused_aborts_what_the_pause_holds(model_dir):
    """SIGTERM drains requests for --shutdown-timeout; a paused engine would finish none of them."""
    import signal

    with serving(model_dir, "--enable-admin-api", "--shutdown-timeout", "60", "--max-model-len", "256") as live:
        with httpx.Client(base_url=live.url, timeout=60) as client:
            assert client.post("/pause").status_code == 200
            held: list[httpx.Response] = []
            body = {"prompt": PROMPT, "max_tokens": 4}
            waiter = threading.Thread(target=lambda: held.append(client.post("/v1/completions", json=body)))
            waiter.start()
            waiter.join(1.0)
            assert waiter.is_alive()  # held by the pause
            started = time.monotonic()
            live.process.send_signal(signal.SIGTERM)
            waiter.join(30)
            live.process.wait(30)
            assert time.monotonic() - started < 20  # not the 60 s of --shutdown-timeout
            assert held and held[0].json()["choices"][0]["finish_reason"] == "abort"
            assert live.process.returncode == 0
            assert "the requests it holds are aborted" in live.log()


def test_bad_management_input_is_a_400(http):
    for path, params in (
        ("/sleep", {"level": 3}),
        ("/sleep", {"level": "deep"}),
        ("/sleep", {"mode": "keep"}),  # vLLM's third mode (frozen requests) is not supported
        ("/wake_up", {"tags": "gpu"}),
        ("/reset_prefix_cache", {"reset_running_requests": "true"}),
        ("/pause", {"mode": "freeze"}),
        ("/pause", {"clear_cache": "maybe"}),
        ("/pause", {"mode": "keep", "clear_cache": "true"}),  # the frozen requests hold their blocks
    ):
        response = http.post(path, params=params, headers=ADMIN)
        assert response.status_code == 400, (path, params, response.text)
        assert response.json()["error"]["message"]
    assert not is_sleeping(http) and not is_paused(http)


def prefix_cache_hits(http: httpx.Client) -> float:
    text = http.get("/metrics").text
    return float(re.search(r"^llmp_prefix_cache_hits_total\{[^}]*\} (\S+)$", text, re.M).group(1))


def test_reset_prefix_cache_means_the_next_request_finds_nothing_cached(http):
    complete(http, LONG_PROMPT, max_tokens=1)
    hits = prefix_cache_hits(http)
    complete(http, LONG_PROMPT, max_tokens=1)
    assert prefix_cache_hits(http) - hits == 32  # cached: two blocks
    response = http.post("/reset_prefix_cache", headers=ADMIN)
    assert response.status_code == 200 and response.content == b""
    hits = prefix_cache_hits(http)
    complete(http, LONG_PROMPT, max_tokens=1)
    assert prefix_cache_hits(http) == hits  # nothing cached any more


def test_a_profile_writes_a_chrome_trace(http, profiles):
    assert http.post("/stop_profile", headers=ADMIN).status_code == 400  # none running
    assert http.post("/start_profile", headers=ADMIN).status_code == 200
    again = http.post("/start_profile", headers=ADMIN)
    assert again.status_code == 400 and "already running" in again.json()["error"]["message"]
    complete(http, max_tokens=2)
    response = http.post("/stop_profile", headers=ADMIN)
    assert response.status_code == 200, response.text
    (trace,) = response.json()["traces"]
    assert Path(trace).parent == profiles.resolve()
    assert json.loads(Path(trace).read_text())["traceEvents"]  # Chrome-trace JSON, as Perfetto reads it


def test_collective_rpc(http):
    response = http.post("/collective_rpc", json={"method": "describe", "timeout": 30}, headers=ADMIN)
    assert response.status_code == 200, response.text
    (result,) = response.json()["results"]  # one per rank
    assert result["rank"] == 0 and result["bytes_per_block"] > 0
    for body, message in (
        ({"method": "nope"}, "no method 'nope'"),
        ({"method": "_private"}, "public worker method"),
        ({"method": "sleep"}, "drives the workers' 'sleep' itself"),
        ({"method": "describe", "args": [1]}, "failed on rank 0: TypeError"),
        ({}, "method: Field required"),
        ({"method": "describe", "extra": 1}, "extra: Extra inputs are not permitted"),
        ({"method": "describe", "timeout": 0}, "timeout"),
    ):
        response = http.post("/collective_rpc", json=body, headers=ADMIN)
        assert response.status_code == 400, (body, response.text)
        assert message in response.json()["error"]["message"]
    assert greedy_text(http)  # the engine runs on


@pytest.fixture(scope="module")
def engine(model_dir: Path) -> Iterator[AsyncLLM]:
    engine = AsyncLLM(str(model_dir), dtype="float32", max_model_len=64, engine_mode="thread")
    yield engine
    engine.shutdown()


@pytest.mark.parametrize(
    ("api_key", "admin_key", "accepted", "refused"),
    [
        ("user-key", None, [USER], [{}, ADMIN]),  # no admin key: the API key guards them
        ("user-key", "admin-key", [ADMIN], [{}, USER]),
        (None, None, [{}], []),  # no key at all: open, as the model routes are
    ],
)
def test_which_key_the_admin_routes_take(engine, api_key, admin_key, accepted, refused):
    async def scenario() -> None:
        state = ServerState()
        app = build_app(
            state,
            api_keys=[api_key] if api_key else [],
            allowed_origins=[],
            allow_credentials=False,
            limits=Limits(max_body_bytes=1 << 20, overload_status=503),
            root_path="",
            docs=False,
            metrics=ServerMetrics("m"),
            health_timeout=5,
        )
        options = ServerOptions(enable_admin_api=True, api_key=(api_key,) if api_key else (), admin_api_key=admin_key)
        mount_admin(app, state, options)
        state.engine, state.phase = engine, "ready"
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            for headers in accepted:
                response = await client.get("/is_sleeping", headers=headers)
                assert response.json() == {"is_sleeping": False}, (headers, response.text)
            for headers in refused:
                assert (await client.get("/is_sleeping", headers=headers)).status_code == 401, headers

    asyncio.run(scenario())


def test_without_the_flag_the_routes_are_not_there():
    async def scenario() -> None:
        state = ServerState()
        state.phase = "ready"
        app = build_app(
            state,
            api_keys=[],
            allowed_origins=[],
            allow_credentials=False,
            limits=Limits(max_body_bytes=1 << 20, overload_status=503),
            root_path="",
            docs=False,
            metrics=ServerMetrics("m"),
            health_timeout=5,
        )
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            for path in ("/sleep", "/wake_up", "/reset_prefix_cache", "/collective_rpc", "/start_profile"):
                assert (await client.post(path, json={})).status_code == 404
            assert (await client.get("/is_sleeping")).status_code == 404

    asyncio.run(scenario())
