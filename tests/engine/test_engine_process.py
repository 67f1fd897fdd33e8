"""The engine process started before its arguments (``EngineProcess``): it imports first, runs the engine it
is then given, exits quietly when it gets none, and ``llmp serve`` never leaves one behind."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from llmp import LLM, AsyncLLM, SamplingParams
from llmp.engine.engine_process import EngineProcess
from llmp.testing import child_environment, free_port, save_tiny_llama

OPTIONS = dict(dtype="float32", block_size=4, max_model_len=128)
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-llama-prestart")
    save_tiny_llama(path, vocab_size=400, logit_scale=4.0)
    return path


def has_loaded_torch(pid: int) -> bool:
    try:
        return "libtorch" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


async def first_tokens(engine: AsyncLLM, prompt: str) -> list[int]:
    tokens: list[int] = []
    async for output in engine.generate(prompt, GREEDY, delta=True):
        tokens += output.outputs[0].token_ids
    return tokens


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads the process's memory map in /proc")
def test_it_loads_torch_before_its_arguments_then_runs_the_engine_it_is_given(model_dir: Path) -> None:
    process = EngineProcess("warning")
    try:
        deadline = time.monotonic() + 120
        while not has_loaded_torch(process.pid):
            assert process.is_alive(), f"exited with {process.exitcode} before it had its arguments"
            assert time.monotonic() < deadline, "torch not loaded after 120 s without arguments"
            time.sleep(0.05)
        engine = AsyncLLM(str(model_dir), engine_process=process, **OPTIONS)
        try:
            assert engine._process is process and engine.info["model"]
            tokens = asyncio.run(first_tokens(engine, "The quick brown fox"))
        finally:
            engine.shutdown()
        assert not process.is_alive()
        with pytest.raises(ValueError, match="engine_process"):  # one engine a process
            AsyncLLM(str(model_dir), engine_process=process, **OPTIONS)
    finally:
        process.discard()
    expected = LLM(str(model_dir), **OPTIONS).generate(["The quick brown fox"], GREEDY, use_tqdm=False)
    assert tokens == list(expected[0].outputs[0].token_ids)


def test_one_given_no_arguments_exits_0_and_says_nothing() -> None:
    process = subprocess.run(
        [sys.executable, "-m", "llmp.engine.core_proc"],
        input=b"",
        capture_output=True,
        env=child_environment(),
        timeout=120,
    )
    assert process.returncode == 0 and process.stdout == b"" and process.stderr == b"", process


def test_a_discarded_one_is_gone_and_one_for_a_thread_or_an_attached_client_is_refused(model_dir: Path) -> None:
    process = EngineProcess("warning")
    for wrong in ({"engine_mode": "thread"}, {"attach": object()}):
        with pytest.raises(ValueError, match="engine_process"):
            AsyncLLM(str(model_dir), engine_process=process, **wrong, **OPTIONS)
    process.discard()
    assert process.exitcode == -9  # killed without its arguments: nothing to shut down
    process.discard()  # again: nothing happens


def engine_processes_marked(marker: str) -> list[int]:
    """The engine processes whose environment holds ``marker`` (orphans included)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (
                b"llmp.engine.core_proc" in (entry / "cmdline").read_bytes()
                and marker.encode() in (entry / "environ").read_bytes()
            ):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="finds processes in /proc")
def test_serve_stopping_at_a_usage_error_leaves_no_engine_process(model_dir: Path) -> None:
    marker = f"LLMP_TEST_MARK={uuid.uuid4().hex}"
    name, value = marker.split("=")
    env = {**child_environment(), name: value}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "llmp",
            "serve",
            str(model_dir),
            "--max-model-len",
            "100000",
            "--port",
            str(free_port()),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert [line for line in result.stderr.splitlines() if line.startswith("llmp: error:")], result.stderr
    assert "Traceback" not in result.stderr
    # killed and reaped before the server exited (an orphan would exit on its own, but only once it
    # noticed its parent gone: 0.2 s later)
    assert engine_processes_marked(marker) == []


def test_ctrl_c_at_its_very_start_does_not_reach_it() -> None:
    process = EngineProcess("warning")
    try:
        os.kill(process.pid, signal.SIGINT)  # before its interpreter has even started, most likely
        time.sleep(1.0)
        os.kill(process.pid, signal.SIGINT)
        time.sleep(0.5)
        assert process.is_alive(), f"exited with {process.exitcode} on a Ctrl-C"
    finally:
        process.discard()


ORPHAN_PARENT = """
import os, sys
from llmp.engine.engine_process import EngineProcess
from llmp.model_files.resolve import resolve_model
from llmp.options import EngineConfig

config = EngineConfig(model=sys.argv[1], dtype="float32", block_size=4, max_model_len=128)
process = EngineProcess("warning")
process.send((config, resolve_model(config), "ipc:///tmp/llmp-orphan-test-in", "ipc:///tmp/llmp-orphan-test-out"))
os._exit(0)  # gone with the arguments sent, before the engine process has started its watch
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="finds processes in /proc")
def test_an_engine_process_whose_parent_died_before_it_started_exits(model_dir: Path) -> None:
    marker = f"LLMP_TEST_MARK={uuid.uuid4().hex}"
    name, value = marker.split("=")
    subprocess.run(
        [sys.executable, "-c", ORPHAN_PARENT, str(model_dir)],
        env={**child_environment(), name: value},
        timeout=120,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while left := engine_processes_marked(marker):
        assert time.monotonic() < deadline, f"engine processes {left} outlived their parent by 60 s"
        time.sleep(0.1)


def test_its_last_message_reaches_the_client_though_it_ends_with_os_exit(tmp_path: Path) -> None:
    """The engine process ends with ``os._exit`` right after closing its sockets; its last message (the
    EngineFailed that says why it stopped) goes out on zmq's I/O thread, so close must wait for it.
    A message of 8 MiB cannot be written before ``os._exit`` unless something waits."""
    import zmq

    from llmp.engine import protocol as msg

    context = zmq.Context()
    output = context.socket(zmq.PULL)
    output.bind(f"ipc://{tmp_path}/out")
    script = f"""
import os
from llmp.engine import protocol as msg
from llmp.engine.core_proc import EngineCoreLoop
loop = EngineCoreLoop(None, None, "ipc://{tmp_path}/in", "ipc://{tmp_path}/out")
loop.send(msg.EngineFailed("x" * (8 << 20)))
loop.close()
os._exit(1)
"""
    child = subprocess.run([sys.executable, "-c", script], env=child_environment(), timeout=60)
    assert child.returncode == 1
    try:
        assert output.poll(5000), "the message was lost when the process exited"
        message = msg.from_engine_decoder.decode(output.recv())
        assert isinstance(message, msg.EngineFailed) and len(message.message) == 8 << 20
    finally:
        output.close(linger=0)
        context.term()
