"""Start-up probes and the engine killed under traffic (cases 5, 6 and 25 of the reliability table).

One server, watched from its first second: ``/live`` answers as soon as HTTP is up while ``/ready`` is
503 naming the phase; then, with streamed and non-streamed requests of every generation route in
flight, the engine process is SIGKILLed. Non-streamed requests get 503 with an error body, streams an
in-band error and no ``[DONE]``, readiness fails within 5 s, and the server exits non-zero leaving no
process behind.
"""

from __future__ import annotations

import json
import os
import signal
import time

import httpx
import pytest
from reliability_support import (
    LONG,
    Call,
    StreamReader,
    anthropic_body,
    chat_body,
    data_lines,
    descendants,
    engine_pid,
    start_serve,
    wait_for,
)

from llmp.testing import assert_openai_error, free_port, pid_alive

PHASES = ("starting", "loading", "warming_up")

pytestmark = pytest.mark.slow  # each test starts (and takes down) its own server


def watch_start_up(url: str, process, timeout: float = 180) -> list[tuple[int | None, int, dict | None]]:
    """(live status, ready status, ready body) every 20 ms until /ready is 200."""
    samples: list[tuple[int | None, int, dict | None]] = []
    deadline = time.monotonic() + timeout
    with httpx.Client(base_url=url, timeout=5) as client:
        while time.monotonic() < deadline:
            assert process.poll() is None, "the server exited while starting"
            try:
                ready = client.get("/ready")
                live = client.get("/live").status_code
            except httpx.TransportError:
                time.sleep(0.02)
                continue
            body = ready.json() if ready.status_code != 200 else None
            if ready.status_code != 200:
                assert ready.headers.get("retry-after") == "1", ready.headers
            samples.append((live, ready.status_code, body))
            if ready.status_code == 200:
                return samples
            time.sleep(0.02)
    raise AssertionError(f"not ready within {timeout:g} s: {samples[-3:]}")


def test_start_up_probes_then_the_engine_killed_mid_traffic(tiny_model, tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "serve.log"
    process = start_serve(
        tiny_model,
        port,
        "--dtype",
        "float32",
        "--max-num-seqs",
        "8",
        "--frontend",
        "openai",
        "--frontend",
        "anthropic",
        "--frontend",
        "sagemaker",
        log_path=log_path,
    )
    try:
        # -- case 5: live at once, ready 503 with the phase until warmed up ------------------------------
        samples = watch_start_up(url, process)
        not_ready = [(live, body) for live, status, body in samples if status == 503]
        assert not_ready, "never saw /ready before the model was loaded"
        assert all(live == 200 for live, _ in not_ready), not_ready
        for _, body in not_ready:
            assert body["error"]["type"] == "service_unavailable_error"
            assert (
                body["error"]["message"].startswith("not ready: ")
                and body["error"]["message"][len("not ready: ") :].split(" ")[0] in PHASES
            ), body
        assert all(status == 503 for _, status, _ in samples[:-1]) and samples[-1][1] == 200

        # -- case 6: traffic on every generation route, then SIGKILL the engine ------------------------
        long = {"max_tokens": LONG, "ignore_eos": True}
        calls = [
            Call(url, "/v1/chat/completions", chat_body(**long)),
            Call(url, "/v1/completions", {"prompt": "The quick", **long}),
            Call(url, "/v1/responses", {"input": "The quick", "max_output_tokens": LONG, "ignore_eos": True}),
            Call(url, "/invocations", {"prompt": "The quick", **long}),
        ]
        streams = {
            "chat": StreamReader(
                url, "/v1/chat/completions", chat_body(stream=True, stream_options={"include_usage": True}, **long)
            ),
            "completions": StreamReader(url, "/v1/completions", {"prompt": "The quick", "stream": True, **long}),
            "responses": StreamReader(
                url,
                "/v1/responses",
                {"input": "The quick", "stream": True, "ignore_eos": True, "max_output_tokens": LONG},
            ),
            # greedy: this prompt's continuation runs past 1500 tokens without an end token
            "anthropic": StreamReader(
                url,
                "/v1/messages",
                anthropic_body(tiny_model, "The quick", max_tokens=LONG, stream=True, temperature=0),
            ),
        }
        for worker in [*calls, *streams.values()]:
            worker.start()
        wait_for(lambda: all(s.content_chunks() >= 2 for s in streams.values()), 60, "every stream to carry text")
        engine = engine_pid(process.pid)
        tree = descendants(process.pid)
        assert engine in tree

        os.kill(engine, signal.SIGKILL)
        killed = time.monotonic()
        with httpx.Client(base_url=url, timeout=5) as client:

            def readiness_failed() -> bool:
                try:
                    return client.get("/ready").status_code != 200
                except httpx.TransportError:
                    return True

            wait_for(readiness_failed, 10, "/ready to fail after the engine died", interval=0.05)
        ready_failed_s = time.monotonic() - killed

        for worker in [*calls, *streams.values()]:
            worker.join(60)
            assert not worker.is_alive(), f"{worker.path} still waiting 60 s after the engine died"
        status = process.wait(30)
        exited_s = time.monotonic() - killed
        print(
            f"\n[figure] engine SIGKILLed: /ready failed after {ready_failed_s:.2f} s, server exited "
            f"{status} after {exited_s:.2f} s"
        )

        # non-streamed requests: an error status and an OpenAI error body, not a hang
        for call in calls:
            assert call.error is None, (call.path, call.error)
            error = assert_openai_error(call.response, 503, contains="engine")
            assert error["type"] == "service_unavailable_error", (call.path, error)
        # OpenAI streams: an in-band error as the last event, no usage chunk, no [DONE]
        for name in ("chat", "completions"):
            payloads = data_lines(streams[name].lines)
            assert streams[name].status == 200 and payloads, name
            assert "[DONE]" not in payloads, (name, payloads[-3:])
            last = json.loads(payloads[-1])
            assert set(last) == {"error"} and last["error"]["message"], (name, last)
            assert not any(json.loads(p).get("usage") for p in payloads), name
        # the Responses stream: an error event, and it never claims to have completed
        events = [line for line in streams["responses"].lines if line.startswith("event: ")]
        assert events and events[-1] == "event: error", events[-3:]
        assert "event: response.completed" not in events and "event: response.incomplete" not in events
        # the Anthropic stream: an error event in its own shape, and no message_stop
        events = [line for line in streams["anthropic"].lines if line.startswith("event: ")]
        assert events and events[-1] == "event: error", events[-3:]
        assert "event: message_stop" not in events and "event: message_delta" not in events
        error = json.loads(data_lines(streams["anthropic"].lines)[-1])
        assert error["type"] == "error" and error["error"]["message"], error

        assert ready_failed_s < 5, f"/ready still 200 {ready_failed_s:.1f} s after the engine died"
        assert status != 0, "a server whose engine died must exit non-zero, so a supervisor restarts it"
        wait_for(lambda: not any(pid_alive(pid) for pid in tree), 10, f"no orphan of {tree}")
        log = log_path.read_text(errors="replace")
        assert "the engine died" in log and "Traceback" not in log, log[-3000:]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
