"""The engine's LoRA adapters end to end, on tiny random models: mixed batches, slots and the CPU
cache under pressure, prefix caching keyed by adapter, bad adapters failing only their request,
unloading while requests run, and the engine process boundary."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
from pathlib import Path
from typing import Any

import pytest

from llmp import LLM, SamplingParams
from llmp.api import InvalidLoRAAdapterError, LoRAAdapterNotFoundError
from llmp.engine.llm_engine import LLMEngine
from llmp.lora import LoRARequest
from llmp.testing import save_random_lora, save_tiny_llama

# wide enough that oneDNN picks its kernels by row count as for real models (tests/engine/test_determinism.py)
WIDE = dict(hidden_size=576, intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3, num_hidden_layers=2)
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=2)
_ids = itertools.count()


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-llama")
    save_tiny_llama(path)
    return path


@pytest.fixture(scope="module")
def adapters(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> list[LoRARequest]:
    """Four rank-8 adapters on all seven projections, each with its own weights."""
    root = tmp_path_factory.mktemp("adapters")
    return [
        LoRARequest(name, i + 1, str(save_random_lora(tiny_dir, root / name, rank=8, seed=i + 1)))
        for i, name in enumerate(("a", "b", "c", "d"))
    ]


def prompt(seed: int, length: int = 13) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 500) for _ in range(length)]


def result(output: Any) -> tuple[list[int], list[list[tuple[int, float]]]]:
    completion = output.outputs[0]
    steps = [sorted((t, lp.logprob) for t, lp in step.items()) for step in completion.logprobs or ()]
    return list(completion.token_ids), steps


def run(engine: LLMEngine, jobs: list[tuple[list[int], LoRARequest | None]], params: SamplingParams = GREEDY) -> list:
    """Add every job at once, step until all finish; each job's (tokens, logprobs) and final output."""
    request_ids = []
    for token_ids, lora in jobs:
        request_ids.append(f"job-{next(_ids)}")
        engine.add_request(request_ids[-1], {"prompt_token_ids": token_ids}, params, lora_request=lora)
    finals = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                finals[output.request_id] = output
    return [finals[request_id] for request_id in request_ids]


