"""Multi-LoRA after review: an adapter whose files changed before a re-read gets a fresh key (no
prefix blocks or slot of the old files), a reused ``lora_int_id`` naming another adapter is refused,
a removed id is not brought back by a request, the filesystem resolver serves a directory under one
name only, and ``--lora-modules``/``--served-model-name`` take several values after one flag."""

from __future__ import annotations

import asyncio
import itertools
import os
import random
from pathlib import Path
from typing import Any

import pytest
import typer

from llmp import LLM, SamplingParams, plugins
from llmp.api import InvalidLoRAAdapterError, LoRAAdapterNotFoundError
from llmp.cli import app, main
from llmp.engine.llm_engine import LLMEngine
from llmp.frontend import FilesystemResolver
from llmp.lora import LoRARequest
from llmp.options import FrontendOptions
from llmp.testing import save_random_lora

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
_ids = itertools.count()


def prompt(seed: int, length: int = 13) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 500) for _ in range(length)]


def run(engine: LLMEngine, token_ids: list[int], lora: LoRARequest | None) -> Any:
    """One request, stepped to its end: its final output."""
    request_id = f"fix-{next(_ids)}"
    engine.add_request(request_id, {"prompt_token_ids": token_ids}, GREEDY, lora_request=lora)
    final = None
    while engine.has_unfinished_requests():
        final = next((o for o in engine.step() if o.finished and o.request_id == request_id), final)
    return final


def rewrite(model: Path, adapter: Path, seed: int) -> None:
    """New weights of the same size in ``adapter``; its mtime moved on a second, as a later copy's."""
    save_random_lora(model, adapter, seed=seed)
    later = (adapter / "adapter_model.safetensors").stat().st_mtime_ns + 1_000_000_000
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        os.utime(adapter / name, ns=(later, later))


def engine(model: Path, **options: Any) -> LLMEngine:
    return LLM(str(model), dtype="float32", block_size=4, enable_lora=True, **options).engine


@pytest.mark.parametrize("prefix_caching", [True, False], ids=["prefix-cache", "slot-only"])
def test_files_changed_before_a_re_read_get_a_fresh_key(tiny_llama: Path, tmp_path: Path, prefix_caching: bool) -> None:
    """Adapter a is in a slot, its weights dropped from the CPU cache; its files change. Its next
    request must run the new files: no prefix block and no slot of the old load."""
    a = LoRARequest("a", 1, str(save_random_lora(tiny_llama, tmp_path / "a", seed=1)))
    b = LoRARequest("b", 2, str(save_random_lora(tiny_llama, tmp_path / "b", seed=2)))
    c = LoRARequest("c", 3, str(save_random_lora(tiny_llama, tmp_path / "c", seed=3)))
    text = prompt(1, 21)
    llm = engine(tiny_llama, max_loras=2, max_cpu_loras=2, enable_prefix_caching=prefix_caching)
    old = run(llm, text, a)
    run(llm, prompt(2), b)
    llm.add_lora(c)  # three in a CPU cache of two: a's weights go, a keeps its slot
    first_key = llm.lora.stats()
    assert first_key["cpu_evictions"] == 1 and llm.lora.slots.count(None) == 0
    rewrite(tiny_llama, tmp_path / "a", seed=11)

    new = run(llm, text, a)
    assert new.num_cached_tokens == 0, "the new files reused the prefix blocks of the old ones"
    expected = run(engine(tiny_llama, max_loras=2), text, a)
    assert new.outputs[0].token_ids == expected.outputs[0].token_ids, "the old weights ran (the old slot)"
    assert new.outputs[0].token_ids != old.outputs[0].token_ids
    assert llm.list_loras() == [1, 2, 3] and llm.lora.stats()["loaded"] == ["a", "b", "c"]
    again = run(llm, text, a)  # the fresh key's own blocks serve the next request
    assert (again.num_cached_tokens > 0) == prefix_caching
    assert again.outputs[0].token_ids == expected.outputs[0].token_ids


def test_an_adapter_in_a_slot_keeps_its_cpu_weights_before_one_in_none(tiny_llama: Path, tmp_path: Path) -> None:
    a, b, c = (
        LoRARequest(n, i + 1, str(save_random_lora(tiny_llama, tmp_path / n, seed=i + 1))) for i, n in enumerate("abc")
    )
    llm = engine(tiny_llama, max_loras=1, max_cpu_loras=2)
    run(llm, prompt(1), a)
    llm.add_lora(b)
    llm.add_lora(c)  # one of a (in the slot) and b (in none) leaves the CPU cache: b
    reads = llm.lora.stats()["disk_loads"]
    run(llm, prompt(1), a)
    assert llm.lora.stats()["disk_loads"] == reads, "the adapter in the slot was read from disk again"


