"""Admission control and a hung engine (cases 4 and 7 of the reliability table).

The server runs 4 requests at once and queues 4 more (``--max-num-seqs 4 --max-queue-len 4``); beyond
those 8 a model request is refused at once with 503, ``Retry-After`` and an OpenAI error body coded
``overloaded``, and counted in ``llmp_requests_rejected_total{reason="overloaded"}``. Readiness pings
the engine with ``--health-check-timeout 1``. The accepted requests are streams the test holds open,
so the count of accepted requests is exact whatever the machine's speed.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator

import httpx
import pytest
from reliability_support import (
    LONG,
    anthropic_body,
    burst,
    check_anthropic_error,
    check_refusal,
    engine_pid,
    load,
    metric,
    scrape,
    wait_for,
    wait_idle,
)

from llmp.testing import LiveServer, assert_openai_error, serving

CAPACITY = 8  # --max-num-seqs 4 + --max-queue-len 4
ALL_FRONTENDS = ("--frontend", "openai", "--frontend", "anthropic", "--frontend", "sagemaker")


@pytest.fixture(scope="module")
def capped_server(tiny_model) -> Iterator[LiveServer]:
    with serving(
        tiny_model,
        "--dtype",
        "float32",
        "--max-num-seqs",
        "4",
        "--max-queue-len",
        "4",
        "--health-check-timeout",
        "1",
        "--enable-store",
        *ALL_FRONTENDS,
    ) as live:
        yield live
        assert live.process.poll() is None, f"the server died during the tests:\n{live.log()[-5000:]}"


def test_requests_beyond_capacity_are_refused_at_once_with_503_and_counted(capped_server, tiny_model):
    url = capped_server.url
    wait_idle(url)
    before = scrape(url)
    sent = 40
    result = burst(
        url,
        sent,
        probes=[("/v1/messages", anthropic_body(tiny_model)), ("/invocations", {"prompt": "x", "max_tokens": 1})],
        max_running=4,
    )
    print(
        f"\n[figure] overload 503: sent={sent} accepted={result.accepted} refused={len(result.refused)} "
        f"lost={len(result.lost)} slowest refusal={max(result.refusal_seconds, default=0):.2f} s"
    )
    assert not result.lost, result.lost
    assert result.accepted == CAPACITY and len(result.refused) == sent - CAPACITY
    for response in result.refused:
        check_refusal(response, 503, "service_unavailable_error")
    assert max(result.refusal_seconds) < 5, result.refusal_seconds
    # while full: the engine holds exactly the admitted requests, and a non-streamed request is refused too
    assert result.held_load["running"] == 4 and result.held_load["waiting"] == 4, result.held_load
    check_refusal(result.refused_while_full, 503, "service_unavailable_error")
    # the other front-ends at capacity: Anthropic's 529 overloaded_error, SageMaker's OpenAI-shaped 503
    messages, invocations = result.probes
    check_anthropic_error(messages, 529, "overloaded_error")
    assert int(messages.headers["retry-after"]) >= 1
    check_refusal(invocations, 503, "service_unavailable_error")
    wait_idle(url)
    after = scrape(url)
    rejected = metric(after, "llmp_requests_rejected_total", reason="overloaded") - metric(
        before, "llmp_requests_rejected_total", reason="overloaded"
    )
    assert rejected == len(result.refused) + 3  # the burst's, the non-streamed one and the two probes
    # the slots come back: the next burst is admitted up to capacity again
    again = burst(url, CAPACITY + 1)
    assert again.accepted == CAPACITY and len(again.refused) == 1 and not again.lost
    wait_idle(url)


def test_a_batch_of_prompts_is_held_to_the_admission_bound(capped_server):
    """One completion request with 64 prompts is 64 engine requests: admitted whole, it would put 64
    requests in an engine that admission control promises never holds more than 8."""
    url = capped_server.url
    wait_idle(url)
    body = {"prompt": [[5 + i % 200, 6, 7] for i in range(64)], "max_tokens": LONG, "ignore_eos": True, "stream": True}
    peak = 0.0
    with httpx.Client(base_url=url, timeout=60) as http, http.stream("POST", "/v1/completions", json=body) as response:
        status = response.status_code
        if status == 200:
            wait_for(
                lambda: sum(v for k, v in load(url).items() if k != "kv") > 0, 30, "the prompts to reach the engine"
            )
            for _ in range(5):
                now = load(url)
                peak = max(peak, now["running"] + now["waiting"])
        else:
            response.read()
            if status == 503:
                check_refusal(response, 503, "service_unavailable_error")
            else:
                assert_openai_error(response, 400, param="prompt")
    wait_idle(url, timeout=30)
    print(f"\n[figure] a 64-prompt completion: status {status}, engine peak {peak:.0f} requests (bound {CAPACITY})")
    assert peak <= CAPACITY, f"one request put {peak:.0f} requests in the engine (bound {CAPACITY})"


def test_background_responses_are_held_to_the_admission_bound(capped_server):
    """Background responses answer at once and generate afterwards: they must still count as in flight."""
    url = capped_server.url
    wait_idle(url)
    started: list[str] = []
    statuses: list[int] = []
    peak = 0.0
    try:
        with httpx.Client(base_url=url, timeout=60) as http:
            for _ in range(CAPACITY + 4):
                response = http.post(
                    "/v1/responses",
                    json={"input": "hi", "background": True, "ignore_eos": True, "max_output_tokens": LONG},
                )
                statuses.append(response.status_code)
                if response.status_code == 200:
                    started.append(response.json()["id"])
                else:
                    check_refusal(response, 503, "service_unavailable_error")
            for _ in range(5):
                now = load(url)
                peak = max(peak, now["running"] + now["waiting"])
    finally:
        with httpx.Client(base_url=url, timeout=60) as http:
            for response_id in started:
                http.post(f"/v1/responses/{response_id}/cancel")
        wait_idle(url, timeout=30)
    print(f"\n[figure] {CAPACITY + 4} background responses: statuses {statuses}, engine peak {peak:.0f}")
    assert peak <= CAPACITY, f"background responses put {peak:.0f} requests in the engine (bound {CAPACITY})"


def test_a_hung_engine_fails_readiness_within_the_probe_timeout_and_recovers(capped_server):
    url = capped_server.url
    assert httpx.get(f"{url}/ready", timeout=10).status_code == 200
    engine = engine_pid(capped_server.process.pid)

    async def probes(count: int) -> list[tuple[float, httpx.Response]]:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:

            async def one() -> tuple[float, httpx.Response]:
                started = time.monotonic()
                response = await client.get("/ready")
                return time.monotonic() - started, response

            return await asyncio.gather(*(one() for _ in range(count)))

    os.kill(engine, signal.SIGSTOP)
    try:
        stopped = time.monotonic()
        first = httpx.get(f"{url}/ready", timeout=30)
        detected_s = time.monotonic() - stopped
        concurrent = asyncio.run(probes(10))  # they share one ping: none waits longer than the timeout
        live_started = time.monotonic()
        live = httpx.get(f"{url}/live", timeout=30)
        live_s = time.monotonic() - live_started
    finally:
        os.kill(engine, signal.SIGCONT)
    print(
        f"\n[figure] SIGSTOPped engine: /ready 503 after {detected_s:.2f} s (--health-check-timeout 1); "
        f"slowest of 10 concurrent probes {max(s for s, _ in concurrent):.2f} s"
    )
    for response in [first, *(r for _, r in concurrent)]:
        error = assert_openai_error(response, 503, contains="did not answer a ping within 1 s")
        assert error["type"] == "service_unavailable_error"
        assert response.headers["retry-after"] == "1"
    assert detected_s < 1 + 2, detected_s
    assert max(s for s, _ in concurrent) < 1 + 2
    assert live.status_code == 200 and live_s < 0.5
    # SIGCONT: ready again, and serving
    wait_for(lambda: httpx.get(f"{url}/ready", timeout=10).status_code == 200, 15, "readiness after SIGCONT")
    response = httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=60)
    assert response.status_code == 200, response.text


def test_metrics_answer_within_the_probe_timeout_while_the_engine_is_hung(capped_server):
    url = capped_server.url
    wait_for(lambda: httpx.get(f"{url}/ready", timeout=10).status_code == 200, 15, "readiness")
    engine = engine_pid(capped_server.process.pid)
    os.kill(engine, signal.SIGSTOP)
    try:
        started = time.monotonic()
        try:
            status = httpx.get(f"{url}/metrics", timeout=4).status_code
        except httpx.ReadTimeout:
            status = None
        elapsed = time.monotonic() - started
    finally:
        os.kill(engine, signal.SIGCONT)
        wait_for(lambda: httpx.get(f"{url}/ready", timeout=15).status_code == 200, 20, "readiness after SIGCONT")
    assert status == 200 and elapsed < 1 + 2, (status, elapsed)