def record_steps(engine: LLMEngine, monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """The distinct slots each step's rows use (-1: the base model), as the engine hands them on."""
    seen: list[list[int]] = []
    step_inputs = engine.lora.step_inputs

    def recording(scheduled: Any) -> Any:
        inputs = step_inputs(scheduled)
        seen.append(sorted(set(inputs.token_slots.tolist())) if inputs is not None else [-1])
        return inputs

    monkeypatch.setattr(engine.lora, "step_inputs", recording)
    return seen


@pytest.mark.parametrize("kernels", ["torch", "cpu"])
def test_base_and_three_adapters_in_one_step_get_what_each_gets_alone(
    tmp_path: Path, kernels: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Exact logprobs (bfloat16): a request's numbers do not depend on the adapters beside it.
    The same prompt on every adapter also checks that no two adapters share cached blocks."""
    save_tiny_llama(tmp_path / "model", logit_scale=1.0, **WIDE)
    loras = [
        LoRARequest(n, i + 1, str(save_random_lora(tmp_path / "model", tmp_path / n, seed=i + 1)))
        for i, n in enumerate("abc")
    ]
    llm = LLM(str(tmp_path / "model"), dtype="bfloat16", kernels=kernels, block_size=4, enable_lora=True, max_loras=3)
    same, other = prompt(1, 17), prompt(2, 9)
    jobs = [(same, None), (same, loras[0]), (other, loras[1]), (same, loras[1]), (same, loras[2])]
    alone = [result(run(llm.engine, [job])[0]) for job in jobs]
    assert len({tuple(alone[i][0]) for i in (0, 1, 3, 4)}) == 4, "an adapter left the tokens as they were"
    steps = record_steps(llm.engine, monkeypatch)
    mixed = [result(o) for o in run(llm.engine, jobs)]
    assert steps[0] == [-1, 0, 1, 2], "the base model and three adapters did not share the first step"
    for job, (got, expected) in enumerate(zip(mixed, alone, strict=True)):
        assert got == expected, f"job {job} changed in a mixed batch"


def test_four_adapters_through_two_slots_and_two_cpu_entries(
    tiny_dir: Path, adapters: list[LoRARequest], monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs = [(prompt(10 + i), adapters[i % 4]) for i in range(8)] + [(prompt(30), None)]
    roomy = LLM(str(tiny_dir), dtype="float32", block_size=4, enable_lora=True, max_loras=4)
    expected = [result(o) for o in run(roomy.engine, jobs)]
    del roomy

    llm = LLM(str(tiny_dir), dtype="float32", block_size=4, enable_lora=True, max_loras=2, max_cpu_loras=2)
    engine = llm.engine
    steps = record_steps(engine, monkeypatch)
    assert [result(o) for o in run(engine, jobs)] == expected
    assert all(len(set(slots) - {-1}) <= 2 for slots in steps), "a step ran more adapters than slots"
    # one at a time, round the four twice: every adapter is evicted from its slot and re-read from disk
    for job in jobs[:8] * 2:
        assert result(run(engine, [job])[0]) == expected[jobs.index(job)]
    stats = engine.lora.stats()
    assert stats["slot_evictions"] > 0 and stats["cpu_evictions"] > 0
    assert stats["disk_loads"] > 4, "adapters dropped from the CPU cache were not read again"
    assert stats["running"] == stats["waiting"] == {}
    assert engine.list_loras() == [1, 2, 3, 4]


def test_prefix_cache_is_keyed_by_adapter(tiny_dir: Path, adapters: list[LoRARequest]) -> None:
    llm = LLM(str(tiny_dir), dtype="float32", block_size=4, enable_lora=True, max_loras=2)
    text = prompt(5, 21)
    first_a, first_b, again_a, base = (
        run(llm.engine, [(text, lora)])[0] for lora in (*adapters[:2], adapters[0], None)
    )
    assert first_a.num_cached_tokens == 0
    assert first_b.num_cached_tokens == 0, "adapter b reused adapter a's cached blocks"
    assert again_a.num_cached_tokens > 0, "adapter a's own blocks were not reused"
    assert base.num_cached_tokens == 0, "the base model reused an adapter's cached blocks"
    assert result(again_a) == result(first_a)


def test_a_bad_adapter_fails_its_request_only(tiny_dir: Path, tmp_path: Path, adapters: list[LoRARequest]) -> None:
    llm = LLM(str(tiny_dir), dtype="float32", block_size=4, enable_lora=True, max_loras=2)
    engine = llm.engine
    corrupt = save_random_lora(tiny_dir, tmp_path / "corrupt", seed=9)
    (corrupt / "adapter_model.safetensors").write_bytes(b"\x00" * 64)
    huge = save_random_lora(tiny_dir, tmp_path / "rank64", rank=64, seed=9)
    with pytest.raises(InvalidLoRAAdapterError):
        engine.add_request(
            "bad-file", {"prompt_token_ids": prompt(1)}, GREEDY, lora_request=LoRARequest("x", 7, str(corrupt))
        )
    with pytest.raises(InvalidLoRAAdapterError, match="max_lora_rank"):
        engine.add_request(
            "bad-rank", {"prompt_token_ids": prompt(1)}, GREEDY, lora_request=LoRARequest("y", 8, str(huge))
        )
    with pytest.raises(LoRAAdapterNotFoundError):
        engine.add_request(
            "gone", {"prompt_token_ids": prompt(1)}, GREEDY, lora_request=LoRARequest("z", 9, str(tmp_path / "none"))
        )
    assert engine.list_loras() == [] and not engine.has_unfinished_requests()
    [ok] = run(engine, [(prompt(1), adapters[0])])  # the engine keeps serving, adapters included
    assert ok.finished and len(ok.outputs[0].token_ids) == GREEDY.max_tokens
    with pytest.raises(InvalidLoRAAdapterError):
        engine.add_lora(LoRARequest("x", 7, str(corrupt)))
    assert engine.list_loras() == [1]


def test_without_enable_lora_a_lora_request_names_the_flag(tiny_dir: Path, adapters: list[LoRARequest]) -> None:
    llm = LLM(str(tiny_dir), dtype="float32", block_size=4)
    with pytest.raises(ValueError, match="--enable-lora"):
        llm.engine.add_request("r", {"prompt_token_ids": prompt(1)}, GREEDY, lora_request=adapters[0])
    with pytest.raises(ValueError, match="--enable-lora"):
        llm.engine.add_lora(adapters[0])
    assert not llm.engine.has_unfinished_requests()
    assert llm.engine.list_loras() == [] and llm.engine.remove_lora(1) is False


def test_removing_an_adapter_lets_its_requests_finish(tiny_dir: Path, adapters: list[LoRARequest]) -> None:
    llm = LLM(str(tiny_dir), dtype="float32", block_size=4, enable_lora=True, max_loras=2)
    engine = llm.engine
    [expected] = run(engine, [(prompt(3), adapters[0])])
    assert engine.add_lora(adapters[1]) is True and engine.add_lora(adapters[1]) is False
    assert engine.pin_lora(2) is True and engine.pin_lora(99) is False
    engine.add_request("in-flight", {"prompt_token_ids": prompt(3)}, GREEDY, lora_request=adapters[0])
    engine.step()
    assert engine.remove_lora(1) is True and engine.list_loras() == [2]
    assert engine.remove_lora(1) is False
    finals = []
    while engine.has_unfinished_requests():
        finals += [o for o in engine.step() if o.finished]
    assert [result(o) for o in finals] == [result(expected)]
    assert engine.lora.stats()["loaded"] == ["b"]
    assert None in engine.lora.slots, "the removed adapter kept its slot"


def test_a_model_through_the_transformers_fallback_is_refused_at_start(tiny_dir: Path) -> None:
    with pytest.raises(ValueError, match="LoRA needs a native decoder model"):
        LLM(str(tiny_dir), dtype="float32", model_impl="transformers", enable_lora=True)


def test_lora_errors_keep_their_type_across_the_process_boundary(
    tiny_dir: Path, tmp_path: Path, adapters: list[LoRARequest]
) -> None:
    from llmp import AsyncLLM

    corrupt = save_random_lora(tiny_dir, tmp_path / "corrupt", seed=9)
    (corrupt / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8}) + "}{")

    async def scenario() -> None:
        engine = AsyncLLM(str(tiny_dir), dtype="float32", block_size=4, enable_lora=True)
        try:
            with pytest.raises(InvalidLoRAAdapterError):
                await engine.add_lora(LoRARequest("bad", 5, str(corrupt)))
            with pytest.raises(LoRAAdapterNotFoundError):
                await engine.add_lora(LoRARequest("gone", 6, str(tmp_path / "none")))
            with pytest.raises(InvalidLoRAAdapterError):
                async for _ in engine.generate(
                    {"prompt_token_ids": prompt(1)}, GREEDY, lora_request=LoRARequest("bad", 5, str(corrupt))
                ):
                    pass
            assert await engine.add_lora(adapters[0]) is True
            final = None
            async for final in engine.generate({"prompt_token_ids": prompt(3)}, GREEDY, lora_request=adapters[0]):
                pass
            assert final is not None and final.finished
            stats = await engine.stats()
            assert stats["lora"]["loaded"] == ["a"] and stats["lora"]["disk_loads"] == 1
            assert await engine.list_loras() == [1]
            assert await engine.remove_lora(1) is True and await engine.list_loras() == []
        finally:
            engine.shutdown()

    asyncio.run(scenario())
