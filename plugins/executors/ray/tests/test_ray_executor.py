"""The ray executor on a real local Ray cluster (started on loopback): TP parity and faults."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llmp import LLM, SamplingParams
from llmp.api import EngineDeadError
from llmp.testing import pid_alive, save_tiny_llama

GREEDY = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
PROMPTS = [{"prompt_token_ids": [5 + i, 17, 42 + 3 * i, 99, 7 * i + 3]} for i in range(8)]


def ray_cli() -> str:
    return shutil.which("ray", path=os.path.dirname(sys.executable)) or "ray"


@pytest.fixture(scope="module")
def cluster() -> str:
    """A head node on 127.0.0.1 with 4 CPUs; torn down after the module."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # a throwaway cluster on loopback: no token authentication, for it or for this driver
    saved = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    subprocess.run(
        [
            ray_cli(),
            "start",
            "--head",
            "--node-ip-address=127.0.0.1",
            f"--port={port}",
            "--num-cpus=4",
            "--include-dashboard=false",
            "--disable-usage-stats",
        ],
        check=True,
        capture_output=True,
        env=env,
        timeout=120,
    )
    yield f"127.0.0.1:{port}"
    subprocess.run([ray_cli(), "stop", "--force"], capture_output=True, timeout=120, env=env)
    if saved is None:
        os.environ.pop("RAY_AUTH_MODE", None)
    else:
        os.environ["RAY_AUTH_MODE"] = saved


def greedy_tokens(llm: LLM, prompts=PROMPTS) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-ray")
    save_tiny_llama(path, num_attention_heads=4, num_key_value_heads=2, vocab_size=400)
    return path


def test_tensor_parallel_2_on_a_ray_cluster_equals_uniproc(cluster, model_dir):
    expected = greedy_tokens(LLM(str(model_dir), dtype="float32", max_model_len=128))
    llm = LLM(
        str(model_dir), dtype="float32", max_model_len=128, executor="ray", tensor_parallel_size=2, ray_address=cluster
    )
    pids = llm.engine.executor.worker_pids
    assert len(set(pids)) == 2 and os.getpid() not in pids
    assert greedy_tokens(llm) == expected
    # collective_rpc on every actor, in rank order; a failing call leaves the actors running
    assert [d["pid"] for d in llm.collective_rpc("describe")] == pids
    assert llm.collective_rpc(lambda worker, x: worker.rank * x, args=(10,)) == [0, 10]
    with pytest.raises(ValueError, match="failed on rank 0: ValueError: the worker has no method 'nope'"):
        llm.collective_rpc("nope")
    llm.sleep(2)  # the weights discarded on both actors, loaded again on wake
    llm.wake_up()
    assert greedy_tokens(llm, PROMPTS[:2]) == expected[:2]
    llm.shutdown()
    deadline = time.monotonic() + 10
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(pid_alive(p) for p in pids)


def test_a_killed_actor_is_an_engine_error(cluster, model_dir):
    llm = LLM(
        str(model_dir), dtype="float32", max_model_len=128, executor="ray", tensor_parallel_size=2, ray_address=cluster
    )
    try:
        assert greedy_tokens(llm, PROMPTS[:1])
        os.kill(llm.engine.executor.worker_pids[1], signal.SIGKILL)
        started = time.monotonic()
        with pytest.raises(EngineDeadError, match="Ray worker failed"):
            greedy_tokens(llm)
        assert time.monotonic() - started < 10
    finally:
        llm.shutdown()
