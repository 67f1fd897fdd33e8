"""The mp executor: real worker processes, tensor parallelism over gloo, faults."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llmp import LLM, AsyncLLM, SamplingParams, hookimpl
from llmp.api import EngineDeadError, ModelSpec
from llmp.testing import pid_alive, registered, save_tiny_llama

GREEDY = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
PROMPTS = [{"prompt_token_ids": [5 + i, 17, 42 + 3 * i, 99, 7 * i + 3]} for i in range(8)]


def greedy_tokens(llm: LLM) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


@pytest.fixture(scope="module")
def gqa_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-gqa")
    save_tiny_llama(path, num_attention_heads=4, num_key_value_heads=2, vocab_size=400)
    return path


@pytest.fixture(scope="module")
def reference(gqa_model) -> list[list[int]]:
    return greedy_tokens(LLM(str(gqa_model), dtype="float32", max_model_len=128))


def test_one_rank_greedy_equals_uniproc(gqa_model, reference):
    """(Two ranks: tests/test_conformance.py.)"""
    llm = LLM(str(gqa_model), dtype="float32", max_model_len=128, executor="mp", tensor_parallel_size=1)
    pids = llm.engine.executor.worker_pids
    assert len(pids) == 1 and all(pid_alive(p) for p in pids)
    assert greedy_tokens(llm) == reference
    llm.shutdown()
    assert not any(pid_alive(p) for p in pids)


def test_fewer_kv_heads_than_ranks_are_replicated(tmp_path):
    save_tiny_llama(tmp_path, num_attention_heads=4, num_key_value_heads=1, vocab_size=400, tie_word_embeddings=True)
    expected = greedy_tokens(LLM(str(tmp_path), dtype="float32", max_model_len=128))
    llm = LLM(str(tmp_path), dtype="float32", max_model_len=128, executor="mp", tensor_parallel_size=2)
    assert greedy_tokens(llm) == expected
    llm.shutdown()


def test_heads_not_divisible_by_ranks_is_a_clear_error(tmp_path):
    save_tiny_llama(tmp_path, hidden_size=48, num_attention_heads=3, num_key_value_heads=3, vocab_size=400)
    with pytest.raises(EngineDeadError, match=r"not divisible by the tensor-parallel size \(2\)"):
        LLM(str(tmp_path), dtype="float32", max_model_len=128, executor="mp", tensor_parallel_size=2)


def test_uniproc_refuses_tensor_parallelism(gqa_model):
    with pytest.raises(ValueError, match="use the mp or ray executor"):
        LLM(str(gqa_model), max_model_len=128, tensor_parallel_size=2)


def test_killed_worker_fails_pending_requests_and_leaves_no_process(gqa_model):
    engine = AsyncLLM(str(gqa_model), dtype="float32", max_model_len=512, executor="mp", tensor_parallel_size=2)
    engine_pid = engine._process.pid
    worker_pids = [int(p) for p in open(f"/proc/{engine_pid}/task/{engine_pid}/children").read().split()]
    assert len(worker_pids) == 2

    async def run():
        long = SamplingParams(temperature=0.0, max_tokens=500, ignore_eos=True)  # runs on well past the kill
        first = asyncio.Event()

        async def consume(prompt):
            async for _ in engine.generate(prompt, long):
                first.set()

        tasks = [asyncio.create_task(consume(p)) for p in PROMPTS[:4]]
        await first.wait()
        killed_at = time.monotonic()
        os.kill(worker_pids[1], signal.SIGKILL)
        results = await asyncio.gather(*tasks, return_exceptions=True)
        return results, time.monotonic() - killed_at

    try:
        results, elapsed = asyncio.run(run())
        assert all(isinstance(r, EngineDeadError) for r in results), results
        assert "worker 1" in str(results[0])
        assert elapsed < 10
    finally:
        engine.shutdown()
    deadline = time.monotonic() + 10
    while any(pid_alive(p) for p in [engine_pid, *worker_pids]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(pid_alive(p) for p in [engine_pid, *worker_pids])


def test_hung_worker_becomes_an_engine_error(gqa_model):
    llm = LLM(
        str(gqa_model), dtype="float32", max_model_len=128, executor="mp", tensor_parallel_size=2, worker_timeout_s=3
    )
    pids = llm.engine.executor.worker_pids
    os.kill(pids[1], signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(EngineDeadError, match="did not answer within 3 s"):
            llm.generate(PROMPTS[:2], GREEDY, use_tqdm=False)
        assert time.monotonic() - started < 15
    finally:
        os.kill(pids[1], signal.SIGCONT)
        llm.shutdown()
    assert not any(pid_alive(p) for p in pids)


def test_sigterm_to_the_engine_process_stops_its_workers(gqa_model):
    engine = AsyncLLM(str(gqa_model), dtype="float32", max_model_len=128, executor="mp", tensor_parallel_size=2)
    engine_pid = engine._process.pid
    worker_pids = [int(p) for p in open(f"/proc/{engine_pid}/task/{engine_pid}/children").read().split()]
    try:
        os.kill(engine_pid, signal.SIGTERM)
        engine._process.join(10)
        assert engine._process.exitcode == 0  # a clean exit, through the executor's shutdown
        deadline = time.monotonic() + 10
        while any(pid_alive(p) for p in worker_pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(pid_alive(p) for p in worker_pids)
    finally:
        # also when an assertion fails: a client left open and collected later can hang the run
        # (the garbage collector may clear its sockets' references before its context's __del__)
        engine.shutdown()


class CallerOnlyArchitecture:
    """A model plugin registered in the test's process only: the engine process and the workers
    load their plugins from entry points and never see it, so a second look-up there would fail."""

    @hookimpl
    def llmp_register_models(self):
        return [ModelSpec(name="CallerOnlyForCausalLM", impl="llmp_models_llama.model:LlamaForCausalLM")]


def test_the_model_is_resolved_once_by_the_caller_and_handed_to_every_worker(gqa_model, reference, tmp_path):
    model_dir = shutil.copytree(gqa_model, tmp_path / "caller-only")
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, "architectures": ["CallerOnlyForCausalLM"]}))
    elsewhere = subprocess.run(  # any other process: the architecture is unknown there
        [sys.executable, "-c", "from llmp import registry; registry.select_model(['CallerOnlyForCausalLM'], 'native')"],
        capture_output=True,
        text=True,
    )
    assert elsewhere.returncode != 0 and "UnknownComponentError" in elsewhere.stderr
    with registered(CallerOnlyArchitecture(), "caller-only-architecture"):
        engine = AsyncLLM(
            str(model_dir),
            dtype="float32",
            max_model_len=128,
            model_impl="native",
            executor="mp",
            tensor_parallel_size=2,
        )
    try:
        assert engine.model.spec.name == "CallerOnlyForCausalLM" and engine.model.model_dir == model_dir

        async def run() -> list[list[int]]:
            async def one(prompt) -> list[int]:
                async for output in engine.generate(prompt, GREEDY):
                    last = output
                return last.outputs[0].token_ids

            return list(await asyncio.gather(*(one(p) for p in PROMPTS)))

        assert asyncio.run(run()) == reference  # the engine process and both workers ran the caller's choice
    finally:
        engine.shutdown()


@pytest.fixture
def rpc_helpers(monkeypatch: pytest.MonkeyPatch):
    """``mp_rpc_helpers``, importable by name here and in the worker processes."""
    here = str(Path(__file__).parent)
    monkeypatch.syspath_prepend(here)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")])))
    import mp_rpc_helpers

    return mp_rpc_helpers


def test_collective_rpc_sleep_and_profiles_on_every_rank(gqa_model, reference, tmp_path, rpc_helpers):
    llm = LLM(
        str(gqa_model),
        dtype="float32",
        max_model_len=128,
        executor="mp",
        tensor_parallel_size=2,
        profiler_dir=str(tmp_path),
    )
    pids = llm.engine.executor.worker_pids
    try:
        assert [d["rank"] for d in llm.collective_rpc("describe")] == [0, 1]
        assert llm.collective_rpc(rpc_helpers.rank_and_pid) == [(0, pids[0]), (1, pids[1])]
        with pytest.raises(ValueError, match="failed on rank 0: ValueError: the worker has no method 'nope'"):
            llm.collective_rpc("nope")
        with pytest.raises(ValueError, match="cannot be sent to the worker processes"):
            llm.collective_rpc(lambda worker: worker.rank)
        with pytest.raises(TimeoutError, match="did not answer within 0.2 s"):
            llm.collective_rpc(rpc_helpers.sleep_then_rank, args=(1.0,), timeout=0.2)
        # the late answers to the call that timed out are not taken for the next call's
        assert llm.collective_rpc(rpc_helpers.sleep_then_rank, args=(0,)) == [0, 1]
        assert all(pid_alive(p) for p in pids)  # failed calls leave the workers running
        for level in (1, 2):
            llm.sleep(level)
            llm.wake_up()
            outputs = llm.generate(PROMPTS[:2], GREEDY, use_tqdm=False)
            assert [o.outputs[0].token_ids for o in outputs] == reference[:2]
        llm.start_profile()
        llm.generate(PROMPTS[:1], SamplingParams(max_tokens=2), use_tqdm=False)
        traces = llm.stop_profile()
        assert [Path(t).name.split("-")[1] for t in traces] == ["rank0", "rank1"]
        assert all(json.loads(Path(t).read_text())["traceEvents"] for t in traces)
    finally:
        llm.shutdown()
