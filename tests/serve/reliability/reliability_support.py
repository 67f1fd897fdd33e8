"""Helpers of the reliability suite: metrics, server-sent events, raw sockets, process trees, polling.

conftest.py puts this folder on ``sys.path``; the tests import from here.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from llmp.testing import assert_openai_error, child_environment

KEY = "Secret-Key-42"  # mixed case: its lower- and upper-cased forms are wrong keys
OK_ORIGIN = "https://ok.example"
EVIL_ORIGIN = "https://evil.example"
LONG = 1500  # max_tokens of a request meant to run until the test stops it (the model holds 2048 positions)


# -- polling ---------------------------------------------------------------------------------------


def wait_for(condition: Callable[[], Any], timeout: float, what: str, interval: float = 0.02) -> Any:
    """Poll ``condition`` until it returns something truthy (returned); fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = condition()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"not within {timeout:g} s: {what} (last: {last!r})")


# -- metrics ---------------------------------------------------------------------------------------


def scrape(url: str, timeout: float = 30) -> str:
    response = httpx.get(f"{url}/metrics", timeout=timeout)
    assert response.status_code == 200, response.text
    return response.text


def metric(text: str, name: str, **labels: str) -> float:
    """The sum of the samples called ``name`` whose labels include ``labels`` (0 when there is none)."""
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def load(url: str) -> dict[str, float]:
    """What the engine holds now: running and waiting requests, KV-cache use."""
    text = scrape(url)
    return {
        "running": metric(text, "llmp_num_requests_running"),
        "waiting": metric(text, "llmp_num_requests_waiting"),
        "kv": metric(text, "llmp_kv_cache_usage_perc"),
    }


def holds(url: str, **expected: float) -> bool:
    """Whether the engine's load now has these figures (``running=1, waiting=0``)."""
    now = load(url)
    return all(now[k] == v for k, v in expected.items())


def wait_idle(url: str, timeout: float = 20) -> dict[str, float]:
    """Wait until the engine runs nothing, queues nothing and holds no KV blocks; the last figures."""
    seen: dict[str, float] = {}

    def idle() -> dict[str, float] | None:
        seen.update(load(url))
        return dict(seen) if not any(seen.values()) else None  # a dict of zeros is still truthy

    try:
        return wait_for(idle, timeout, "the engine to be idle", interval=0.1)
    except AssertionError:
        raise AssertionError(
            f"the engine was not idle within {timeout:g} s (running, waiting, KV use): {seen}"
        ) from None


# -- server-sent events ----------------------------------------------------------------------------


def data_lines(lines: Iterable[str]) -> list[str]:
    """The payloads of the ``data:`` lines of an event stream, in order."""
    return [
        line[len("data: ") :] if line.startswith("data: ") else line[len("data:") :]
        for line in lines
        if line.startswith("data:")
    ]


def read_until_content(lines: Iterator[str], count: int = 1) -> list[str]:
    """Read an OpenAI event stream until ``count`` chunks carrying text (or a finish) have come."""
    seen: list[str] = []
    got = 0
    for line in lines:
        seen.append(line)
        if not line.startswith("data: ") or line == "data: [DONE]":
            if line == "data: [DONE]":
                break
            continue
        chunk = json.loads(line[6:])
        if "error" in chunk:
            raise AssertionError(f"the stream failed: {chunk}")
        for choice in chunk.get("choices", []):
            if (choice.get("delta") or {}).get("content") or choice.get("text") or choice.get("finish_reason"):
                got += 1
        if got >= count:
            break
    return seen


def finish_reasons(payloads: list[str]) -> list[str]:
    reasons = []
    for payload in payloads:
        if payload == "[DONE]":
            continue
        for choice in json.loads(payload).get("choices", []):
            if choice.get("finish_reason"):
                reasons.append(choice["finish_reason"])
    return reasons


