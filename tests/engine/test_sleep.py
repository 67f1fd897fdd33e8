"""Management of a running engine, offline and through AsyncLLM: sleep and wake-up (levels 1 and 2,
partial wake by tags), the prefix cache reset, torch profiles and calls on every worker."""

from __future__ import annotations

import asyncio
import gc
import json
import weakref
from pathlib import Path

import pytest

from llmp import LLM, AsyncLLM, LoRARequest, SamplingParams, hookimpl
from llmp.api import EngineSleepingError, ExecutorSpec
from llmp.engine.executor import UniprocExecutor
from llmp.engine.worker import WorkerCallError
from llmp.testing import registered, save_random_lora, save_tiny_llama

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
PROMPTS = [{"prompt_token_ids": [5 + i, 17, 42 + 3 * i, 99, 7 * i + 3]} for i in range(2)]
# 40 tokens: two full blocks of 16 the prefix cache can keep
LONG_PROMPT = {"prompt_token_ids": [(7 * i + 3) % 390 + 5 for i in range(40)]}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-sleep")
    save_tiny_llama(path, vocab_size=400)
    return path


@pytest.fixture(scope="module")
def llm(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> LLM:
    profiles = tmp_path_factory.mktemp("profiles")
    return LLM(str(model_dir), dtype="float32", max_model_len=128, block_size=16, profiler_dir=str(profiles))


def greedy(llm: LLM) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


@pytest.fixture(scope="module")
def reference(llm: LLM) -> list[list[int]]:
    return greedy(llm)


@pytest.mark.parametrize(("level", "first", "then"), [(1, "weights", "kv_cache"), (2, "kv_cache", "weights")])
def test_sleep_then_wake_gives_the_same_greedy_answer(llm, reference, level, first, then):
    llm.sleep(level)
    assert llm.is_sleeping()
    with pytest.raises(EngineSleepingError, match=r"sleeping \(level %d\).*wake" % level):
        llm.generate(PROMPTS[:1], GREEDY, use_tqdm=False)
    llm.sleep(level)  # asleep already: nothing changes, as in vLLM
    runner = llm.engine.executor.runner
    assert runner.kv_caches == []  # the KV cache is freed
    assert (runner.model is None) == (level == 2)  # level 2 discards the weights
    llm.wake_up([first])  # a partial wake: still asleep until both are back
    assert llm.is_sleeping()
    assert (runner.model is not None) == (first == "weights") and bool(runner.kv_caches) == (first == "kv_cache")
    llm.wake_up([first])  # awake already: nothing to do
    llm.wake_up([then])
    assert not llm.is_sleeping()
    assert greedy(llm) == reference


def test_level_2_lets_the_weights_go(model_dir):
    """Nothing keeps the discarded model alive (the decode graphs held it once, and with it every weight)."""
    llm = LLM(str(model_dir), dtype="float32", max_model_len=128, block_size=16)
    llm.generate(PROMPTS[:1], GREEDY, use_tqdm=False)  # decode steps traced: the graphs hold the model
    runner = llm.engine.executor.runner
    assert runner.graphs is not None and runner.graphs.model is runner.model
    model = weakref.ref(runner.model)
    llm.sleep(2)
    gc.collect()
    assert model() is None
    llm.wake_up()
    assert runner.graphs.model is runner.model
    assert len(llm.generate(PROMPTS[:1], GREEDY, use_tqdm=False)[0].outputs[0].token_ids) > 0


def test_bad_levels_and_tags_are_clear_errors(llm):
    with pytest.raises(ValueError, match="level must be 1 or 2"):
        llm.sleep(3)
    with pytest.raises(ValueError, match="unknown wake-up tag 'gpu'"):
        llm.wake_up(["gpu"])
    with pytest.raises(TypeError, match="list of tags"):
        llm.wake_up("weights")
    assert not llm.is_sleeping()


def test_sleep_refuses_while_requests_are_in_flight(llm):
    llm.engine.add_request("busy", PROMPTS[0], GREEDY)
    llm.engine.step()  # now it holds KV blocks
    try:
        with pytest.raises(ValueError, match="1 requests are in flight"):
            llm.sleep()
        assert llm.reset_prefix_cache() is False  # its blocks are held, as vLLM refuses
    finally:
        llm.engine.abort_request("busy")
    assert not llm.is_sleeping()


def test_reset_prefix_cache_forgets_cached_blocks(llm):
    one = SamplingParams(temperature=0.0, max_tokens=1)
    first = llm.generate([LONG_PROMPT], one, use_tqdm=False)[0]
    again = llm.generate([LONG_PROMPT], one, use_tqdm=False)[0]
    assert again.num_cached_tokens == 32 and again.outputs[0].token_ids == first.outputs[0].token_ids
    assert llm.reset_prefix_cache() is True
    after = llm.generate([LONG_PROMPT], one, use_tqdm=False)[0]
    assert after.num_cached_tokens == 0 and after.outputs[0].token_ids == first.outputs[0].token_ids


def test_a_profile_writes_a_chrome_trace(llm):
    with pytest.raises(ValueError, match="no profile is running"):
        llm.stop_profile()
    llm.start_profile()
    with pytest.raises(ValueError, match="already running"):
        llm.start_profile()
    llm.generate(PROMPTS[:1], SamplingParams(max_tokens=2), use_tqdm=False)
    (trace,) = llm.stop_profile()
    events = json.loads(Path(trace).read_text())["traceEvents"]
    assert Path(trace).parent == Path(llm.engine.config.profiler_dir)
    assert any(event.get("name", "").startswith("aten::") for event in events)  # the model's ops


def test_profiling_needs_a_directory(model_dir):
    plain = LLM(str(model_dir), dtype="float32", max_model_len=64)
    with pytest.raises(ValueError, match="--profiler-dir"):
        plain.start_profile()


def rank_and_double(worker, value, *, offset=0):
    return worker.rank, 2 * value + offset


def test_collective_rpc(llm):
    (described,) = llm.collective_rpc("describe")
    assert described["rank"] == 0 and described["bytes_per_block"] > 0
    assert llm.collective_rpc(rank_and_double, args=(4,), kwargs={"offset": 1}) == [(0, 9)]
    with pytest.raises(ValueError, match="no method 'nope'; it has .*describe") as unknown:
        llm.collective_rpc("nope")
    assert "sampler" not in str(unknown.value)  # a callable attribute is no method
    with pytest.raises(ValueError, match="no method 'sampler'"):
        llm.collective_rpc("sampler")
    with pytest.raises(ValueError, match="public worker method"):
        llm.collective_rpc("__init__")
    with pytest.raises(ValueError, match="drives the workers' 'sleep' itself"):
        llm.collective_rpc("sleep")
    with pytest.raises(ValueError, match="failed on rank 0: TypeError"):
        llm.collective_rpc("describe", args=(1,))
    with pytest.raises(TypeError, match="args must be a list"):
        llm.collective_rpc("describe", args="x")
    with pytest.raises(WorkerCallError, match="failed on rank 0: RuntimeError: boom"):  # a failure, not a bad call
        llm.collective_rpc(fail)


def fail(worker):
    raise RuntimeError("boom")


def uses_the_model(worker):
    return worker.runner.model.attention_layers()


def test_worker_calls_while_asleep_and_a_failed_wake_up(llm, reference, model_dir, tmp_path):
    (awake,) = llm.collective_rpc("describe")
    llm.sleep(2)
    try:
        (asleep,) = llm.collective_rpc("describe")  # no model, still described
        assert asleep["sleeping"] == ["kv_cache", "weights"] and awake["sleeping"] == []
        assert asleep["bytes_per_block"] == awake["bytes_per_block"]
        with pytest.raises(EngineSleepingError, match="uses_the_model needs the model.*wake it up"):
            llm.collective_rpc(uses_the_model)  # never an AttributeError on the missing model
        weights = model_dir / "model.safetensors"
        weights.rename(tmp_path / "away")
        try:
            with pytest.raises(WorkerCallError, match=r"^wake-up failed on rank 0: ModelLoadError"):
                llm.wake_up()
        finally:
            (tmp_path / "away").rename(weights)
        assert llm.is_sleeping()  # still asleep; a second try works
    finally:
        llm.wake_up()
    assert greedy(llm) == reference


class NoRPCExecutor:
    """An executor plugin written before collective_rpc: it serves requests, nothing more."""

    def __init__(self, config, model) -> None:
        self._inner = UniprocExecutor(config, model)
        self.kernels_name = self._inner.kernels_name

    def bytes_per_block(self) -> int:
        return self._inner.bytes_per_block()

    def allocate_kv_cache(self, num_blocks: int) -> None:
        self._inner.allocate_kv_cache(num_blocks)

    def execute_model(self, inputs):
        return self._inner.execute_model(inputs)

    def check_health(self) -> None:
        pass

    def shutdown(self) -> None:
        pass


class NoRPCPlugin:
    @hookimpl
    def llmp_register_executors(self):
        yield ExecutorSpec(name="t-no-rpc", impl=f"{__name__}:NoRPCExecutor")


def test_an_executor_without_collective_rpc_is_a_clear_error(model_dir):
    with registered(NoRPCPlugin(), "t-no-rpc"):
        llm = LLM(str(model_dir), dtype="float32", max_model_len=64, executor="t-no-rpc")
    assert llm.generate(PROMPTS[:1], SamplingParams(max_tokens=2), use_tqdm=False)[0].outputs[0].token_ids
    with pytest.raises(NotImplementedError, match="has no collective_rpc .*cannot sleep"):
        llm.sleep()
    assert not llm.is_sleeping()


def test_async_llm_sleep_aborts_or_waits_for_requests_in_flight(model_dir):
    long = SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True)
    longest = SamplingParams(temperature=0.0, max_tokens=120, ignore_eos=True)  # all max_model_len leaves

    async def last_output(
        engine: AsyncLLM, request_id: str, params: SamplingParams, started: asyncio.Event | None = None
    ):
        output = None
        async for output in engine.generate(PROMPTS[0], params, request_id):
            if started is not None:
                started.set()
        return output

    async def scenario() -> None:
        engine = AsyncLLM(str(model_dir), dtype="float32", max_model_len=128, engine_mode="thread")
        try:
            before = (await last_output(engine, "before", GREEDY)).outputs[0].token_ids
            started = asyncio.Event()
            running = asyncio.create_task(last_output(engine, "aborted", longest, started))
            await started.wait()  # its first token is out; the tiny model makes the rest in a fraction of a second
            await engine.sleep(1)  # vLLM's default mode: abort
            aborted = await running
            assert aborted.finished and aborted.outputs[0].finish_reason == "abort"
            assert await engine.is_sleeping()
            with pytest.raises(EngineSleepingError, match="wake it up"):
                engine.generate(PROMPTS[0], GREEDY)  # refused when called: a server answers 503 at once
            await engine.wake_up()
            assert not await engine.is_sleeping()
            running = asyncio.create_task(last_output(engine, "finished", long))
            await asyncio.sleep(0.2)
            await engine.sleep(2, mode="wait")
            finished = await running
            assert finished.outputs[0].finish_reason == "length" and len(finished.outputs[0].token_ids) == 60
            await engine.wake_up()
            assert (await last_output(engine, "after", GREEDY)).outputs[0].token_ids == before
            assert await engine.reset_prefix_cache() is True
            (described,) = await engine.collective_rpc("describe")
            assert described["rank"] == 0
            with pytest.raises(ValueError, match="no method 'nope'"):
                await engine.collective_rpc("nope")
            with pytest.raises(ValueError, match="sleep mode must be one of abort, wait"):
                await engine.sleep(1, mode="keep")
            with pytest.raises(ValueError, match="--profiler-dir"):
                await engine.start_profile()
        finally:
            engine.shutdown()

    asyncio.run(scenario())


def test_level_2_reloads_lora_adapters_into_their_slots(model_dir, tmp_path):
    adapter = save_random_lora(model_dir, tmp_path / "adapter", rank=4)
    llm = LLM(str(model_dir), dtype="float32", max_model_len=64, enable_lora=True, max_lora_rank=8)
    lora = LoRARequest("a", 1, str(adapter))

    def tokens(lora_request: LoRARequest | None) -> list[int]:
        output = llm.generate(PROMPTS[:1], GREEDY, use_tqdm=False, lora_request=lora_request)[0]
        return output.outputs[0].token_ids

    base, adapted = tokens(None), tokens(lora)
    assert adapted != base  # the adapter changes the answer, so a lost slot would show
    llm.sleep(2)
    llm.wake_up()
    assert tokens(lora) == adapted and tokens(None) == base
