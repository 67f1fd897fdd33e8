"""The ``logging`` stat logger: vLLM's periodic statistics line in a real ``llmp serve`` log, on by
default, off with ``--disable-log-stats``; and the start-up summary in the same log."""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx
import pytest

from llmp import LLM
from llmp.testing import save_tiny_llama, serving

pytestmark = pytest.mark.slow

INTERVAL_S = 1.0
STATS = re.compile(
    r"INFO llmp.engine: Avg prompt throughput: ([\d.]+) tokens/s, Avg generation throughput: ([\d.]+) tokens/s, "
    r"Running: (\d+) reqs, Waiting: (\d+) reqs, KV cache usage: ([\d.]+)%, Prefix cache hit rate: ([\d.]+)%"
)
PROMPT = " ".join(f"w{i}" for i in range(40))  # several KV blocks: the second send hits the prefix cache


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-llama-log-stats")
    save_tiny_llama(path, vocab_size=400)
    return path


def _complete(url: str, count: int = 2) -> None:
    for _ in range(count):
        response = httpx.post(
            f"{url}/completions", json={"prompt": PROMPT, "max_tokens": 8, "ignore_eos": True}, timeout=60
        )
        assert response.status_code == 200, response.text


def _wait_for(server, pattern: re.Pattern, timeout: float = 30) -> list[re.Match]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = list(pattern.finditer(server.log()))
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"no line matching {pattern.pattern!r} within {timeout} s:\n{server.log()}")


def test_the_stats_line_follows_requests_then_stops_while_idle(model_dir):
    env = {"LLMP_LOG_STATS_INTERVAL": str(INTERVAL_S)}
    with serving(model_dir, "--dtype", "float32", "--block-size", "4", env=env) as server:
        time.sleep(3 * INTERVAL_S)
        assert not STATS.findall(server.log()), server.log()  # the server's warm-up request is not counted
        _complete(server.api_url)
        lines = [m.groups() for m in _wait_for(server, STATS)]
        deadline = time.monotonic() + 20
        # the stats line of the second request (the cache hit) may come an interval after the first's
        while not all(any(float(line[i]) > 0 for line in lines) for i in (0, 1, 5)) and time.monotonic() < deadline:
            time.sleep(0.2)
            lines = STATS.findall(server.log())
        assert any(float(line[0]) > 0 for line in lines), server.log()  # prompt tokens
        assert any(float(line[1]) > 0 for line in lines), server.log()  # generated tokens
        assert any(float(line[5]) > 0 for line in lines), server.log()  # the repeated prompt hit the cache
        time.sleep(3 * INTERVAL_S)  # one line of zeros shows the work stopped; then nothing while idle
        settled = STATS.findall(server.log())
        time.sleep(3 * INTERVAL_S)
        assert STATS.findall(server.log()) == settled
        assert settled[-1][:4] == ("0.0", "0.0", "0", "0")
        log = server.log()
    # the start-up summary: the engine's facts, then where it serves
    [summary] = [line for line in log.splitlines() if "engine ready in" in line]
    assert f"model {model_dir}, dtype float32, kernels " in summary
    assert re.search(r"kernels [\w-]+ \(\w+", summary) and "max model len 512" in summary
    assert re.search(r"KV cache (\d+) blocks × 4 = \d+ tokens", summary)
    assert f"at {server.url} (openai" in log
    assert "INFO llmp.engine: loading weights from" in log and "building the KV cache" in log
    assert "\x1b[" not in log.split("engine ready in")[0]  # a log file gets no bars


def test_an_aborted_stream_ends_the_lines_with_nothing_running(model_dir):
    """The client goes away mid-stream: the last line shows the request gone, then the lines stop."""
    env = {"LLMP_LOG_STATS_INTERVAL": str(INTERVAL_S)}
    with serving(model_dir, "--dtype", "float32", env=env) as server:
        body = {"prompt": "The quick", "max_tokens": 480, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{server.api_url}/completions", json=body, timeout=60) as response:
            assert response.status_code == 200
            next(line for line in response.iter_lines() if line.startswith("data: {"))
        _wait_for(server, STATS)
        time.sleep(3 * INTERVAL_S)
        settled = STATS.findall(server.log())
        time.sleep(3 * INTERVAL_S)
        assert STATS.findall(server.log()) == settled, server.log()
        assert settled[-1][:4] == ("0.0", "0.0", "0", "0"), server.log()
        metrics = httpx.get(f"{server.url}/metrics").text
        aborts = [line for line in metrics.splitlines() if 'finished_reason="abort"' in line]
        assert [line.split()[-1] for line in aborts if line.startswith("llmp_request_success_total")] == ["1.0"]
        assert re.search(r"^llmp_num_requests_running\{[^}]*\} 0.0$", metrics, re.M), metrics


def test_disable_log_stats_leaves_the_line_out(model_dir):
    env = {"LLMP_LOG_STATS_INTERVAL": str(INTERVAL_S)}
    with serving(model_dir, "--dtype", "float32", "--disable-log-stats", env=env) as server:
        _complete(server.api_url)
        time.sleep(3 * INTERVAL_S)
        assert "Avg prompt throughput" not in server.log()
        assert "engine ready in" in server.log()  # start-up is still reported


def test_offline_llm_logs_no_stats_unless_asked(model_dir):
    """As in vLLM: ``LLM`` shows a progress bar instead; ``disable_log_stats=False`` turns the line on."""
    quiet = LLM(str(model_dir), dtype="float32", max_model_len=64)
    assert "logging" not in dict(quiet.engine.stat_loggers.loggers)
    asked = LLM(str(model_dir), dtype="float32", max_model_len=64, disable_log_stats=False)
    assert type(dict(asked.engine.stat_loggers.loggers)["logging"]).__name__ == "LoggingStatLogger"
