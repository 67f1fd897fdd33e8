"""LoRA adapters in the server core: the front-end kit every front-end uses (adapter names as
models, ``/v1/models`` cards, run-time loads with vLLM's texts and codes), resolver plugins and
the built-in filesystem resolver, ``--lora-modules`` at start-up, the vLLM variables, and the
``/metrics`` figures; against a real engine, and a real ``llmp serve``."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmp import AsyncLLM, SamplingParams
from llmp.api import LLMPError, LoRAAdapterNotFoundError
from llmp.frontend import APIError, FilesystemResolver, FrontendKit, as_api_error, frontend_options, load_lora_modules
from llmp.lora import LoRAModulePath
from llmp.options import FrontendOptions
from llmp.server.launch import with_vllm_lora_variables
from llmp.server.metrics import ServerMetrics
from llmp.server.settings import ServeSettings
from llmp.testing import run_llmp, save_random_lora, serving

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
SERVED = "tiny"


@pytest.fixture(scope="module")
def files(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Adapters of the tiny model: two good ones, one of too high a rank, and a resolver directory."""
    root = tmp_path_factory.mktemp("adapters")
    resolver_dir = root / "resolvable"
    return {
        "a": save_random_lora(tiny_llama, root / "a", seed=1),
        "b": save_random_lora(tiny_llama, root / "b", seed=2),
        "big": save_random_lora(tiny_llama, root / "big", rank=32, seed=3),
        "dir": resolver_dir,
        "found": save_random_lora(tiny_llama, resolver_dir / "found", seed=4),
        "nested": save_random_lora(tiny_llama, resolver_dir / "team" / "nested", seed=5),
        "too-big": save_random_lora(tiny_llama, resolver_dir / "too-big", rank=32, seed=6),
        "other-base": save_random_lora(tiny_llama, resolver_dir / "other-base", seed=7, base_model_name="org/else"),
        "outside": save_random_lora(tiny_llama, root / "outside", seed=8),
    }


def kit_for(engine: AsyncLLM, **options: Any) -> FrontendKit:
    return FrontendKit(engine, frontend_options(FrontendOptions(**options), engine.info, [SERVED]))


def with_engine(tiny_llama: Path, test: Any) -> None:
    """Run ``test(engine)`` (a coroutine function) against a real engine serving LoRA."""

    async def main() -> None:
        engine = AsyncLLM(
            str(tiny_llama), dtype="float32", block_size=4, enable_lora=True, max_loras=2, engine_mode="thread"
        )
        try:
            await test(engine)
        finally:
            await asyncio.to_thread(engine.shutdown)

    asyncio.run(main())


async def api_error(call: Any) -> APIError:
    with pytest.raises(APIError) as caught:
        await call
    return caught.value


async def complete(engine: Any, lora: Any) -> list[int]:
    final = None
    async for final in engine.generate({"prompt_token_ids": [5, 6, 7, 8]}, GREEDY, lora_request=lora):
        pass
    return list(final.outputs[0].token_ids)