class StreamReader(threading.Thread):
    """Reads one streamed POST to the end in a thread: ``lines`` (non-empty) and ``status``."""

    def __init__(
        self, url: str, path: str, body: dict, headers: dict[str, str] | None = None, timeout: float = 120
    ) -> None:
        super().__init__(daemon=True)
        self.url, self.path, self.body, self.headers, self.timeout = url, path, body, headers or {}, timeout
        self.lines: list[str] = []
        self.status: int | None = None
        self.error: BaseException | None = None
        self.chunk_times: list[float] = []

    def run(self) -> None:
        try:
            with httpx.stream(
                "POST", self.url + self.path, json=self.body, headers=self.headers, timeout=self.timeout
            ) as response:
                self.status = response.status_code
                for line in response.iter_lines():
                    if line:
                        self.lines.append(line)
                        self.chunk_times.append(time.monotonic())
        except Exception as exc:  # noqa: BLE001 - a connection cut by the server shows here
            self.error = exc

    def content_chunks(self) -> int:
        count = 0
        for payload in data_lines(list(self.lines)):
            if payload == "[DONE]":
                continue
            try:
                chunk = json.loads(payload)
            except ValueError:
                continue
            for choice in chunk.get("choices", []):
                if (choice.get("delta") or {}).get("content") or choice.get("text"):
                    count += 1
            if chunk.get("type") in ("response.output_text.delta", "content_block_delta"):
                count += 1
        return count


class Call(threading.Thread):
    """One non-streamed POST in a thread: ``response`` or ``error``."""

    def __init__(
        self, url: str, path: str, body: dict, headers: dict[str, str] | None = None, timeout: float = 120
    ) -> None:
        super().__init__(daemon=True)
        self.url, self.path, self.body, self.headers, self.timeout = url, path, body, headers or {}, timeout
        self.response: httpx.Response | None = None
        self.error: BaseException | None = None
        self.elapsed: float | None = None

    def run(self) -> None:
        started = time.monotonic()
        try:
            self.response = httpx.post(self.url + self.path, json=self.body, headers=self.headers, timeout=self.timeout)
        except Exception as exc:  # noqa: BLE001 - the test inspects whatever happened
            self.error = exc
        self.elapsed = time.monotonic() - started


# -- raw sockets -----------------------------------------------------------------------------------


def raw_post(port: int, path: str, body: dict, headers: dict[str, str] | None = None) -> socket.socket:
    """Send a whole JSON POST on a fresh socket and return the socket, unread: closing it is the
    client going away, at a moment the test chooses."""
    payload = json.dumps(body).encode()
    head = [
        f"POST {path} HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        "Content-Type: application/json",
        f"Content-Length: {len(payload)}",
        *(f"{k}: {v}" for k, v in (headers or {}).items()),
    ]
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + payload)
    return sock


class SlowHeaderProbe(threading.Thread):
    """Slowloris: opens a connection and drips its request headers a byte per second, never finishing
    them, recording when (if ever, within ``limit`` seconds) the server closes the connection."""

    def __init__(self, port: int, limit: float = 20.0) -> None:
        super().__init__(daemon=True)
        self.port, self.limit = port, limit
        self.closed_after: float | None = None
        self.started_at = time.monotonic()

    def run(self) -> None:
        self.started_at = time.monotonic()
        try:
            sock = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        except OSError:
            return
        with sock:
            sock.settimeout(1.0)
            try:
                sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\nX-Drip: ".encode())
            except OSError:
                self.closed_after = time.monotonic() - self.started_at
                return
            while time.monotonic() - self.started_at < self.limit:
                try:
                    if sock.recv(4096) == b"":
                        self.closed_after = time.monotonic() - self.started_at
                        return
                    # an answer (408, 400...) counts as cut off too: the server did not wait for ever
                    self.closed_after = time.monotonic() - self.started_at
                    return
                except TimeoutError:
                    try:
                        sock.sendall(b"a")
                    except OSError:
                        self.closed_after = time.monotonic() - self.started_at
                        return
                except OSError:
                    self.closed_after = time.monotonic() - self.started_at
                    return


# -- processes -------------------------------------------------------------------------------------


def children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (FileNotFoundError, ProcessLookupError):
        return []


def descendants(pid: int) -> list[int]:
    found: list[int] = []
    for child in children(pid):
        found += [child, *descendants(child)]
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return ""


def engine_pid(server_pid: int) -> int:
    """The engine process: the server's child running ``llmp.engine.core_proc``."""
    engines = [pid for pid in children(server_pid) if "llmp.engine.core_proc" in cmdline(pid)]
    assert len(engines) == 1, f"expected one engine process under {server_pid}: {children(server_pid)}"
    return engines[0]


