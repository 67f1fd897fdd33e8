"""Stopping `llmp serve` at any phase of its start-up: status 0, no traceback, no ready line;
and "ready" only once every front-end listens."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llmp.testing import child_environment, free_port, plugin_site, save_tiny_llama

pytestmark = pytest.mark.slow

WARM_UP_S = 3.0
# an executor whose first step (the server's warm-up) takes WARM_UP_S: an interrupt then lands in the warm-up
SLOW_EXECUTOR = f"""
import time

from llmp import hookimpl
from llmp.api import ExecutorSpec
from llmp.engine.executor import UniprocExecutor


class SlowFirstStep(UniprocExecutor):
    first = True

    def execute_model(self, inputs):
        if self.first:
            self.first = False
            time.sleep({WARM_UP_S})
        return super().execute_model(inputs)


@hookimpl
def llmp_register_executors():
    yield ExecutorSpec(name="slow-first-step", impl="llmp_slow_first_step:SlowFirstStep")
"""


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-llama-interrupts")
    save_tiny_llama(path, vocab_size=400)
    return path


@pytest.fixture(scope="module")
def slow_site(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment that finds the slow-first-step executor: a plugin distribution on a path."""
    return plugin_site(tmp_path_factory.mktemp("slow-site"), "llmp_slow_first_step", SLOW_EXECUTOR)


def _start(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    child_env = child_environment()
    child_env.update(env or {})
    return subprocess.Popen(
        [sys.executable, "-m", "llmp", "serve", *args, "--port", str(free_port())],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env,
    )


def _interrupt_at(process: subprocess.Popen, marker: str, sig: signal.Signals) -> str:
    """Send ``sig`` as soon as ``marker`` shows on stderr; the whole of stderr once it exits."""
    seen = []
    for line in process.stderr:
        seen.append(line)
        if marker in line:
            process.send_signal(sig)
            break
    else:
        process.wait(10)
        raise AssertionError(f"{marker!r} never showed (status {process.returncode}):\n{''.join(seen)}")
    seen.append(process.stderr.read())
    process.wait(60)
    return "".join(seen)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupt_while_warming_up_exits_0_quietly(model_dir, slow_site, sig):
    process = _start(str(model_dir), "--executor", "slow-first-step", env=slow_site)
    started = time.monotonic()
    stderr = _interrupt_at(process, "warming up", sig)
    assert process.returncode == 0, stderr
    assert "Traceback" not in stderr and "Error" not in stderr, stderr
    assert "llmp: ready" not in stderr, stderr
    assert time.monotonic() - started < 60


@pytest.mark.parametrize("marker", ["loading", "INFO llmp.engine: engine ready"])
def test_an_interrupt_while_loading_exits_0_quietly(model_dir, slow_site, marker):
    # the slow first step keeps "llmp: ready" seconds after "engine ready", however late the signal comes
    process = _start(str(model_dir), "--executor", "slow-first-step", env=slow_site)
    stderr = _interrupt_at(process, marker, signal.SIGINT)
    assert process.returncode == 0, stderr
    assert "Traceback" not in stderr and "llmp: ready" not in stderr, stderr


def test_ready_waits_for_the_grpc_front_end_to_listen(model_dir):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        grpc_port = str(busy.getsockname()[1])
        process = _start(str(model_dir), "--frontend", "openai", "--frontend", "grpc", "--grpc-port", grpc_port)
        stderr = process.communicate(timeout=120)[1]
    assert process.returncode == 1, stderr
    assert f"cannot listen on 127.0.0.1:{grpc_port}" in stderr and "llmp: ready" not in stderr, stderr


def test_the_grpc_port_must_differ_from_the_http_port(model_dir):
    port = str(free_port())
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "llmp", "serve", str(model_dir), "--frontend", "grpc"]
        + ["--port", port, "--grpc-port", port],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "--grpc-port" in result.stderr, result.stderr
    assert "ready" not in result.stderr
    assert time.monotonic() - started < 30
