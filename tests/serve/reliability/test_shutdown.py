"""Shutdown under load (cases 8 and 9 of the reliability table).

* ``--shutdown-timeout 30``: on SIGTERM readiness fails at once and new requests are refused, while
  every request in flight, running or queued, streamed or not, completes normally; the server exits 0
  and its engine process is gone.
* ``--shutdown-timeout 0``, or a second SIGTERM: requests in flight end at once with
  ``finish_reason: "abort"`` (or an error), and the server exits 0 within 5 s.
"""

from __future__ import annotations

import json
import signal
import time

import httpx
import pytest
from reliability_support import (
    LONG,
    Call,
    StreamReader,
    chat_body,
    data_lines,
    descendants,
    finish_reasons,
    load,
    status_or_error,
    wait_for,
)

from llmp.testing import assert_openai_error, pid_alive, serving

REFUSED = {503, "ConnectError", "RemoteProtocolError", "ReadError"}

pytestmark = pytest.mark.slow  # each test starts (and takes down) its own server


def aborted(worker: Call | StreamReader) -> bool:
    """Whether a request cut short by the shutdown says so: finish_reason "abort", or an error (body or event)."""
    if isinstance(worker, Call):
        response = worker.response
        assert response is not None, worker.error
        if response.status_code == 200:
            choice = response.json()["choices"][0]
            return choice["finish_reason"] == "abort" and response.json()["usage"]["completion_tokens"] < LONG
        assert_openai_error(response, 503)
        return True
    payloads = data_lines(worker.lines)
    assert worker.status == 200 and payloads, (worker.path, worker.error)
    if payloads[-1] == "[DONE]":
        return finish_reasons(payloads)[-1:] == ["abort"]
    return "error" in json.loads(payloads[-1])


def queued_behind(url: str, running: int) -> bool:
    """Whether the engine runs ``running`` requests and queues at least one more."""
    now = load(url)
    return now["running"] == running and now["waiting"] >= 1


def test_sigterm_under_load_drains_running_and_queued_requests_then_exits_0(tiny_model):
    with serving(tiny_model, "--dtype", "float32", "--shutdown-timeout", "30", "--max-num-seqs", "2") as server:
        url = server.url
        tokens = 240  # long enough that all five are in the engine together for a while (two run at a time)
        fixed = {"max_tokens": tokens, "ignore_eos": True}
        streams = [
            StreamReader(url, "/v1/chat/completions", chat_body(stream=True, **fixed)),
            StreamReader(url, "/v1/completions", {"prompt": "The quick", "stream": True, **fixed}),
            StreamReader(
                url,
                "/v1/chat/completions",
                chat_body("Paged attention", stream=True, stream_options={"include_usage": True}, **fixed),
            ),
        ]
        calls = [
            Call(url, "/v1/completions", {"prompt": "Continuous batching", **fixed}),
            Call(url, "/v1/chat/completions", chat_body("The lazy dog", **fixed)),
        ]
        for worker in [*streams, *calls]:
            worker.start()
        # two running with others queued behind them, and text already flowing. Not "all five at once": that
        # holds only until the first two finish, which a loaded machine's late fifth request can miss
        wait_for(lambda: queued_behind(url, running=2), 60, "two requests running and others queued")
        wait_for(lambda: any(s.content_chunks() for s in streams), 60, "a stream to carry text")
        tree = descendants(server.process.pid)

        server.process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        wait_for(lambda: status_or_error("GET", f"{url}/ready", timeout=2) != 200, 5, "readiness to fail at once")
        refused = status_or_error("POST", f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 1})
        assert refused in REFUSED, refused

        status = server.process.wait(60)
        exit_s = time.monotonic() - signalled
        for worker in [*streams, *calls]:
            worker.join(10)
        print(
            f"\n[figure] SIGTERM under load (--shutdown-timeout 30, 5 requests of {tokens} tokens, 2 at a time): "
            f"exit {status} after {exit_s:.2f} s"
        )
        assert status == 0, server.log()[-3000:]
        assert exit_s < 30 + 5

        for stream in streams:
            payloads = data_lines(stream.lines)
            assert stream.status == 200 and payloads[-1] == "[DONE]", (stream.path, payloads[-3:])
            assert finish_reasons(payloads) == ["length"], (stream.path, payloads[-3:])
        usage = json.loads(data_lines(streams[2].lines)[-2])["usage"]
        assert usage["completion_tokens"] == tokens
        for call in calls:
            assert call.response is not None and call.response.status_code == 200, (call.path, call.error)
            body = call.response.json()
            assert body["choices"][0]["finish_reason"] == "length" and body["usage"]["completion_tokens"] == tokens
        wait_for(lambda: not any(pid_alive(pid) for pid in tree), 10, f"the server's children {tree} to be reaped")


def start_long_requests(url: str) -> tuple[list[StreamReader], list[Call]]:
    long = {"max_tokens": LONG, "ignore_eos": True}
    streams = [
        StreamReader(url, "/v1/chat/completions", chat_body(stream=True, **long)),
        StreamReader(url, "/v1/completions", {"prompt": "The quick", "stream": True, **long}),
    ]
    calls = [Call(url, "/v1/completions", {"prompt": "Continuous batching", **long})]
    for worker in [*streams, *calls]:
        worker.start()
    wait_for(lambda: all(s.content_chunks() >= 2 for s in streams), 60, "both streams to carry text")
    return streams, calls


def test_sigterm_with_shutdown_timeout_0_aborts_in_flight_requests_and_exits_within_5_s(tiny_model):
    with serving(tiny_model, "--dtype", "float32", "--shutdown-timeout", "0") as server:
        streams, calls = start_long_requests(server.url)
        tree = descendants(server.process.pid)
        server.process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        status = server.process.wait(30)
        exit_s = time.monotonic() - signalled
        for worker in [*streams, *calls]:
            worker.join(10)
        print(f"\n[figure] SIGTERM with --shutdown-timeout 0: exit {status} after {exit_s:.2f} s")
        assert status == 0, server.log()[-3000:]
        assert exit_s < 5
        for worker in [*streams, *calls]:
            assert aborted(worker), (
                worker.path,
                getattr(worker, "lines", [])[-3:],
                worker.response if isinstance(worker, Call) else None,
            )
        wait_for(lambda: not any(pid_alive(pid) for pid in tree), 10, f"the server's children {tree} to be reaped")


def test_a_second_sigterm_aborts_the_drain_and_exits_within_5_s(tiny_model):
    with serving(tiny_model, "--dtype", "float32", "--shutdown-timeout", "30") as server:
        streams, calls = start_long_requests(server.url)
        server.process.send_signal(signal.SIGTERM)
        # draining: the streams go on
        counts = [s.content_chunks() for s in streams]
        wait_for(
            lambda: all(s.content_chunks() >= c + 3 for s, c in zip(streams, counts)),
            30,
            "the streams to keep going after the first SIGTERM",
        )
        assert server.process.poll() is None
        server.process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        status = server.process.wait(30)
        exit_s = time.monotonic() - signalled
        for worker in [*streams, *calls]:
            worker.join(10)
        print(f"\n[figure] second SIGTERM while draining: exit {status} after {exit_s:.2f} s")
        assert status == 0, server.log()[-3000:]
        assert exit_s < 5
        for worker in [*streams, *calls]:
            assert aborted(worker), (worker.path, getattr(worker, "lines", [])[-3:])
        assert all(s.error is None or isinstance(s.error, httpx.HTTPError) for s in streams)
