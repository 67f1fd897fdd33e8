"""`llmp bench serve` as a real subprocess against a real `llmp serve` of a tiny model.

A stand-in peer (FastAPI + uvicorn on loopback) covers what the real server
never does: cutting streams off mid-way, and streaming without a usage chunk.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from fastapi import Request  # at module level: FastAPI resolves the string annotations here

from llmp.cli.bench_cmd import BenchServeSettings, make_prompts, percentile
from llmp.testing import LiveServer, free_port, run_llmp, save_tiny_llama, serving

OUTPUT_LEN = 4
SMALL = ("--input-len", "8", "--output-len", str(OUTPUT_LEN))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    model_dir = tmp_path_factory.mktemp("tiny-llama")
    save_tiny_llama(model_dir)
    with serving(model_dir) as live:
        yield live


def bench(*args: str, check: bool = True) -> tuple[dict[str, Any], Any]:
    result = run_llmp("bench", "serve", "--json", *args, check=check, env={"OPENAI_API_KEY": ""})
    assert "Traceback" not in result.stderr
    return json.loads(result.stdout), result


def assert_clean_run(report: dict[str, Any], num_prompts: int) -> None:
    assert report["successful"] == num_prompts and report["failed"] == 0 and report["first_error"] is None
    assert report["total_output_tokens"] == num_prompts * OUTPUT_LEN  # ignore_eos: every request runs to max_tokens
    assert report["total_input_tokens"] > 0 and report["duration_s"] > 0
    for key in ("request_throughput", "output_throughput", "total_token_throughput"):
        assert report[key] > 0, key
    assert report["total_token_throughput"] > report["output_throughput"]
    for stat in ("mean", "median", "p99"):
        assert 0 < report[f"{stat}_ttft_ms"] <= report[f"{stat}_e2el_ms"]
        assert report[f"{stat}_tpot_ms"] > 0 and report[f"{stat}_itl_ms"] > 0


def test_completions_with_a_concurrency_cap(server: LiveServer, tmp_path: Path) -> None:
    saved = tmp_path / "result.json"
    report, _ = bench(
        "--url", server.url, "--num-prompts", "8", "--max-concurrency", "4", *SMALL, "--save-result", str(saved)
    )
    assert_clean_run(report, 8)
    assert report["max_concurrency"] == 4 and report["request_rate"] == "inf"
    assert report["endpoint"] == "/v1/completions" and report["model"]
    assert json.loads(saved.read_text()) == report


def test_chat_endpoint_with_the_prefix_dataset(server: LiveServer) -> None:
    report, _ = bench(
        "--base-url",
        server.url,
        "--endpoint",
        "/v1/chat/completions",
        "--dataset",
        "prefix",
        "--prefix-len",
        "16",
        "--num-prompts",
        "4",
        *SMALL,
    )
    assert_clean_run(report, 4)
    assert report["dataset"] == "prefix"


def test_poisson_arrivals_and_the_table(server: LiveServer) -> None:
    report, _ = bench("--url", server.url, "--request-rate", "20", "--num-prompts", "6", *SMALL)
    assert_clean_run(report, 6)
    assert report["request_rate"] == 20
    table = run_llmp("bench", "serve", "--url", server.url, "--num-prompts", "2", *SMALL).stdout
    for label in ("Successful requests", "Output token throughput", "Time to first token", "End-to-end latency"):
        assert label in table


def test_vllms_percentiles_metrics_and_goodput(server: LiveServer) -> None:
    args = ("--url", server.url, "--num-prompts", "6", *SMALL, "--percentile-metrics", "ttft,e2el")
    report, _ = bench(*args, "--metric-percentiles", "50,99.9", "--goodput", "ttft:60000", "--goodput", "e2el:0.001")
    for name in ("ttft", "e2el"):
        assert report[f"mean_{name}_ms"] > 0 and report[f"std_{name}_ms"] >= 0
        assert report[f"p50_{name}_ms"] == report[f"median_{name}_ms"]  # vLLM's keys: p50, p99.9
        assert report[f"p50_{name}_ms"] <= report[f"p99.9_{name}_ms"]
    assert not any(key.endswith(("_tpot_ms", "_itl_ms")) for key in report)  # only the metrics asked for
    assert "p99_ttft_ms" not in report
    assert report["request_goodput"] == 0  # no request ends within a microsecond: none meets both objectives
    generous, _ = bench("--url", server.url, "--num-prompts", "4", *SMALL, "--goodput", "tpot:60000")
    assert generous["request_goodput"] == pytest.approx(generous["request_throughput"])
    table = run_llmp("bench", "serve", "--url", server.url, "--num-prompts", "2", *SMALL, "--goodput", "e2el:60000")
    assert "Request goodput (req/s; e2el:60000 ms)" in table.stdout and "Inter-token latency, std (ms)" in table.stdout


def on_a_terminal(*args: str) -> tuple[str, str, int]:
    """``llmp ARGS`` with stderr on a pseudo-terminal: what the terminal showed, stdout, the exit status."""
    import os
    import pty
    import subprocess
    import sys

    master, slave = pty.openpty()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMP_")} | {"TERM": "xterm", "COLUMNS": "100"}
    process = subprocess.Popen(
        [sys.executable, "-m", "llmp", *args], stdout=subprocess.PIPE, stderr=slave, env=env, text=True
    )
    os.close(slave)
    screen = b""
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        screen += data
    stdout = process.stdout.read() if process.stdout else ""
    os.close(master)
    return screen.decode(errors="replace"), stdout, process.wait(60)


def test_progress_shows_on_a_terminal_and_the_report_is_unchanged(server: LiveServer) -> None:
    screen, stdout, status = on_a_terminal(
        "bench", "serve", "--url", server.url, "--num-prompts", "6", "--max-concurrency", "2", *SMALL, "--json"
    )
    assert status == 0, screen
    assert "6/6" in screen and "output tok/s" in screen and "requests" in screen  # the bar, at its end
    assert_clean_run(json.loads(stdout), 6)
    piped = run_llmp("bench", "serve", "--url", server.url, "--num-prompts", "2", *SMALL, "--json")
    assert "tok/s" not in piped.stderr  # no bar off a terminal (and no plain line in so short a run)


def test_a_dead_server_is_found_before_the_run() -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    for named in ((), ("--model", "any")):  # the model is checked against GET /v1/models even when named
        started = time.monotonic()
        result = run_llmp("bench", "serve", "--url", dead, *named, "--num-prompts", "5", check=False)
        assert result.returncode == 1 and "Traceback" not in result.stderr and result.stdout == ""
        assert result.stderr.strip().splitlines() == [
            f"llmp: error: cannot connect to {dead}/v1/models: Connection refused: no server is running at {dead} "
            "(start one with `llmp serve MODEL`, or check --url)"
        ]
        assert time.monotonic() - started < 30


def test_bad_options_are_usage_errors() -> None:
    for bad in (
        ("--dataset", "sharegpt"),
        ("--input-len", "0"),
        ("--output-len", "0"),
        ("--percentile-metrics", "ttft,latency"),
        ("--metric-percentiles", "0"),
        ("--metric-percentiles", "fifty"),
        ("--goodput", "itl:5"),
        ("--goodput", "ttft:-1"),
    ):
        result = run_llmp("bench", "serve", *bad, check=False)
        assert result.returncode == 2 and bad[0].lstrip("-") in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--endpoint", "nosuch"), "--endpoint 'nosuch' is not one bench serve sends; "),
        (("--endpoint", "/v1/embeddings"), "it sends /v1/completions or /v1/chat/completions"),
        (("--model", "nosuch"), "--model 'nosuch' is not served at {url}/v1/models, which lists: flaky"),
        (("--save-result", "/nonexistent/dir/x.json"), "the directory /nonexistent/dir does not exist"),
        (("--save-result", "/tmp"), "--save-result /tmp: is a directory"),
    ],
    ids=["endpoint", "embeddings", "model", "save-result", "save-to-a-directory"],
)
def test_argument_problems_are_found_before_any_request(args: tuple[str, ...], message: str) -> None:
    posts: list[dict[str, Any]] = []
    with flaky_peer(posts=posts) as url:
        result = run_llmp("bench", "serve", "--url", url, *args, "--num-prompts", "20", *SMALL, check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("llmp: error: ") and message.format(url=url) in lines[0], lines
    assert posts == []  # no load was sent


# -- a peer that cuts streams off --------------------------------------------------


def flaky_peer_app(words_per_reply: int, posts: list[dict[str, Any]]) -> Any:
    """An OpenAI-style completions server that cuts every second stream off after two chunks and sends no
    usage; each request's body is appended to ``posts``."""
    from fastapi import FastAPI
    from fastapi.responses import StreamingResponse

    app = FastAPI()
    requests = iter(range(10**6))

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": "flaky", "object": "model"}]}

    @app.post("/v1/completions")
    async def completions(request: Request) -> StreamingResponse:
        body = await request.json()
        posts.append(body)
        cut = next(requests) % 2 == 1

        async def events() -> AsyncIterator[str]:
            for i in range(min(body["max_tokens"], words_per_reply)):
                if cut and i == 2:
                    raise ConnectionAbortedError("cut off mid-stream")  # uvicorn drops the connection
                yield f"data: {json.dumps({'choices': [{'index': 0, 'text': f' w{i}'}]})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


