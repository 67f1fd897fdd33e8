"""Clients that go away (cases 1-3 of the reliability table): a running stream, a queued non-streamed
request, a queued stream, a request in the middle of its prefill, and a storm of impatient clients.
Each is aborted in the engine: running and waiting requests return to 0 and the KV cache is freed,
and the clients that stayed are served as if nothing happened.

The server (``main_server``) runs one request at a time (``--max-num-seqs 1``), so a second request
queues, and prefills 16 tokens a step, so a 2000-token prompt stays in prefill for a while.
"""

from __future__ import annotations

import asyncio
import json
import random
import time

import httpx
from reliability_support import (
    LONG,
    chat_body,
    holds,
    load,
    metric,
    raw_post,
    read_until_content,
    scrape,
    wait_for,
    wait_idle,
)


def test_queued_and_running_disconnects_are_aborted_and_the_stream_that_stays_is_unaffected(main_server):
    url, port = main_server.url, main_server.port
    wait_idle(url)
    before = scrape(url)
    long = {"max_tokens": LONG, "ignore_eos": True, "temperature": 0}
    with (
        httpx.Client(base_url=url, timeout=60) as http,
        httpx.Client(base_url=url, timeout=60) as other,
        http.stream("POST", "/v1/chat/completions", json=chat_body("The quick", stream=True, **long)) as kept,
    ):
        assert kept.status_code == 200
        lines = kept.iter_lines()
        read_until_content(lines)  # the kept stream holds the only running slot
        assert load(url)["running"] == 1

        queued_call = raw_post(port, "/v1/completions", {"prompt": "Paged attention", **long})
        wait_for(lambda: load(url)["waiting"] == 1, 30, "the non-streamed request to queue")
        with other.stream("POST", "/v1/completions", json={"prompt": "Continuous", "stream": True, **long}) as q:
            assert q.status_code == 200  # streams answer at once, queued or not
            wait_for(lambda: load(url)["waiting"] == 2, 30, "the streamed request to queue")
        # the queued stream is closed by its client; now the queued non-streamed one
        queued_call.close()
        wait_for(
            lambda: holds(url, waiting=0, running=1),
            10,
            "both queued requests to be aborted while the kept stream runs on",
        )

        # the kept stream is unaffected: it keeps streaming text
        more = read_until_content(lines, count=5)
        payloads = [json.loads(line[6:]) for line in more if line.startswith("data: {")]
        assert payloads and not any("error" in p for p in payloads), more
        assert not any(c.get("finish_reason") for p in payloads for c in p["choices"])
    # ... until its client closes it, mid-stream
    idle = wait_idle(url, timeout=15)
    after = scrape(url)
    assert idle == {"running": 0, "waiting": 0, "kv": 0}
    generated = metric(after, "llmp_generation_tokens_total") - metric(before, "llmp_generation_tokens_total")
    assert generated < LONG, f"{generated} tokens generated: some request ran to its end"
    assert metric(after, "llmp_request_failure_total") == metric(before, "llmp_request_failure_total")
    # the mid-stream abort is counted as such
    abort = {"finished_reason": "abort"}
    assert (
        metric(after, "llmp_request_success_total", **abort) - metric(before, "llmp_request_success_total", **abort)
        >= 1
    )
    # and the server serves the next client normally
    response = httpx.post(
        f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 3, "ignore_eos": True}, timeout=60
    )
    assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 3


def prefilling(text: str) -> str | None:
    """The scrape ``text`` when it shows one running request holding KV blocks, else None."""
    running = metric(text, "llmp_num_requests_running") == 1
    return text if running and metric(text, "llmp_kv_cache_usage_perc") > 0 else None


def test_a_disconnect_in_the_middle_of_the_prefill_aborts_it(main_server):
    url, port = main_server.url, main_server.port
    # the disconnect must land while the prompt is still prefilling; on a fast, idle CPU the whole
    # prefill can end between two polls, so a lost race (seen: a first token) is tried again
    for _attempt in range(4):
        wait_idle(url)
        before = scrape(url)
        rng = random.Random(time.monotonic_ns())  # a prompt the prefix cache has never seen
        prompt = [rng.randrange(3, 500) for _ in range(2000)]
        sock = raw_post(port, "/v1/completions", {"prompt": prompt, "max_tokens": 5, "ignore_eos": True})
        try:
            # one scrape a poll, and the socket closed right after the scrape that shows the prompt
            # in prefill: every scrape between that sight and the close widens the race
            during = wait_for(lambda: prefilling(scrape(url)), 30, "the long prompt to be in prefill", interval=0.005)
        finally:
            sock.close()
        # no token yet when the client went away: the request was still prefilling
        in_prefill = metric(during, "llmp_time_to_first_token_seconds_count") == metric(
            before, "llmp_time_to_first_token_seconds_count"
        )
        if in_prefill:
            break
    else:
        raise AssertionError("the prefill ended before the test could disconnect, four times")
    wait_idle(url, timeout=15)
    after = scrape(url)
    for name in ("llmp_time_to_first_token_seconds_count", "llmp_generation_tokens_total", "llmp_prompt_tokens_total"):
        assert metric(after, name) == metric(before, name), f"{name}: the aborted prefill went on to generate"
    assert metric(after, "llmp_request_failure_total") == metric(before, "llmp_request_failure_total")


def test_a_timeout_storm_leaves_the_server_fast_for_the_next_request(main_server):
    """40 clients ask for 1500 tokens each (half of them streamed) and give up after 0.5 s; with one
    request running at a time, a small request after them is fast only if all 40 were aborted."""
    url = main_server.url
    wait_idle(url)
    before = scrape(url)
    storm = 40

    async def impatient(client: httpx.AsyncClient, i: int) -> str:
        body = {"prompt": f"storm {i}", "max_tokens": LONG, "ignore_eos": True}

        async def call() -> str:
            if i % 2:
                async with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as response:
                    async for _ in response.aiter_lines():
                        pass
                    return str(response.status_code)
            return str((await client.post("/v1/completions", json=body)).status_code)

        try:
            return await asyncio.wait_for(call(), 0.5)
        except TimeoutError:
            return "gave up"

    async def run() -> list[str]:
        limits = httpx.Limits(max_connections=storm + 8, max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
            return await asyncio.gather(*(impatient(client, i) for i in range(storm)))

    outcomes = asyncio.run(run())
    assert outcomes == ["gave up"] * storm, outcomes

    started = time.monotonic()
    response = httpx.post(
        f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 5, "ignore_eos": True}, timeout=60
    )
    small_s = time.monotonic() - started
    print(f"\n[figure] small request after a storm of {storm} abandoned requests: {small_s:.2f} s")
    assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 5
    assert small_s < 5, f"the small request took {small_s:.1f} s after the storm"
    wait_idle(url, timeout=15)
    after = scrape(url)
    generated = metric(after, "llmp_generation_tokens_total") - metric(before, "llmp_generation_tokens_total")
    assert generated < storm * LONG / 10, f"{generated} tokens were generated for abandoned requests"
    assert metric(after, "llmp_request_failure_total") == metric(before, "llmp_request_failure_total")