def test_adapter_names_are_models_and_runtime_loads_answer_as_vllm(tiny_llama: Path, files: dict) -> None:
    async def test(engine: AsyncLLM) -> None:
        kit, other = kit_for(engine), kit_for(engine)  # two front-ends of one server share the adapters
        assert await kit.lora_for(None) is None and await kit.lora_for(SERVED) is None
        assert kit.response_model(None) == SERVED
        unknown = await api_error(kit.lora_for("a"))
        assert (unknown.status, unknown.message, unknown.type) == (
            404,
            "The model `a` does not exist.",
            "NotFoundError",
        )

        lora = await kit.load_adapter("a", str(files["a"]))
        assert other.is_served("a") and await other.lora_for("a") == lora
        assert other.response_model(lora) == "a" and not other.is_pinned(lora)
        other.check_model("a")  # no error: an adapter is a model
        assert await complete(engine, await kit.lora_for("a")) != await complete(engine, None)
        cards = {card["id"]: card for card in kit.model_cards()}
        assert list(cards) == [SERVED, "a"]
        assert cards[SERVED]["parent"] is None and cards[SERVED]["max_model_len"] == engine.info["max_model_len"]
        assert cards["a"] | {"created": 0} == {
            "id": "a",
            "object": "model",
            "created": 0,
            "owned_by": "llmp",
            "root": str(files["a"]),
            "parent": SERVED,
            "max_model_len": None,
        }
        pinned = await kit.load_adapter("b", str(files["b"]), base_model_name=str(tiny_llama), pin=True)
        assert kit.is_pinned(pinned) and {c["id"]: c["parent"] for c in kit.model_cards()}["b"] == str(tiny_llama)

        # vLLM's refusals, texts and codes
        missing = await api_error(kit.load_adapter("x", None))
        assert (missing.status, missing.message) == (400, "Both 'lora_name' and 'lora_path' must be provided.")
        twice = await api_error(kit.load_adapter("a", str(files["b"])))
        assert twice.status == 400 and twice.message == (
            "The lora adapter 'a' has already been loaded. If you want to load the adapter in place, "
            "set 'load_inplace' to True."
        )
        nowhere = await api_error(kit.load_adapter("x", str(files["a"].parent / "nowhere")))
        assert nowhere.status == 404 and nowhere.message.startswith("Loading lora x failed: No adapter found for")
        rank = await api_error(kit.load_adapter("x", str(files["big"])))
        assert rank.status == 400 and rank.message.endswith("LoRA rank 32 is greater than max_lora_rank 16.")
        base = await api_error(kit.load_adapter("x", str(files["a"]), base_model_name="org/else"))
        assert base.status == 400 and "'org/else'" in base.message and base.param == "base_model_name"
        served = await api_error(kit.load_adapter(SERVED, str(files["a"])))
        assert served.status == 400 and "name of the served model" in served.message
        assert set(kit.lora_requests) == {"a", "b"}  # nothing refused is served

        # in place: a new id for the new files, the old one dropped from the engine
        replaced = await kit.load_adapter("a", str(files["b"]), load_inplace=True)
        assert replaced.lora_int_id != lora.lora_int_id and replaced.lora_path == str(files["b"])
        assert await kit.lora_for("a") == replaced
        ids = await engine.list_loras()
        assert replaced.lora_int_id in ids and lora.lora_int_id not in ids

        no_name = await api_error(kit.unload_adapter(""))
        assert (no_name.status, no_name.message) == (400, "'lora_name' needs to be provided to unload a LoRA adapter.")
        gone = await api_error(kit.unload_adapter("zzz"))
        assert (gone.status, gone.message) == (404, "The lora adapter 'zzz' cannot be found.")
        assert await kit.unload_adapter("a") == replaced
        assert not other.is_served("a") and (await api_error(other.lora_for("a"))).status == 404
        assert replaced.lora_int_id not in await engine.list_loras()
        assert [c["id"] for c in kit.model_cards()] == [SERVED, "b"]

    with_engine(tiny_llama, test)


def test_resolvers_serve_adapters_a_request_names(tiny_llama: Path, files: dict) -> None:
    async def test(engine: AsyncLLM) -> None:
        directory = str(files["dir"])
        off = kit_for(engine, lora_resolver_dir=directory)  # resolvers run only with run-time updates
        assert (await api_error(off.lora_for("found"))).status == 404
        kit = kit_for(engine, lora_resolver_dir=directory, enable_lora_runtime_updates=True)

        # three requests at once name a new adapter: it is loaded once, under the server's own id
        before = set(await engine.list_loras())
        found = await asyncio.gather(*(kit.lora_for("found") for _ in range(3)))
        assert found[0] == found[1] == found[2] and found[0].lora_path == str(files["found"])
        assert len({lora.lora_int_id for lora in found}) == 1
        assert set(await engine.list_loras()) - before == {found[0].lora_int_id}
        assert kit.is_served("found") and "found" in [c["id"] for c in kit.model_cards()]
        assert (await kit.lora_for("team/nested")).lora_path == str(files["nested"])

        # the resolver found it, but the engine will not serve it: vLLM's 400
        refused = await api_error(kit.lora_for("too-big"))
        assert (refused.status, refused.message) == (400, "LoRA adapter 'too-big' was found but could not be loaded.")
        # none found: the front-end's own 404 (another base model, escapes from the directory, nothing there)
        outside = f"../{files['outside'].name}"
        for name in ("other-base", outside, str(files["outside"]), "nothing", "team", "found/.."):
            error = await api_error(kit.lora_for(name))
            assert (error.status, error.message) == (404, f"The model `{name}` does not exist."), name
        assert not kit.is_served("too-big") and not kit.is_served(outside)

    with_engine(tiny_llama, test)


