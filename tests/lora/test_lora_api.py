"""LoRA adapters through the Python API: ``LLM.generate/chat/embed(lora_request=...)`` with one
adapter for all prompts or one per prompt, ``LLM.add/remove/list/pin_lora``, ``AsyncLLM`` with
the engine in its own process (typed errors across the boundary, the served-name table), and
the option checks of ``--enable-lora`` and its companions."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from llmp import LLM, AsyncLLM, SamplingParams
from llmp.api import InvalidLoRAAdapterError, LoRAAdapterNotFoundError
from llmp.cli.option_checks import option_problems
from llmp.config import OptionError, load_records
from llmp.lora import LoRARequest
from llmp.options import EngineConfig, FrontendOptions, ServerOptions
from llmp.testing import save_random_lora

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [40, 41, 42, 43], [300, 7, 99, 12, 18]]


@pytest.fixture(scope="module")
def adapters(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, LoRARequest]:
    root = tmp_path_factory.mktemp("adapters")
    return {
        name: LoRARequest(name, i + 1, str(save_random_lora(tiny_llama, root / name, rank=8, seed=i + 1)))
        for i, name in enumerate(("a", "b"))
    }


@pytest.fixture(scope="module")
def llm(tiny_llama: Path) -> Any:
    llm = LLM(str(tiny_llama), dtype="float32", block_size=4, enable_lora=True, max_loras=2)
    yield llm
    llm.shutdown()


def tokens(outputs: list[Any]) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in outputs]


def generate(llm: LLM, prompts: list[list[int]], lora_request: Any = None) -> list[list[int]]:
    inputs = [{"prompt_token_ids": p} for p in prompts]
    return tokens(llm.generate(inputs, GREEDY, use_tqdm=False, lora_request=lora_request))


@pytest.fixture(scope="module")
def alone(llm: LLM, adapters: dict[str, LoRARequest]) -> dict[str | None, list[list[int]]]:
    """Each prompt's tokens on the base model and on each adapter, one request at a time."""
    return {name: [generate(llm, [p], adapters.get(name))[0] for p in PROMPTS] for name in (None, *sorted(adapters))}


def test_one_adapter_for_every_prompt_or_one_per_prompt(llm: LLM, adapters: dict, alone: dict) -> None:
    assert alone["a"] != alone[None] and alone["b"] != alone["a"]  # the adapters change the tokens
    assert generate(llm, PROMPTS, adapters["a"]) == alone["a"]
    mixed = [None, adapters["a"], adapters["b"]]
    assert generate(llm, PROMPTS, mixed) == [alone[None][0], alone["a"][1], alone["b"][2]]
    # a LoRARequest is named by its name (as vLLM's): another record of the same adapter runs the same
    again = LoRARequest("a", adapters["a"].lora_int_id, adapters["a"].lora_path)
    assert generate(llm, PROMPTS[:1], [again]) == alone["a"][:1]