@contextmanager
def flaky_peer(words_per_reply: int = 100, posts: list[dict[str, Any]] | None = None) -> Iterator[str]:
    import uvicorn

    port = free_port()
    app = flaky_peer_app(words_per_reply, [] if posts is None else posts)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def test_streams_cut_off_mid_way_are_counted_as_failures() -> None:
    with flaky_peer() as url:
        report, result = bench("--base-url", url, "--num-prompts", "6", "--max-concurrency", "2", *SMALL, check=False)
    assert result.returncode == 1
    assert report["model"] == "flaky" and report["successful"] == 3 and report["failed"] == 3
    assert "peer closed connection" in report["first_error"]
    # No usage chunk: a streamed chunk counts as a token, a prompt's words as its input tokens.
    assert report["total_output_tokens"] == 3 * OUTPUT_LEN and report["total_input_tokens"] == 3 * 8


# -- the prompts and the statistics --------------------------------------------------


def test_prompts_are_seeded_and_the_prefix_dataset_shares_a_prefix() -> None:
    settings = BenchServeSettings(num_prompts=5, input_len=12, prefix_len=30, dataset="prefix", seed=3)
    prompts = make_prompts(settings)
    assert prompts == make_prompts(settings) and len(set(prompts)) == 5
    assert len({tuple(p.split()[:30]) for p in prompts}) == 1
    assert all(len(p.split()) == 42 for p in prompts)
    random = make_prompts(BenchServeSettings(num_prompts=5, input_len=12, seed=3))
    assert all(len(p.split()) == 12 for p in random)
    assert random != make_prompts(BenchServeSettings(num_prompts=5, input_len=12, seed=4))


def test_percentile_interpolates_like_numpy() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.5 and percentile(values, 99) == pytest.approx(99.01)
    assert percentile([7.0], 99) == 7.0