def test_the_filesystem_resolver_serves_only_peft_loras_of_the_served_model(tiny_llama: Path, files: dict) -> None:
    resolver = FilesystemResolver(FrontendOptions(lora_resolver_dir=str(files["dir"])))
    assert asyncio.run(resolver.resolve_lora(str(tiny_llama), "found")).lora_path == str(files["found"])
    assert asyncio.run(resolver.resolve_lora("org/else", "found")) is None
    assert asyncio.run(resolver.resolve_lora("org/else", "other-base")).lora_name == "other-base"
    config_path = files["found"] / "adapter_config.json"
    config = json.loads(config_path.read_text())
    try:
        config_path.write_text(json.dumps({**config, "peft_type": "IA3"}))
        assert asyncio.run(resolver.resolve_lora(str(tiny_llama), "found")) is None
        config_path.write_text("{not json")
        assert asyncio.run(resolver.resolve_lora(str(tiny_llama), "found")) is None
    finally:
        config_path.write_text(json.dumps(config))
    assert asyncio.run(FilesystemResolver(FrontendOptions()).resolve_lora(str(tiny_llama), "found")) is None


def test_lora_modules_are_checked_against_the_served_model(tiny_llama: Path, files: dict) -> None:
    async def test(engine: AsyncLLM) -> None:
        modules = [LoRAModulePath("a", str(files["a"])), LoRAModulePath("b", str(files["b"]), SERVED)]
        await load_lora_modules(engine, modules, [SERVED])
        assert {name: lora.base_model_name for name, lora in engine.lora_requests.items()} == {"a": None, "b": SERVED}
        for module, message in (
            (LoRAModulePath("c", str(files["a"]), "org/else"), "LoRA adapter 'c' is for the base"),
            (LoRAModulePath("d", str(files["big"])), "LoRA rank 32 is greater than max_lora_rank"),
            (LoRAModulePath("e", str(files["a"].parent / "nowhere")), "Loading lora e failed: No adapter found"),
            (LoRAModulePath(SERVED, str(files["a"])), "the name is the served model's"),
        ):
            with pytest.raises(LLMPError, match=f"^--lora-modules {module.name}: .*{re.escape(message)}"):
                await load_lora_modules(engine, [module], [SERVED])
        with pytest.raises(LLMPError, match="--lora-modules f: the name is given twice"):
            await load_lora_modules(engine, [LoRAModulePath("f", str(files["a"]))] * 2, [SERVED])

    with_engine(tiny_llama, test)


def test_metrics_show_requests_per_adapter_loads_and_evictions(tiny_llama: Path, files: dict) -> None:
    async def test(engine: AsyncLLM) -> None:
        kit = kit_for(engine)
        metrics = ServerMetrics(SERVED)
        assert b"llmp_lora_requests_info" not in await metrics.render(None)
        lora = await kit.load_adapter("a", str(files["a"]))
        long = SamplingParams(temperature=0.0, max_tokens=400, ignore_eos=True)
        stream = engine.generate({"prompt_token_ids": [5, 6, 7]}, long, lora_request=lora)
        await anext(stream)  # running now
        text = (await metrics.render(engine)).decode()
        await stream.aclose()
        info = re.search(r"^llmp_lora_requests_info\{(.*)\} (\S+)$", text, re.M)
        assert info is not None, text
        labels = dict(re.findall(r'(\w+)="([^"]*)"', info.group(1)))
        assert labels == {
            "model_name": SERVED,
            "max_lora": "2",
            "running_lora_adapters": "a",
            "waiting_lora_adapters": "",
        }
        assert float(info.group(2)) > 1e9  # the scrape's time, as vLLM's
        assert f'llmp_lora_num_requests_running{{lora_name="a",model_name="{SERVED}"}} 1.0' in text
        assert f'llmp_lora_num_requests_waiting{{lora_name="a",model_name="{SERVED}"}} 0.0' in text
        assert f'llmp_lora_adapter_loads_total{{model_name="{SERVED}"}} 1.0' in text
        assert f'llmp_lora_slot_loads_total{{model_name="{SERVED}"}} 1.0' in text
        assert f'llmp_lora_evictions_total{{cache="slot",model_name="{SERVED}"}} 0.0' in text

    with_engine(tiny_llama, test)