def test_a_reused_lora_int_id_naming_another_adapter_is_refused(tiny_llama: Path, tmp_path: Path) -> None:
    a = LoRARequest("a", 1, str(save_random_lora(tiny_llama, tmp_path / "a", seed=1)))
    b_path = str(save_random_lora(tiny_llama, tmp_path / "b", seed=2))
    llm = engine(tiny_llama, max_loras=2)
    [expected] = run(llm, prompt(3), a).outputs
    for other in (LoRARequest("b", 1, b_path), LoRARequest("a", 1, b_path), LoRARequest("b", 1, a.lora_path)):
        with pytest.raises(InvalidLoRAAdapterError, match=f"'a' \\({a.lora_path}\\).*'{other.lora_name}' "):
            llm.add_request("other", {"prompt_token_ids": prompt(3)}, GREEDY, lora_request=other)
        with pytest.raises(InvalidLoRAAdapterError, match="lora_int_id 1 is LoRA adapter 'a'"):
            llm.add_lora(other)
    assert not llm.has_unfinished_requests()
    same_dir = LoRARequest("a", 1, str(tmp_path / "." / "a"))  # the same directory spelled otherwise
    assert run(llm, prompt(3), same_dir).outputs[0].token_ids == expected.token_ids
    assert llm.add_lora(LoRARequest("b", 1, b_path), replace=True) is True  # replacing is asked for
    assert llm.lora.stats()["loaded"] == ["b"]


def test_a_removed_id_is_not_brought_back_by_a_request(tiny_llama: Path, tmp_path: Path) -> None:
    a = LoRARequest("a", 1, str(save_random_lora(tiny_llama, tmp_path / "a", seed=1)))
    llm = engine(tiny_llama, max_loras=2)
    run(llm, prompt(4), a)
    assert llm.remove_lora(1) is True
    with pytest.raises(LoRAAdapterNotFoundError, match="'a'.*removed"):
        llm.add_request("late", {"prompt_token_ids": prompt(4)}, GREEDY, lora_request=a)
    assert llm.list_loras() == [] and llm.lora.stats()["loaded"] == [] and not llm.has_unfinished_requests()
    assert llm.add_lora(a) is True  # added again: served again
    assert run(llm, prompt(4), a).finished
    never_seen = LoRARequest("n", 7, a.lora_path)  # an LLM caller's new id still registers itself
    assert run(llm, prompt(4), never_seen).finished and llm.list_loras() == [1, 7]


def test_the_filesystem_resolver_serves_a_directory_under_one_name(tiny_llama: Path, tmp_path: Path) -> None:
    save_random_lora(tiny_llama, tmp_path / "good", seed=1, base_model_name=str(tiny_llama))
    save_random_lora(tiny_llama, tmp_path / "sub" / "deep", seed=2, base_model_name=str(tiny_llama))
    resolver = FilesystemResolver(FrontendOptions(lora_resolver_dir=str(tmp_path)))

    def find(name: str) -> LoRARequest | None:
        return asyncio.run(resolver.resolve_lora(str(tiny_llama), name))

    assert find("good").lora_path == str(tmp_path / "good")
    assert find("sub/deep").lora_path == str(tmp_path / "sub" / "deep")
    back_in = f"../{tmp_path.name}/good"  # climbs out and back in: still a second name
    for alias in ("good/", "./good", "sub/../good", "sub//deep", "sub/./deep", "sub/deep/", back_in):
        assert find(alias) is None, f"{alias!r} served the directory under a second name"


def parsed(*args: str) -> dict[str, Any]:
    """The parameters ``llmp serve ARGS`` parses to, on the real command (nothing runs)."""
    plugins.load_plugins()
    group = typer.main.get_command(app)
    command = group.get_command(group.make_context("llmp", ["serve"]), "serve")
    return command.make_context("serve", list(args)).params


def refused(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(list(args))
    assert exit_.value.code == 2
    return capsys.readouterr().err


def test_several_values_after_one_flag(capsys: pytest.CaptureFixture[str]) -> None:
    params = parsed("m", "--lora-modules", "a=/p", '{"name": "b", "path": "/q"}', "--enable-lora", "-tp", "1")
    assert params["model"] == "m" and params["enable_lora"] is True and params["tensor_parallel_size"] == "1"
    assert params["lora_modules"] == ["a=/p", '{"name": "b", "path": "/q"}']
    params = parsed("m", "--served-model-name", "x", "y", "--lora-modules", "a=/p", "--lora-modules", "c=/r")
    assert params["served_model_name"] == ["x", "y"] and params["lora_modules"] == ["a=/p", "c=/r"]
    assert parsed("--served-model-name", "x", "--dtype", "float32", "m")["model"] == "m"  # one value: as before
    # the second value reaches the option's own check (it was "unexpected extra argument")
    err = refused(capsys, "serve", "m", "--lora-modules", "a=/x", "nonsense", "--enable-lora")
    assert err.startswith("llmp: error: --lora-modules 'nonsense' must be NAME=PATH")
    # MODEL after a flag that took several values would be taken as one: refused, naming the rule
    err = refused(capsys, "serve", "--served-model-name", "x", "m", "--port", "1")
    assert err.startswith("llmp: error: --served-model-name took several values and MODEL was not given: put MODEL")
