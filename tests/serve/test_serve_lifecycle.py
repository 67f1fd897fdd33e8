"""`llmp serve` as a process: start-up probes, bad start-up input, settings sources, shutdown, engine death."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from llmp.testing import child_environment, free_port, pid_alive, save_tiny_llama, serving


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-llama")
    save_tiny_llama(path)
    return path


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _serve(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    child_env = child_environment()
    child_env.update(env or {})
    return subprocess.Popen(
        [sys.executable, "-m", "llmp", "serve", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=child_env,
    )


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        return []


def test_probes_answer_503_while_loading_then_200_and_one_ready_line(model_dir: Path) -> None:
    port = free_port()
    process = _serve(str(model_dir), "--port", str(port))
    url = f"http://127.0.0.1:{port}"
    seen: list[int] = []
    pings: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                status, body = _get(f"{url}/health")
            except OSError:
                time.sleep(0.02)
                continue
            seen.append(status)
            if status == 503:
                # which phase the first answered probe meets depends on the machine's speed
                assert json.loads(body)["error"]["message"] in {
                    f"not ready: {phase}" for phase in ("starting", "loading", "warming_up")
                }
                models_status, models_body = _get(f"{url}/v1/models")
                if models_status == 503:  # the engine may have become ready in between
                    assert json.loads(models_body)["error"]["code"] == 503
                assert _get(f"{url}/live")[0] == 200
                pings.append(_get(f"{url}/ping")[0])  # SageMaker's readiness, as vLLM's (not liveness)
            if status == 200:
                break
            time.sleep(0.05)
        assert seen and seen[0] == 503 and seen[-1] == 200, seen
        assert 503 in pings, pings  # while loading (the engine may become ready between two probes)
        assert _get(f"{url}/v1/models")[0] == 200
        ping = urllib.request.Request(f"{url}/ping", method="POST")
        with urllib.request.urlopen(ping, timeout=30) as answer:  # SageMaker may POST it
            assert answer.status == 200
    finally:
        process.send_signal(signal.SIGTERM)
        output = process.communicate(timeout=60)[0]
    assert process.returncode == 0, output
    assert output.count("llmp: ready in") == 1, output


@pytest.mark.parametrize(
    "args, message",
    [
        (["/nonexistent/model"], "not found"),
        (["--frontend", "no-such-frontend"], "no-such-frontend"),
        (["--chat-template", "/nonexistent/template.jinja"], "--chat-template"),
        (["--middleware", "no_such_module.Middleware"], "--middleware no_such_module.Middleware: cannot import"),
        (["--middleware", "json.dumps"], "--middleware json.dumps: must be a middleware class or an async function"),
    ],
)
def test_bad_start_up_input_exits_2_with_one_clear_line(args: list[str], message: str, model_dir: Path) -> None:
    if args[0].startswith("--"):
        args = [str(model_dir), *args]
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "llmp", "serve", *args, "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
    assert time.monotonic() - started < 30


def test_a_busy_port_exits_2_naming_it(model_dir: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "llmp", "serve", str(model_dir), "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr and "Traceback" not in result.stderr


def test_settings_from_environment_and_config_file(model_dir: Path, tmp_path: Path) -> None:
    config = tmp_path / "serve.yaml"
    config.write_text("served-model-name: from-yaml\nmax_logprobs: 3\n")
    env = {"LLMP_API_KEY": "k1,k2", "LLMP_CONFIG": str(config)}
    with serving(model_dir, env=env) as server:
        status, body = _get(f"{server.url}/v1/models", {"Authorization": "Bearer k2"})
        assert status == 200 and json.loads(body)["data"][0]["id"] == "from-yaml"
        assert _get(f"{server.url}/v1/models")[0] == 401
        assert _get(f"{server.url}/v1/models", {"Authorization": "Bearer k1,k2"})[0] == 401


def test_sigterm_stops_the_server_and_its_engine_process(model_dir: Path) -> None:
    with serving(model_dir) as server:
        engines = _children(server.process.pid)
        assert engines, "the engine runs in a child process"
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(timeout=60) == 0, server.log()
    deadline = time.monotonic() + 10
    while any(pid_alive(pid) for pid in engines) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(pid_alive(pid) for pid in engines)


def test_a_dead_engine_takes_the_server_down_with_status_1(model_dir: Path) -> None:
    with serving(model_dir) as server:
        engine = _children(server.process.pid)[0]
        os.kill(engine, signal.SIGKILL)
        assert server.process.wait(timeout=30) == 1, server.log()
        assert "the engine died" in server.log()


def test_several_frontends_mount_on_one_server_behind_the_same_gate(model_dir: Path, tmp_path: Path) -> None:
    from llmp.testing import pip_install_target

    site = tmp_path / "site"
    pip_install_target(site, Path(__file__).parents[1] / "fixtures" / "llmp-frontend-echo")
    env = {"PYTHONPATH": str(site)}
    with serving(model_dir, "--frontend", "openai", "--frontend", "echo", "--api-key", "k", env=env) as server:
        auth = {"Authorization": "Bearer k", "Content-Type": "application/json"}

        def post(path: str, body: dict, headers: dict[str, str]) -> tuple[int, dict]:
            request = urllib.request.Request(server.url + path, json.dumps(body).encode(), headers, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    return response.status, json.loads(response.read())
            except urllib.error.HTTPError as exc:
                return exc.code, json.loads(exc.read())

        status, body = post("/echo/v1/generate", {"prompt": "The quick"}, auth)
        assert status == 200 and body["model"] == str(model_dir) and body["text"]
        status, body = post("/echo/v1/generate", {}, auth)
        assert status == 400 and body["error"]["param"] == "prompt"
        assert post("/echo/v1/generate", {"prompt": "x"}, {"Content-Type": "application/json"})[0] == 401
        assert post("/v1/completions", {"prompt": "The quick", "max_tokens": 2}, auth)[0] == 200


def test_serve_with_the_mp_executor_and_two_ranks_answers_like_uniproc(model_dir: Path) -> None:
    body = json.dumps(
        {
            "prompt": "The quick brown fox",
            "max_tokens": 12,
            "temperature": 0,
            "ignore_eos": True,
            "return_token_ids": True,
        }
    ).encode()

    def completion(url: str) -> list[int]:
        request = urllib.request.Request(f"{url}/v1/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.loads(response.read())["choices"][0]["token_ids"]

    with serving(model_dir) as server:
        expected = completion(server.url)
    with serving(model_dir, "--executor", "mp", "--tensor-parallel-size", "2") as server:
        workers = [c for engine in _children(server.process.pid) for c in _children(engine)]
        assert len(workers) >= 2, "one worker process per rank"
        assert completion(server.url) == expected


def test_sigterm_to_the_whole_process_group_still_exits_cleanly(model_dir: Path) -> None:
    """As `timeout`, systemd and Ctrl-C do: the engine gets the signal too, and may be gone before
    the server asks it to stop (a send to a vanished engine once blocked for ever)."""
    port = free_port()
    child_env = child_environment()
    process = subprocess.Popen(
        [sys.executable, "-m", "llmp", "serve", str(model_dir), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=child_env,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if _get(f"http://127.0.0.1:{port}/health")[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.1)
        assert _get(f"http://127.0.0.1:{port}/v1/models")[0] == 200
        os.killpg(process.pid, signal.SIGTERM)
        assert process.wait(timeout=30) == 0, process.communicate()[0]
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def test_sigterm_drains_in_flight_streams_and_refuses_new_connections(model_dir: Path) -> None:
    import threading

    body = json.dumps({"prompt": "The quick", "max_tokens": 200, "ignore_eos": True, "stream": True}).encode()
    with serving(model_dir, "--shutdown-timeout", "30") as server:
        request = urllib.request.Request(f"{server.url}/v1/completions", body, {"Content-Type": "application/json"})
        lines: list[str] = []

        def read() -> None:
            with urllib.request.urlopen(request, timeout=60) as response:
                lines.extend(line.decode() for line in response if line.strip())

        reader = threading.Thread(target=read)
        reader.start()
        deadline = time.monotonic() + 30
        while not lines and time.monotonic() < deadline:
            time.sleep(0.02)
        server.process.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        with pytest.raises(OSError):
            _get(f"{server.url}/v1/models")
        reader.join(60)
        assert server.process.wait(timeout=60) == 0, server.log()
    assert lines[-1] == "data: [DONE]\n"
    finals = [json.loads(line[6:]) for line in lines[:-1]]
    assert finals[-1]["choices"][0]["finish_reason"] == "length"
    assert sum(1 for c in finals if c["choices"]) >= 50  # the stream ran on after the signal


def test_uds_serves_on_a_unix_socket_alone_and_removes_it(model_dir: Path, tmp_path: Path) -> None:
    import httpx

    path = tmp_path / "llmp.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))  # a socket file nobody listens on, as a killed server leaves: replaced
    stale.close()
    port = free_port()
    args = ["--uds", str(path), "--port", str(port), "--served-model-name", "m", "--api-server-count", "2"]
    process = _serve(str(model_dir), *args)
    try:
        with httpx.Client(
            transport=httpx.HTTPTransport(uds=str(path)), base_url="http://localhost", timeout=60
        ) as http:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                try:
                    if http.get("/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert process.poll() is None, process.communicate()[0]
                time.sleep(0.2)
            assert http.get("/version").json()["version"]
            completion = http.post("/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 2})
            assert completion.status_code == 200 and completion.json()["usage"]["completion_tokens"] == 2
        with socket.socket() as tcp:
            assert tcp.connect_ex(("127.0.0.1", port)) != 0  # --uds replaces --host and --port
        taken = subprocess.run(
            [sys.executable, "-m", "llmp", "serve", str(model_dir), "--uds", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
            env=child_environment(),
        )
        assert taken.returncode == 2 and "a server is listening there" in taken.stderr, taken.stderr
    finally:
        process.send_signal(signal.SIGTERM)
        output = process.communicate(timeout=60)[0]
    assert process.returncode == 0, output
    assert f"at unix:{path} (http://localhost)" in output
    assert not path.exists()  # removed at exit