def test_a_missing_adapter_is_a_404_and_vllm_variables_are_aliases() -> None:
    error = as_api_error(LoRAAdapterNotFoundError("Loading lora x failed: No adapter found for /p"))
    assert (error.status, error.type, error.message) == (
        404,
        "NotFoundError",
        "Loading lora x failed: No adapter found for /p",
    )
    settings = ServeSettings()
    on = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", "VLLM_LORA_RESOLVER_CACHE_DIR": "/adapters"}
    lora = ServeSettings(engine=type(settings.engine)(enable_lora=True))
    assert with_vllm_lora_variables(lora, on).frontend.enable_lora_runtime_updates
    assert with_vllm_lora_variables(lora, on).frontend.lora_resolver_dir == "/adapters"
    assert not with_vllm_lora_variables(settings, on).frontend.enable_lora_runtime_updates  # LoRA is off
    assert not with_vllm_lora_variables(
        lora, {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "0"}
    ).frontend.enable_lora_runtime_updates
    own = ServeSettings(engine=lora.engine, frontend=FrontendOptions(lora_resolver_dir="/mine"))
    assert with_vllm_lora_variables(own, on).frontend.lora_resolver_dir == "/mine"  # llmp's option wins


# -- llmp serve -------------------------------------------------------------------------


def test_serve_with_lora_modules_and_runtime_updates(tiny_llama: Path, files: dict) -> None:
    module_b = json.dumps({"name": "b", "path": str(files["b"]), "base_model_name": SERVED})
    env = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "true", "VLLM_LORA_RESOLVER_CACHE_DIR": str(files["dir"])}
    args = ("--served-model-name", SERVED, "--dtype", "float32", "--enable-lora", "--max-loras", "2")
    with serving(tiny_llama, *args, "--lora-modules", f"a={files['a']}", "--lora-modules", module_b, env=env) as server:
        http = httpx.Client(base_url=server.url, timeout=60)
        models = {card["id"]: card for card in http.get("/v1/models").json()["data"]}
        assert {name: (card["parent"], card["root"]) for name, card in models.items() if name != SERVED} == {
            "a": (SERVED, str(files["a"])),
            "b": (SERVED, str(files["b"])),
        }
        body = {"prompt": [5, 6, 7, 8], "max_tokens": 4, "temperature": 0}
        texts = {}
        for model in (SERVED, "a", "b", "found"):  # "found": by the filesystem resolver (the vLLM variables)
            response = http.post("/v1/completions", json={**body, "model": model})
            assert response.status_code == 200, response.text
            assert response.json()["model"] == model
            texts[model] = response.json()["choices"][0]["text"]
        assert len(set(texts.values())) == 4
        assert http.post("/v1/completions", json={**body, "model": "nothing"}).status_code == 404
        metrics = http.get("/metrics").text
        assert re.search(r'^llmp_lora_requests_info\{.*max_lora="2".*\} ', metrics, re.M), metrics
        assert "LoRA adapters can be loaded at run time" in server.log()


@pytest.mark.parametrize(
    ("module", "status", "message"),
    [
        ("bad=/nowhere/at/all", 1, "--lora-modules bad: Loading lora bad failed: No adapter found for /nowhere/at/all"),
        ('{"name": "c", "path": "P", "base_model_name": "org/else"}', 1, "--lora-modules c: LoRA adapter 'c' is for"),
        ("nonsense", 2, "--lora-modules 'nonsense' must be NAME=PATH"),
    ],
    ids=["missing", "other base model", "syntax"],
)
def test_a_bad_lora_module_stops_start_up_in_one_line(
    tiny_llama: Path, files: dict, module: str, status: int, message: str
) -> None:
    module = module.replace('"P"', json.dumps(str(files["a"])))
    result = run_llmp("serve", str(tiny_llama), "--port", "0", "--enable-lora", "--lora-modules", module, check=False)
    errors = [line for line in result.stderr.splitlines() if line.startswith("llmp: error:")]
    assert result.returncode == status, result.stderr
    assert len(errors) == 1 and errors[0].startswith(f"llmp: error: {message}"), result.stderr
    assert "Traceback" not in result.stderr, result.stderr
