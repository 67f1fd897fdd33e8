"""``llmp serve --api-server-count 2``: two API-server processes on one port sharing one engine.

One server for the module: 200 concurrent streams all answered in full by both processes, with
``/metrics`` summing the two; a killed API server restarted while the other serves; SIGTERM
leaving no process behind. The tests run in order (the last one stops the server)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from llmp.testing import LiveServer, pid_alive, save_tiny_llama, serving

pytestmark = pytest.mark.slow

STREAMS = 200
MAX_TOKENS = 4
SUCCESS = re.compile(r"^llmp_request_success_total\{[^}]*\} ([\d.e+]+)$", re.M)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-llama-api-servers")
    save_tiny_llama(path, vocab_size=400)
    return path


@pytest.fixture(scope="module")
def server(model_dir: Path) -> Iterator[LiveServer]:
    args = ("--api-server-count", "2", "--dtype", "float32", "--max-model-len", "128", "--enable-admin-api")
    with serving(model_dir, *args) as live:
        _wait_for_line(live, "llmp: ready")
        yield live


def _wait_for_line(server: LiveServer, text: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while text not in server.log():
        assert time.monotonic() < deadline, f"no {text!r} in the log within {timeout} s:\n{server.log()}"
        time.sleep(0.1)


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _api_servers(server: LiveServer) -> list[int]:
    return [pid for pid in _children(server.process.pid) if "llmp.server.api_server" in _cmdline(pid)]


def _successes(server: LiveServer) -> float:
    response = httpx.get(f"{server.url}/metrics", timeout=10)
    assert response.status_code == 200, response.text
    return sum(float(value) for value in SUCCESS.findall(response.text))


async def _stream(client: httpx.AsyncClient, url: str, i: int) -> tuple[int, str | None]:
    """One streamed completion: the tokens it received and its finish reason."""
    body = {"prompt": f"request {i}", "max_tokens": MAX_TOKENS, "ignore_eos": True, "stream": True}
    tokens, reason, done = 0, None, False
    async with client.stream("POST", f"{url}/completions", json=body) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                continue
            choice = json.loads(line[6:])["choices"][0]
            tokens += 1 if choice["text"] or choice.get("finish_reason") is None else 0
            reason = choice.get("finish_reason") or reason
    assert done, f"stream {i} ended without [DONE]"
    return tokens, reason


async def _streams(url: str, count: int) -> list[tuple[int, str | None]]:
    limits = httpx.Limits(max_connections=count, max_keepalive_connections=count)
    async with httpx.AsyncClient(limits=limits, timeout=120) as client:
        return await asyncio.gather(*(_stream(client, url, i) for i in range(count)))


def test_two_api_servers_answer_every_stream_and_metrics_sum_both(server: LiveServer):
    assert len(_api_servers(server)) == 2, server.log()
    assert server.log().count("llmp: ready") == 1, server.log()  # printed once, by the launcher
    assert server.log().count("the management routes are on") == 1, server.log()  # so is this warning
    metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
    # the same series as with one API server: every reason at 0 from the start, no *_created
    for reason in ('finished_reason="stop"', 'finished_reason="length"', 'finished_reason="abort"'):
        assert re.search(rf"^llmp_request_success_total{{.*{reason}.*}} 0.0$", metrics, re.M), reason
    assert re.search(r'^llmp_requests_rejected_total{.*reason="overloaded".*} 0.0$', metrics, re.M), metrics
    assert "_created" not in metrics
    before = _successes(server)
    results = asyncio.run(_streams(server.api_url, STREAMS))
    assert [reason for _, reason in results] == ["length"] * STREAMS
    # both processes took a share (each one's access log lines carry its index)
    per_process = [
        len(re.findall(rf'\[api-server {i}\] [\d.:]+ - "POST /v1/completions HTTP/1.1" 200', server.log()))
        for i in (0, 1)
    ]
    assert sum(per_process) == STREAMS and min(per_process) > 0, per_process
    # one scrape (answered by either process) counts the requests of both
    assert _successes(server) - before == STREAMS, per_process


def test_a_killed_api_server_is_restarted_while_the_other_serves(server: LiveServer):
    before = _successes(server)
    victim, survivor = _api_servers(server)
    os.kill(victim, signal.SIGKILL)
    _wait_for_line(server, "restarting it")
    assert re.search(rf"ERROR llmp.server: API server \d \(pid {victim}\) exited \(killed by signal 9\)", server.log())
    for i in range(5):  # meanwhile the survivor takes every connection
        response = httpx.post(f"{server.api_url}/completions", json={"prompt": f"x {i}", "max_tokens": 2}, timeout=60)
        assert response.status_code == 200, response.text
    _wait_for_line(server, "restarted and serving")
    now = _api_servers(server)
    assert len(now) == 2 and survivor in now and victim not in now, now
    results = asyncio.run(_streams(server.api_url, 20))
    assert [reason for _, reason in results] == ["length"] * 20
    assert _successes(server) - before == 25  # the dead process's counts are kept too
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200
    # one stopped on purpose (it drains and exits 0) is restarted too, with a warning, not an error
    os.kill(survivor, signal.SIGTERM)
    _wait_for_line(server, f"(pid {survivor}) exited (exit status 0): restarting it")
    assert re.search(rf"WARNING llmp.server: API server \d \(pid {survivor}\) exited \(exit status 0\)", server.log())
    deadline = time.monotonic() + 60
    while server.log().count("restarted and serving") < 2:
        assert time.monotonic() < deadline, server.log()
        time.sleep(0.1)
    assert server.log().count("the management routes are on") == 1, server.log()  # not again on restarts


def test_sigterm_stops_every_process(server: LiveServer):
    processes = [server.process.pid, *_api_servers(server)]
    processes += [pid for pid in _children(server.process.pid) if "llmp.engine.core_proc" in _cmdline(pid)]
    assert len(processes) == 4, processes  # the launcher, two API servers, the engine
    restarts = server.log().count("restarting it")
    assert server.stop() == 0, server.log()
    deadline = time.monotonic() + 10
    while any(pid_alive(pid) for pid in processes) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in processes if pid_alive(pid)], server.log()
    assert "shutting down 2 API servers" in server.log()
    assert server.log().count("restarting it") == restarts  # nothing is restarted during shutdown


def test_a_killed_launcher_takes_its_api_servers_at_once(tmp_path: Path):
    # an API server's first act (_die_with_launcher), under a stand-in launcher that is then SIGKILLed
    child = (
        "from llmp.server.api_server import _die_with_launcher; _die_with_launcher(); "
        "print('armed', flush=True); import time; time.sleep(60)"
    )
    launcher = (
        "import subprocess, sys, time; "
        f"p = subprocess.Popen([sys.executable, '-c', {child!r}]); print(p.pid, flush=True); time.sleep(60)"
    )
    process = subprocess.Popen([sys.executable, "-c", launcher], stdout=subprocess.PIPE, text=True)
    pid = int(process.stdout.readline())
    assert process.stdout.readline() == "armed\n"
    process.kill()
    process.wait()
    started = time.monotonic()
    while pid_alive(pid) and time.monotonic() - started < 5:
        time.sleep(0.02)
    assert not pid_alive(pid)
    assert time.monotonic() - started < 1.0


def test_directories_of_launchers_that_are_gone_are_removed(tmp_path: Path):
    from llmp.server.api_servers import remove_stale_workdirs

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    stale = tmp_path / f"llmp-api-servers-{gone.pid}-x1"
    live = tmp_path / f"llmp-api-servers-{os.getpid()}-x2"
    other = tmp_path / "llmp-api-servers-unnamed"  # no pid in its name: not ours to judge
    for folder in (stale, live, other):
        (folder / "metrics").mkdir(parents=True)
        (folder / "metrics" / "counter_1.db").write_bytes(b"x")
    assert remove_stale_workdirs(str(tmp_path)) == [stale]
    assert not stale.exists() and live.exists() and other.exists()


def test_more_api_servers_than_cpus_is_a_warning(caplog: pytest.LogCaptureFixture):
    from dataclasses import replace

    from llmp.options import ServerOptions
    from llmp.server.api_servers import check_api_servers
    from llmp.server.settings import ServeSettings

    cpus = os.cpu_count() or 1
    with caplog.at_level("WARNING", logger="llmp.server"):
        check_api_servers(ServeSettings(server=replace(ServerOptions(), api_server_count=cpus)))
        assert not caplog.messages
        check_api_servers(ServeSettings(server=replace(ServerOptions(), api_server_count=cpus + 1)))
    [line] = caplog.messages
    assert f"--api-server-count {cpus + 1} is more than the {cpus} CPUs" in line


def test_grpc_with_several_api_servers_is_one_usage_line(model_dir: Path):
    result = subprocess.run(
        [sys.executable, "-m", "llmp", "serve", str(model_dir), "--api-server-count", "2", "--frontend", "grpc"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("llmp: error: --frontend grpc listens on a port of its own"), result.stderr
    assert "Traceback" not in result.stderr