def start_serve(model: Path, port: int, *args: str, log_path: Path) -> subprocess.Popen:
    """``llmp serve`` as a bare process (for tests that watch it start, or take it down)."""
    env = child_environment()
    with open(log_path, "wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "llmp", "serve", str(model), "--host", "127.0.0.1", "--port", str(port), *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )


def status_or_error(method: str, url: str, timeout: float = 5, **kwargs: Any) -> int | str:
    """The status of one request, or the name of the connection error that replaced it."""
    try:
        return httpx.request(method, url, timeout=timeout, **kwargs).status_code
    except httpx.HTTPError as exc:
        return type(exc).__name__


def chat_body(content: str = "hi", **fields: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": content}], **fields}


# -- bursts past capacity ----------------------------------------------------------------------------


@dataclass
class Burst:
    accepted: int = 0
    refused: list[httpx.Response] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    refusal_seconds: list[float] = field(default_factory=list)
    held_load: dict[str, float] = field(default_factory=dict)
    refused_while_full: httpx.Response | None = None
    probes: list[httpx.Response] = field(default_factory=list)


def burst(
    url: str,
    count: int,
    headers: dict[str, str] | None = None,
    deadline: float = 60,
    probes: list[tuple[str, dict]] = (),
    max_running: int | None = None,
) -> Burst:
    """Open ``count`` long streams at once; hold the accepted ones until every request has its status,
    look at the engine (once it has scheduled up to ``max_running`` of them) and try one non-streamed
    request (and each of ``probes``: path, body) meanwhile, then close them all."""
    result = Burst()
    body = {"prompt": "The quick brown fox", "max_tokens": LONG, "ignore_eos": True, "stream": True}

    async def run() -> None:
        release = asyncio.Event()
        answered = asyncio.Semaphore(0)

        async def one(client: httpx.AsyncClient, i: int) -> None:
            started = time.monotonic()
            try:
                async with client.stream(
                    "POST", "/v1/completions", json={**body, "prompt": f"{i} {body['prompt']}"}, headers=headers
                ) as response:
                    if response.status_code == 200:
                        result.accepted += 1
                        answered.release()
                        await release.wait()  # held open: it stays in flight
                        return
                    await response.aread()
                    result.refusal_seconds.append(time.monotonic() - started)
                    result.refused.append(response)
                    answered.release()
            except Exception as exc:  # noqa: BLE001 - every way of getting no answer is "lost"
                result.lost.append(repr(exc))
                answered.release()

        limits = httpx.Limits(max_connections=count + 8, max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=url, timeout=deadline, limits=limits) as client:
            tasks = [asyncio.create_task(one(client, i)) for i in range(count)]
            try:

                async def all_answered() -> None:
                    for _ in range(count):
                        await answered.acquire()

                await asyncio.wait_for(all_answered(), deadline)
                # the last admitted request reaches the engine a moment after its headers
                result.held_load = await asyncio.to_thread(settled_load, url, result.accepted, max_running)
                result.refused_while_full = await client.post(
                    "/v1/completions", json={"prompt": "x", "max_tokens": 1}, headers=headers
                )
                for path, probe in probes:
                    result.probes.append(await client.post(path, json=probe, headers=headers))
            finally:
                release.set()
                _, pending = await asyncio.wait(tasks, timeout=30)
                for task in pending:
                    task.cancel()
                    result.lost.append("no answer")

    asyncio.run(run())
    return result


def settled_load(url: str, expected: int, max_running: int | None = None, timeout: float = 10) -> dict[str, float]:
    """The engine's load once it holds ``expected`` requests and, given ``max_running``, has had a step
    to move as many of them as it may into the running batch (or the last figures after ``timeout``).

    Requests that arrive together are queued first and scheduled at the engine's next step, so a scrape
    between the two sees them all waiting."""
    deadline = time.monotonic() + timeout
    running_wanted = min(expected, max_running) if max_running is not None else 0
    while True:
        now = load(url)
        held = now["running"] + now["waiting"] >= expected and now["running"] >= running_wanted
        if held or time.monotonic() > deadline:
            return now
        time.sleep(0.02)


def check_anthropic_error(response: httpx.Response, status: int, error_type: str) -> dict:
    """An error in the Anthropic front-end's shape: ``{"type": "error", "error": {"type", "message"}}``."""
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == error_type and body["error"]["message"], body
    return body["error"]


def anthropic_body(model: Path, content: str = "hi", **fields: Any) -> dict[str, Any]:
    """A Messages request to the server of ``model`` (its served name: the path; the API requires it)."""
    return {"model": str(model), "max_tokens": 4, "messages": [{"role": "user", "content": content}], **fields}


def check_refusal(response: httpx.Response, status: int, error_type: str) -> None:
    error = assert_openai_error(response, status, contains="capacity")
    assert error["code"] == "overloaded" and error["type"] == error_type, error
    assert int(response.headers["retry-after"]) >= 1, response.headers