def cached_on_the_hub(adapter: LoRARequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """``adapter``'s files as Hub repository someone/tiny-lora in a Hugging Face cache of this process
    (offline); its Hub id."""
    import shutil

    from huggingface_hub import constants

    cache = tmp_path / "hub"
    repo = cache / "models--someone--tiny-lora"
    commit = "0123456789abcdef0123456789abcdef01234567"
    shutil.copytree(adapter.lora_path, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return "someone/tiny-lora"


def test_an_adapter_named_by_its_hub_id_is_read_from_the_hugging_face_cache(
    llm: LLM, adapters: dict, alone: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM's get_adapter_absolute_path: a lora_path that is no directory but a Hub id (org/name) is the
    adapter's snapshot in the cache (downloaded when not there; offline here)."""
    by_id = LoRARequest("from-hub", 7, cached_on_the_hub(adapters["a"], tmp_path, monkeypatch))
    assert generate(llm, PROMPTS, by_id) == alone["a"]
    with pytest.raises(LoRAAdapterNotFoundError, match="No adapter found for someone/not-there"):
        generate(llm, PROMPTS[:1], LoRARequest("missing", 8, "someone/not-there"))


def test_chat_runs_every_conversation_on_its_adapter(llm: LLM, adapters: dict) -> None:
    messages = [{"role": "user", "content": "hello there"}]
    base = llm.chat([messages, messages], GREEDY, use_tqdm=False)
    both = llm.chat([messages, messages], GREEDY, use_tqdm=False, lora_request=[None, adapters["b"]])
    single = llm.chat(messages, GREEDY, use_tqdm=False, lora_request=adapters["b"])
    assert tokens(both)[0] == tokens(base)[0]
    assert tokens(both)[1] == tokens(single)[0] != tokens(base)[0]


def test_a_bad_lora_request_argument_queues_nothing(llm: LLM, adapters: dict) -> None:
    inputs = [{"prompt_token_ids": p} for p in PROMPTS]
    with pytest.raises(ValueError, match="got 2 LoRA requests for 3 prompts"):
        llm.generate(inputs, GREEDY, lora_request=[adapters["a"], None])
    with pytest.raises(TypeError, match="LoRARequest"):
        llm.generate(inputs, GREEDY, lora_request="a")
    with pytest.raises(TypeError, match="LoRARequest or None items"):
        llm.generate(inputs, GREEDY, lora_request=[adapters["a"], "b", None])
    assert not llm.engine.has_unfinished_requests()


def test_add_list_pin_and_remove_adapters(llm: LLM, adapters: dict, alone: dict, tmp_path: Path) -> None:
    extra = LoRARequest("extra", 40, adapters["b"].lora_path)
    assert llm.add_lora(extra) is True
    assert llm.add_lora(extra) is False  # known already
    assert 40 in llm.list_loras()
    assert llm.pin_lora(40) is True
    assert generate(llm, PROMPTS[:1], extra) == alone["b"][:1]  # the same files as b
    assert llm.remove_lora(40) is True
    assert 40 not in llm.list_loras()
    assert llm.remove_lora(40) is False and llm.pin_lora(40) is False
    with pytest.raises(LoRAAdapterNotFoundError, match="No adapter found"):
        llm.add_lora(LoRARequest("missing", 41, str(tmp_path / "nowhere")))
    big = save_random_lora(Path(llm.engine.info.model), tmp_path / "big", rank=32)
    with pytest.raises(InvalidLoRAAdapterError, match="LoRA rank 32 is greater than max_lora_rank 16"):
        llm.add_lora(LoRARequest("big", 42, str(big)))
    # a bad adapter fails only its own call: the engine keeps serving
    assert generate(llm, PROMPTS[:1], adapters["a"]) == alone["a"][:1]


def test_without_enable_lora_a_lora_request_is_refused(tiny_llama: Path, adapters: dict) -> None:
    llm = LLM(str(tiny_llama), dtype="float32", block_size=4)
    try:
        with pytest.raises(ValueError, match=r"LoRA is not enabled: .*--enable-lora"):
            llm.generate([{"prompt_token_ids": [5, 6]}], GREEDY, lora_request=adapters["a"])
        assert not llm.engine.has_unfinished_requests()
    finally:
        llm.shutdown()


def test_embed_runs_on_the_adapter(tiny_llama: Path, adapters: dict) -> None:
    llm = LLM(str(tiny_llama), dtype="float32", block_size=4, convert="embed", enable_lora=True)
    try:
        inputs = [{"prompt_token_ids": p} for p in PROMPTS[:2]]
        base = [o.outputs.embedding for o in llm.embed(inputs, use_tqdm=False)]
        mixed = [o.outputs.embedding for o in llm.embed(inputs, use_tqdm=False, lora_request=[None, adapters["a"]])]
        alone = llm.embed(inputs[1:], use_tqdm=False, lora_request=adapters["a"])[0].outputs.embedding
        assert mixed[0] == base[0]
        assert mixed[1] == alone != base[1]
        raw = llm.encode(inputs[1:], use_tqdm=False, pooling_task="embed", lora_request=adapters["a"])
        assert raw[0].outputs.data == pytest.approx(alone)
        base_score = llm.score("hello there", "general kenobi", use_tqdm=False)[0].outputs.score
        score = llm.score("hello there", "general kenobi", use_tqdm=False, lora_request=adapters["a"])[0]
        assert score.outputs.score != pytest.approx(base_score)
    finally:
        llm.shutdown()


# -- AsyncLLM: the engine in its own process --------------------------------------------


async def stream_tokens(engine: AsyncLLM, prompt: list[int], lora: LoRARequest | None) -> list[int]:
    final = None
    async for final in engine.generate({"prompt_token_ids": prompt}, GREEDY, lora_request=lora):
        pass
    return list(final.outputs[0].token_ids)


def test_async_llm_serves_adapters_across_the_process_boundary(
    tiny_llama: Path, adapters: dict, alone: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    big = save_random_lora(tiny_llama, tmp_path / "big", rank=32)
    hub_id = cached_on_the_hub(adapters["a"], tmp_path, monkeypatch)  # in this process's cache only

    async def main() -> None:
        engine = AsyncLLM(str(tiny_llama), dtype="float32", block_size=4, enable_lora=True, max_loras=2)
        try:
            # requests name their adapter: read by the engine on first use
            got = await asyncio.gather(*(stream_tokens(engine, p, adapters["a"]) for p in PROMPTS))
            assert got == alone["a"]
            assert await stream_tokens(engine, PROMPTS[0], None) == alone[None][0]
            # a Hub id is resolved here, off the engine's loop: the engine process never sees this cache
            assert await stream_tokens(engine, PROMPTS[0], LoRARequest("hub", 11, hub_id)) == alone["a"][0]
            # the typed errors cross the process boundary, a field error keeps its field
            with pytest.raises(LoRAAdapterNotFoundError, match="No adapter found"):
                await stream_tokens(engine, PROMPTS[0], LoRARequest("gone", 9, str(tmp_path / "gone")))
            with pytest.raises(InvalidLoRAAdapterError, match="greater than max_lora_rank") as refused:
                await engine.add_lora(LoRARequest("big", engine.next_lora_id(), str(big)))
            assert refused.value.field in ("model", "lora_path")
            with pytest.raises(LoRAAdapterNotFoundError):
                await engine.add_lora(LoRARequest("gone", engine.next_lora_id(), str(tmp_path / "gone")))
            assert engine.lora_requests == {}  # nothing failed joins the served names

            # add_lora serves an adapter by name; ids for new names are never taken ones
            first = LoRARequest("b", engine.next_lora_id(), adapters["b"].lora_path)
            assert await engine.add_lora(first, pin=True) is True
            assert engine.lora_requests == {"b": first} and first.lora_int_id in engine.pinned_loras
            assert engine.next_lora_id() != first.lora_int_id
            assert first.lora_int_id in await engine.list_loras()
            assert await stream_tokens(engine, PROMPTS[1], engine.lora_requests["b"]) == alone["b"][1]
            assert await engine.remove_lora(first.lora_int_id) is True
            assert engine.lora_requests == {} and first.lora_int_id not in engine.pinned_loras
            assert first.lora_int_id not in await engine.list_loras()
            assert await engine.remove_lora(first.lora_int_id) is False
            assert await engine.pin_lora(first.lora_int_id) is False
        finally:
            await asyncio.to_thread(engine.shutdown)

    asyncio.run(main())


def test_async_llm_checks_a_lora_request_when_called(tiny_llama: Path, adapters: dict) -> None:
    async def main() -> None:
        engine = AsyncLLM(str(tiny_llama), dtype="float32", block_size=4, engine_mode="thread")
        try:
            with pytest.raises(ValueError, match="LoRA is not enabled"):
                engine.generate({"prompt_token_ids": [5]}, GREEDY, lora_request=adapters["a"])
            with pytest.raises(ValueError, match="LoRA is not enabled"):
                engine.encode({"prompt_token_ids": [5]}, lora_request=adapters["a"])
            with pytest.raises(TypeError, match="must be a llmp.LoRARequest"):
                engine.generate({"prompt_token_ids": [5]}, GREEDY, lora_request="a")
            with pytest.raises(ValueError, match="LoRA is not enabled"):
                await engine.add_lora(adapters["a"])
        finally:
            await asyncio.to_thread(engine.shutdown)

    asyncio.run(main())


# -- option checks ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "environ", "message"),
    [
        ({"lora_modules": ["a=/x"]}, {}, "--lora-modules needs --enable-lora"),
        ({"enable_lora_runtime_updates": True}, {}, "--enable-lora-runtime-updates needs --enable-lora"),
        ({}, {"LLMP_ENABLE_LORA_RUNTIME_UPDATES": "1"}, "LLMP_ENABLE_LORA_RUNTIME_UPDATES needs --enable-lora"),
        (
            {"enable_lora": True, "max_loras": "4", "max_cpu_loras": "2"},
            {},
            "--max-cpu-loras 2 must be at least --max-loras (4)",
        ),
        ({"enable_lora": True, "max_cpu_loras": "0"}, {}, "--max-cpu-loras"),
        ({"enable_lora": True, "max_lora_rank": "24"}, {}, "--max-lora-rank"),
    ],
    ids=["modules", "runtime updates", "variable", "cpu below slots", "cpu zero", "rank choice"],
)
def test_lora_options_that_do_not_go_together_are_refused(given: dict, environ: dict, message: str) -> None:
    records = {"engine": EngineConfig, "server": ServerOptions, "request": FrontendOptions}
    with pytest.raises(OptionError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_records(records, given, environ=environ, check=option_problems)


def test_lora_options_that_go_together_pass() -> None:
    records = {"engine": EngineConfig, "server": ServerOptions, "request": FrontendOptions}
    given = {
        "enable_lora": True,
        "max_loras": "2",
        "max_cpu_loras": "2",
        "max_lora_rank": "64",
        "lora_modules": ["a=/x", '{"name": "b", "path": "/y"}'],
        "enable_lora_runtime_updates": True,
        "lora_resolver_dir": "/adapters",
    }
    built = load_records(records, given, environ={}, check=option_problems)
    engine, server, request = built["engine"], built["server"], built["request"]
    assert (engine.enable_lora, engine.max_loras, engine.max_cpu_loras, engine.max_lora_rank) == (True, 2, 2, 64)
    assert server.lora_modules == ("a=/x", '{"name": "b", "path": "/y"}')
    assert (request.enable_lora_runtime_updates, request.lora_resolver_dir) == (True, "/adapters")
