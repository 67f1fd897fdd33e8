"""Configurations that cannot work (case 10 of the reliability table): the server exits non-zero within
seconds with one clear line naming the problem, instead of starting and failing later or waiting for a
probe to kill it. (A bad model path, an unknown front-end and a busy port are in test_serve_lifecycle.)
"""

from __future__ import annotations

import pickle
import subprocess
import sys
import tempfile
import time

import httpx
import pytest
import zmq
from reliability_support import start_serve

from llmp.testing import child_environment, free_port

pytestmark = pytest.mark.slow  # each test starts a server or an engine


def serve_until_exit_or_ready(model, *args: str, tmp_path, timeout: float = 90) -> tuple[int | None, str, float]:
    """(exit status or None if it became ready instead, output, seconds)."""
    port = free_port()
    log_path = tmp_path / f"serve-{port}.log"
    started = time.monotonic()
    process = start_serve(model, port, *args, log_path=log_path)
    try:
        while time.monotonic() - started < timeout:
            if process.poll() is not None:
                return process.returncode, log_path.read_text(errors="replace"), time.monotonic() - started
            try:
                if httpx.get(f"http://127.0.0.1:{port}/ready", timeout=2).status_code == 200:
                    return None, log_path.read_text(errors="replace"), time.monotonic() - started
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"neither exited nor ready within {timeout:g} s:\n{log_path.read_text()}")
    finally:
        if process.poll() is None:
            process.terminate()
            process.wait(30)


def llmp_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("llmp: error:")]


CONFIGS = {
    "context-beyond-model": ["--max-model-len", "100000"],
    # 8 KiB per block of 16 tokens (2 layers x K and V x 2 heads x 16 dims x 4 bytes x 16): 0.0001 GiB is 13 blocks
    "context-beyond-cache": ["--dtype", "float32", "--max-model-len", "2048", "--kv-cache-memory-gib", "0.0001"],
    "cache-below-one-block": ["--dtype", "float32", "--kv-cache-memory-gib", "0.000001"],
}


def outcome(model, name: str, tmp_path) -> tuple[int | None, str, float]:
    return serve_until_exit_or_ready(model, *CONFIGS[name], tmp_path=tmp_path)


def test_a_context_longer_than_the_model_is_a_usage_error_naming_both_lengths(tiny_model, tmp_path):
    status, output, seconds = outcome(tiny_model, "context-beyond-model", tmp_path)
    assert status == 2, output  # checked against the model's config before anything starts
    assert seconds < 60
    lines = llmp_lines(output)
    assert len(lines) == 1, output
    assert "--max-model-len 100000" in lines[0] and "2048" in lines[0], lines[0]


def test_a_context_that_does_not_fit_the_kv_cache_exits_1_naming_the_cache(tiny_model, tmp_path):
    status, output, seconds = outcome(tiny_model, "context-beyond-cache", tmp_path)
    assert status == 1, output
    assert seconds < 60
    lines = llmp_lines(output)
    assert len(lines) == 1 and "KV cache" in lines[0] and "max_model_len 2048" in lines[0], output


def test_a_kv_cache_too_small_for_one_block_exits_naming_the_flag(tiny_model, tmp_path):
    status, output, _ = outcome(tiny_model, "cache-below-one-block", tmp_path)
    assert status is not None and status != 0, "the server started with a KV cache smaller than one block"
    lines = llmp_lines(output)
    assert len(lines) == 1 and "kv-cache-memory-gib" in lines[0].lower().replace("_", "-"), output


def test_an_engine_start_up_failure_is_reported_once_without_a_traceback(tiny_model):
    """The engine process alone (as the server starts it), with a configuration it refuses: it must report
    the failure to its client and exit non-zero quietly; the client prints the one line."""
    from llmp.engine import protocol as msg
    from llmp.model_files.resolve import resolve_model
    from llmp.options import EngineConfig

    # fits the model's context (checked when resolving) but not a 13-block KV cache: refused by the engine
    config = EngineConfig(model=str(tiny_model), dtype="float32", max_model_len=2048, num_kv_blocks=13)
    model = resolve_model(config)  # before any socket: a failure here must not leave a ZMQ context
    folder = tempfile.mkdtemp(prefix="llmp-rel-")
    in_address, out_address = f"ipc://{folder}/in", f"ipc://{folder}/out"
    context = zmq.Context()
    inputs, outputs = context.socket(zmq.PUSH), context.socket(zmq.PULL)
    inputs.bind(in_address)
    outputs.bind(out_address)
    env = child_environment()
    process = subprocess.Popen(
        [sys.executable, "-m", "llmp.engine.core_proc"], stdin=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    try:
        process.stdin.write(pickle.dumps((config, model, in_address, out_address)))
        process.stdin.close()
        assert outputs.poll(60_000), "the engine reported nothing"
        message = msg.from_engine_decoder.decode(outputs.recv())
        assert isinstance(message, msg.EngineFailed) and "max_model_len 2048" in message.message, message
        process.wait(60)  # its stderr is a few lines at most: the pipe cannot fill
        stderr = process.stderr.read().decode(errors="replace")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        inputs.close(linger=0)
        outputs.close(linger=0)
        context.term()
    assert process.returncode != 0
    assert "Traceback" not in stderr, stderr
