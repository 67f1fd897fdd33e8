"""LoRA adapters served as models (``--enable-lora --lora-modules``) through the OpenAI front-end,
checked token for token against the offline ``LLM`` with a ``LoRARequest``; and the run-time routes
of ``--enable-lora-runtime-updates``: vLLM's ``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter``,
llmp's ``/v1/loras``, and the filesystem resolver (``--lora-resolver-dir``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
from openai_frontend_support import API_KEY, assert_error, extra

from llmp import LLM, LoRARequest, SamplingParams
from llmp.testing import LiveServer, save_random_lora, serving

PROMPT = "The quick brown fox"
MESSAGES = [{"role": "user", "content": "Paged attention keeps"}]
MAX_TOKENS = 8
GREEDY = {"temperature": 0, "max_tokens": MAX_TOKENS, "extra_body": {"ignore_eos": True, "return_token_ids": True}}
AUTH = {"Authorization": f"Bearer {API_KEY}"}
SERVED = ("a", "b")  # --lora-modules; "c", "d" and "big" are loaded at run time, "r" by the resolver


@pytest.fixture(scope="module")
def adapters(tiny, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("loras")
    paths = {name: save_random_lora(tiny.path, root / name, seed=seed) for seed, name in enumerate("abcd", 1)}
    paths["big"] = save_random_lora(tiny.path, root / "big", rank=32, seed=5)  # above --max-lora-rank 16
    paths["r"] = save_random_lora(tiny.path, root / "resolver" / "r", seed=6)  # the resolver's directory
    return paths


@pytest.fixture(scope="module")
def lora_server(tiny, adapters: dict[str, Path]) -> Iterator[LiveServer]:
    b = {"name": "b", "path": str(adapters["b"]), "base_model_name": tiny.name}
    with serving(
        tiny.path,
        "--dtype",
        "float32",
        "--enable-lora",
        "--max-loras",
        "2",
        "--lora-modules",
        f"a={adapters['a']}",
        "--lora-modules",
        json.dumps(b),
        "--enable-lora-runtime-updates",
        "--lora-resolver-dir",
        str(adapters["r"].parent),
        "--api-key",
        API_KEY,
    ) as live:
        yield live
        assert live.process.poll() is None, f"the server died during the tests:\n{live.log()}"


@pytest.fixture(scope="module")
def sdk(lora_server: LiveServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=lora_server.api_url, api_key=API_KEY, max_retries=0, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def http(lora_server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=lora_server.url, headers=AUTH, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def offline(tiny, adapters: dict[str, Path]) -> dict[str | None, dict[str, list[int]]]:
    """The offline engine's greedy token ids per adapter (None: the base model): of PROMPT
    (``completion``) and of MESSAGES (``chat``)."""
    llm = LLM(str(tiny.path), dtype="float32", enable_lora=True, max_loras=2)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    names = [None, "a", "b", "c", "r"]
    loras = [None if n is None else LoRARequest(n, i, str(adapters[n])) for i, n in enumerate(names)]
    completions = llm.generate([PROMPT] * len(names), params, lora_request=loras, use_tqdm=False)
    chats = llm.chat([MESSAGES] * len(names), params, lora_request=loras, use_tqdm=False)
    return {
        n: {"completion": c.outputs[0].token_ids, "chat": t.outputs[0].token_ids}
        for n, c, t in zip(names, completions, chats, strict=True)
    }


def completion_ids(sdk: openai.OpenAI, model: str) -> list[int]:
    response = sdk.completions.create(model=model, prompt=PROMPT, **GREEDY)
    assert response.model == model
    return extra(response.choices[0], "token_ids")


# -- adapters as models ------------------------------------------------------------------


def test_adapters_change_the_tokens(offline):
    base = offline[None]["completion"]
    assert all(offline[name]["completion"] != base for name in ("a", "b", "c", "r")), offline


@pytest.mark.parametrize("model", ["a", "b"])
def test_completion_on_an_adapter_equals_offline(sdk, offline, model):
    assert completion_ids(sdk, model) == offline[model]["completion"]


def test_base_model_unchanged(sdk, tiny, offline):
    assert completion_ids(sdk, tiny.name) == offline[None]["completion"]


def test_chat_on_an_adapter_equals_offline(sdk, offline):
    response = sdk.chat.completions.create(model="b", messages=MESSAGES, **GREEDY)
    assert response.model == "b"
    assert extra(response.choices[0], "token_ids") == offline["b"]["chat"]


def test_streamed_chat_echoes_the_adapter(http, sdk):
    body = {"model": "a", "messages": MESSAGES, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}
    response = http.post("/v1/chat/completions", json={**body, "stream": True})
    assert response.status_code == 200, response.text
    chunks = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")]
    assert chunks and {c["model"] for c in chunks} == {"a"}
    streamed = "".join(choice["delta"].get("content") or "" for c in chunks for choice in c["choices"])
    whole = sdk.chat.completions.create(model="a", messages=MESSAGES, **GREEDY)
    assert streamed == whole.choices[0].message.content


def test_responses_api_on_an_adapter(http):
    response = http.post("/v1/responses", json={"model": "a", "input": PROMPT, "max_output_tokens": 4})
    assert response.status_code == 200, response.text
    assert response.json()["model"] == "a"


def test_mixed_batch_gives_each_request_its_own_tokens(sdk, tiny, offline):
    models = [tiny.name, "a", "b", "a", tiny.name, "b"]
    with ThreadPoolExecutor(len(models)) as pool:
        got = list(pool.map(lambda m: completion_ids(sdk, m), models))
    expected = [offline[None if m == tiny.name else m]["completion"] for m in models]
    assert got == expected


def test_models_lists_the_adapters_with_their_parent(sdk, tiny, adapters):
    cards = {m.id: m.model_dump() for m in sdk.models.list().data}
    assert list(cards)[0] == tiny.name and {"a", "b"} <= set(cards)
    assert cards[tiny.name]["parent"] is None
    for name in SERVED:
        card = cards[name]
        assert card["object"] == "model" and card["owned_by"] == "llmp"
        assert card["parent"] == tiny.name and card["root"] == str(adapters[name])


def test_unknown_model_is_a_404(sdk):
    with pytest.raises(openai.NotFoundError) as info:
        sdk.completions.create(model="no-such-adapter", prompt=PROMPT, max_tokens=2)
    assert "no-such-adapter" in info.value.message


# -- run-time loading: vLLM's routes -----------------------------------------------------------


def test_load_use_and_unload(http, sdk, tiny, adapters, offline):
    body = {"lora_name": "c", "lora_path": str(adapters["c"])}
    loaded = http.post("/v1/load_lora_adapter", json=body)
    assert loaded.status_code == 200, loaded.text
    assert loaded.headers["content-type"].startswith("text/plain")
    assert loaded.text == "Success: LoRA adapter 'c' added successfully."
    assert "c" in [m.id for m in sdk.models.list().data]
    assert completion_ids(sdk, "c") == offline["c"]["completion"]

    again = http.post("/v1/load_lora_adapter", json=body)
    assert_error(again, 400, contains="The lora adapter 'c' has already been loaded")
    inplace = http.post("/v1/load_lora_adapter", json={**body, "load_inplace": True})
    assert inplace.status_code == 200, inplace.text
    assert completion_ids(sdk, "c") == offline["c"]["completion"]

    unloaded = http.post("/v1/unload_lora_adapter", json={"lora_name": "c"})
    assert unloaded.status_code == 200, unloaded.text
    assert unloaded.text == "Success: LoRA adapter 'c' removed successfully."
    assert "c" not in [m.id for m in sdk.models.list().data]
    with pytest.raises(openai.NotFoundError):
        sdk.completions.create(model="c", prompt=PROMPT, max_tokens=2)
    assert_error(
        http.post("/v1/unload_lora_adapter", json={"lora_name": "c"}),
        404,
        contains="The lora adapter 'c' cannot be found.",
    )
    assert completion_ids(sdk, tiny.name) == offline[None]["completion"]  # the base model is untouched


@pytest.mark.parametrize("body", [{}, {"lora_name": "x"}, {"lora_path": "/tmp"}, {"lora_name": "", "lora_path": ""}])
def test_load_needs_a_name_and_a_path(http, body):
    assert_error(
        http.post("/v1/load_lora_adapter", json=body),
        400,
        contains="Both 'lora_name' and 'lora_path' must be provided.",
    )


def test_unload_needs_a_name(http):
    assert_error(
        http.post("/v1/unload_lora_adapter", json={}),
        400,
        contains="'lora_name' needs to be provided to unload a LoRA adapter.",
    )


def test_load_refuses_a_rank_above_the_limit(http, sdk, adapters):
    response = http.post("/v1/load_lora_adapter", json={"lora_name": "big", "lora_path": str(adapters["big"])})
    assert_error(response, 400, contains="LoRA rank 32 is greater than max_lora_rank 16.")
    assert "big" not in [m.id for m in sdk.models.list().data]


def test_load_of_a_missing_directory_is_a_404(http, tmp_path):
    response = http.post("/v1/load_lora_adapter", json={"lora_name": "gone", "lora_path": str(tmp_path / "gone")})
    assert_error(response, 404, contains="Loading lora gone failed: No adapter found for")


def test_load_of_a_corrupt_adapter_is_a_400_and_the_server_keeps_serving(http, sdk, adapters, offline, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "adapter_config.json").write_text((adapters["a"] / "adapter_config.json").read_text())
    (broken / "adapter_model.safetensors").write_bytes(b"not a safetensors file")
    response = http.post("/v1/load_lora_adapter", json={"lora_name": "broken", "lora_path": str(broken)})
    assert_error(response, 400)
    assert completion_ids(sdk, "a") == offline["a"]["completion"]


def test_runtime_routes_need_the_api_key(lora_server, adapters):
    with httpx.Client(base_url=lora_server.url, timeout=30) as anonymous:
        body = {"lora_name": "c", "lora_path": str(adapters["c"])}
        assert_error(anonymous.post("/v1/load_lora_adapter", json=body), 401)
        assert_error(anonymous.post("/v1/unload_lora_adapter", json={"lora_name": "a"}), 401)
        assert_error(anonymous.get("/v1/loras"), 401)
        assert_error(anonymous.delete("/v1/loras/a"), 401)
        assert_error(anonymous.post("/v1/loras/a/pin"), 401)


# -- llmp's /v1/loras ---------------------------------------------------------------------------


def test_loras_crud_and_pin(http, sdk, tiny, adapters):
    listed = http.get("/v1/loras")
    assert listed.status_code == 200, listed.text
    cards = {card["id"]: card for card in listed.json()["data"]}
    assert listed.json()["object"] == "list" and {"a", "b"} <= set(cards)
    assert cards["a"] == {
        "id": "a",
        "object": "lora",
        "lora_int_id": cards["a"]["lora_int_id"],
        "root": str(adapters["a"]),
        "parent": tiny.name,
        "pinned": False,
    }

    created = http.post("/v1/loras", json={"lora_name": "d", "lora_path": str(adapters["d"]), "pin": True})
    assert created.status_code == 200, created.text
    card = created.json()
    assert card["id"] == "d" and card["object"] == "lora" and card["pinned"] is True
    assert card["root"] == str(adapters["d"]) and card["lora_int_id"] not in {c["lora_int_id"] for c in cards.values()}
    assert completion_ids(sdk, "d")  # served at once
    assert_error(http.post("/v1/loras", json={"lora_name": "d", "lora_path": str(adapters["d"])}), 400)

    pinned = http.post("/v1/loras/a/pin")
    assert pinned.status_code == 200, pinned.text
    assert pinned.json()["id"] == "a" and pinned.json()["pinned"] is True
    assert {c["id"]: c["pinned"] for c in http.get("/v1/loras").json()["data"]}["a"] is True

    deleted = http.delete("/v1/loras/d")
    assert deleted.status_code == 200, deleted.text
    assert deleted.json() == {"id": "d", "object": "lora", "deleted": True}
    assert "d" not in {c["id"] for c in http.get("/v1/loras").json()["data"]}
    assert_error(http.delete("/v1/loras/d"), 404)
    assert_error(http.post("/v1/loras/no-such-adapter/pin"), 404)


# -- the filesystem resolver ---------------------------------------------------------------------


def test_resolver_serves_an_adapter_of_its_directory(sdk, offline):
    assert completion_ids(sdk, "r") == offline["r"]["completion"]
    assert "r" in [m.id for m in sdk.models.list().data]


def test_resolver_refuses_names_outside_its_directory(sdk):
    with pytest.raises(openai.NotFoundError):
        sdk.completions.create(model="../a", prompt=PROMPT, max_tokens=2)  # a real adapter, one level up


# -- metrics ---------------------------------------------------------------------------------------


def test_metrics_show_the_adapters(http, sdk):
    completion_ids(sdk, "a")
    text = http.get("/metrics").text
    assert "llmp_lora_requests_info{" in text, text[-2000:]


# -- without --enable-lora-runtime-updates -----------------------------------------------------------


@pytest.fixture(scope="module")
def static_server(tiny, adapters: dict[str, Path]) -> Iterator[LiveServer]:
    with serving(tiny.path, "--dtype", "float32", "--enable-lora", "--lora-modules", f"a={adapters['a']}") as live:
        yield live


def test_without_runtime_updates_adapters_serve_but_cannot_be_changed(static_server, adapters, offline):
    with httpx.Client(base_url=static_server.url, timeout=60) as client:
        body = {"model": "a", "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}
        response = client.post("/v1/completions", json={**body, "return_token_ids": True})
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["token_ids"] == offline["a"]["completion"]
        load = {"lora_name": "c", "lora_path": str(adapters["c"])}
        assert client.post("/v1/load_lora_adapter", json=load).status_code == 404
        assert client.post("/v1/unload_lora_adapter", json={"lora_name": "a"}).status_code == 404
        assert client.get("/v1/loras").status_code == 404
        # no resolver runs: a name that is not served is the plain 404
        assert_error(client.post("/v1/completions", json={**body, "model": "c"}), 404, param="model")
