"""Models by name from the Hugging Face Hub: huggingface_hub's real client against a server on loopback
speaking the Hub's HTTP protocol (HF_ENDPOINT), downloading into a Hugging Face cache of the test's own
(HF_HOME), then served from it with HF_HUB_OFFLINE=1; and every way it fails being one line saying
what was tried and how to fix it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

from llmp.api import ModelLoadError
from llmp.model_files.lookup import find_model_dir
from llmp.model_files.resolve import resolve_model
from llmp.options import EngineConfig
from llmp.testing import HubRepo, free_port, run_llmp, save_tiny_gguf, save_tiny_llama, serving, serving_hub

LLAMA = "tiny-org/tiny-llama"
GGUF = "tiny-org/Tiny-GGUF"
GATED = "tiny-org/gated-llama"
TOKEN = "hf_test_token"


@pytest.fixture(scope="module")
def repos(tmp_path_factory: pytest.TempPathFactory) -> list[HubRepo]:
    root = tmp_path_factory.mktemp("repos")
    save_tiny_llama(root / "llama")
    llama = HubRepo.files_of(root / "llama")
    # what serving does not need: other weight formats and the repository's odds and ends
    extras = {
        "pytorch_model.bin": b"0" * 64,
        "onnx/model.onnx": b"0" * 64,
        "README.md": b"# tiny",
        ".gitattributes": b"",
    }
    longer = {**llama, "config.json": _with(llama["config.json"], max_position_embeddings=256)}
    ggufs = {}
    for file_type, tag in ((15, "Q4_K_M"), (7, "Q8_0"), (1, "F16")):
        save_tiny_gguf(root / f"tiny-{tag}.gguf", file_type=file_type)
        ggufs[f"tiny-{tag}.gguf"] = (root / f"tiny-{tag}.gguf").read_bytes()
    return [
        HubRepo(LLAMA, {"main": {**llama, **extras}, "v2": longer}),
        HubRepo(GGUF, {"main": {**ggufs, "mmproj-tiny-F16.gguf": ggufs["tiny-F16.gguf"], "README.md": b"#"}}),
        HubRepo(GATED, {"main": llama}, gated=True),
    ]


def _with(config: bytes, **changes: object) -> bytes:
    return json.dumps({**json.loads(config), **changes}).encode()


@pytest.fixture(scope="module")
def hub(repos: list[HubRepo]):
    with serving_hub(*repos, token=TOKEN) as live:
        yield live


@pytest.fixture
def hub_env(hub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """This test's Hugging Face cache and llmp cache, pointed at the loopback Hub, in this process
    (huggingface_hub reads its variables once, at import) and for the commands it runs."""
    from huggingface_hub import constants

    hub.requests.clear()
    monkeypatch.setattr(constants, "ENDPOINT", hub.url)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", hub.url + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("LLMP_CACHE_DIR", str(tmp_path / "llmp"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    return {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf"), "LLMP_CACHE_DIR": str(tmp_path / "llmp")}


def _offline(env: dict[str, str]) -> dict[str, str]:
    """No Hub at all: offline mode, and an endpoint where nothing listens."""
    return {**env, "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": f"http://127.0.0.1:{free_port()}"}


def test_pull_fetches_only_what_serving_needs_then_serve_runs_offline_from_the_cache(hub, hub_env, tmp_path):
    pulled = run_llmp("pull", LLAMA, env=hub_env)
    assert f"pulled {LLAMA}" in pulled.stdout
    fetched = sorted(p.removeprefix(f"{LLAMA}/") for p in hub.downloads())
    assert "model.safetensors" in fetched and "config.json" in fetched and "tokenizer.json" in fetched
    assert not {"pytorch_model.bin", "onnx/model.onnx", "README.md", ".gitattributes"} & set(fetched)
    hub.requests.clear()
    with serving(LLAMA, "--max-model-len", "64", env=_offline(hub_env)) as server:
        models = httpx.get(f"{server.api_url}/models").json()["data"]
        assert [m["id"] for m in models] == [LLAMA]
        body = {"model": LLAMA, "prompt": "the quick", "max_tokens": 3, "temperature": 0}
        done = httpx.post(f"{server.api_url}/completions", json=body, timeout=60).json()
        assert done["usage"]["completion_tokens"] == 3
    assert hub.requests == []  # nothing asked of the Hub, which is not reachable anyway


def test_a_revision_downloads_that_revision_and_is_found_in_the_cache_offline(hub, hub_env, monkeypatch):
    from huggingface_hub import constants

    assert resolve_model(EngineConfig(model=LLAMA, revision="v2")).context_len == 256
    main = find_model_dir(LLAMA)
    assert json.loads((main / "config.json").read_text())["max_position_embeddings"] == 512
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert resolve_model(EngineConfig(model=LLAMA, revision="v2")).context_len == 256  # from the cache
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    with pytest.raises(ModelLoadError, match=r"has no revision 'v9' on the Hub at http://127\.0\.0\.1:\d+"):
        find_model_dir(LLAMA, revision="v9")


def test_a_gguf_repository_serves_the_file_a_tag_or_gguf_file_names_and_q4_k_m_without_one(hub, hub_env, caplog):
    quantization = {15: "Q4_K_M", 7: "Q8_0", 1: "F16"}
    with caplog.at_level("WARNING", logger="llmp.model_files"):
        default = find_model_dir(GGUF)
    assert default.name.startswith("tiny-Q4_K_M-")  # llama.cpp's default tag, converted once
    assert "serving tiny-Q4_K_M.gguf" in caplog.text and f"{GGUF}:TAG" in caplog.text
    assert find_model_dir(GGUF.lower() + ":q8_0").name.startswith("tiny-Q8_0-")  # tags and ids in any case
    assert find_model_dir(GGUF, gguf_file="tiny-F16.gguf").name.startswith("tiny-F16-")
    assert sorted(hub.downloads()) == [f"{GGUF}/tiny-{t}.gguf" for t in sorted(quantization.values())]
    with pytest.raises(ModelLoadError) as caught:
        find_model_dir(f"{GGUF}:Q5_K_S")
    message = str(caught.value)
    assert "no GGUF file matching tag 'Q5_K_S'" in message and hub.url in message and "revision main" in message
    assert "tags F16, Q4_K_M, Q8_0" in message and "mmproj" not in message
    with pytest.raises(ModelLoadError, match="has no GGUF file 'nope.gguf'"):
        find_model_dir(GGUF, gguf_file="nope.gguf")


def test_hf_token_is_sent_as_authorization_and_a_gated_repo_without_it_says_how_to_get_access(hub, hub_env):
    refused = run_llmp("pull", GATED, env=hub_env, check=False)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    error = refused.stderr.strip()
    assert error.startswith(f"llmp: error: model '{GATED}' is gated on the Hub at {hub.url}")
    assert f"{hub.url}/{GATED}" in error and "HF_TOKEN" in error and "no token was sent" in error
    hub.requests.clear()
    run_llmp("pull", GATED, env={**hub_env, "HF_TOKEN": TOKEN})
    sent = {auth for _, path, auth in hub.requests if GATED in path}  # the client asks the Hub other things too
    assert hub.downloads() and sent == {f"Bearer {TOKEN}"}


def test_an_unknown_repository_says_it_is_neither_here_nor_on_the_hub(hub, hub_env):
    with pytest.raises(ModelLoadError) as caught:
        find_model_dir("tiny-org/no-such-model")
    message = str(caught.value)
    assert f"'tiny-org/no-such-model' is not on this machine nor on the Hub at {hub.url} (revision main)" in message
    assert "HF_TOKEN" in message and "\n" not in message


def test_offline_is_one_line_within_a_second_saying_what_was_tried_and_how_to_fix_it(hub, hub_env, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    started = time.perf_counter()
    with pytest.raises(ModelLoadError) as caught:
        find_model_dir("tiny-org/not-here", revision="v2")
    assert time.perf_counter() - started < 1.0
    message = str(caught.value)
    assert "'tiny-org/not-here' is not on this machine" in message and "revision v2" in message
    assert "HF_HUB_OFFLINE=1" in message and hub.url in message and "HF_HOME" in message
    assert "llmp pull tiny-org/not-here" in message and "hf download tiny-org/not-here --local-dir not-here" in message
    assert hub.requests == []
    served = run_llmp("serve", "tiny-org/not-here", env=_offline(hub_env), check=False)
    assert served.returncode == 2 and served.stdout == ""
    assert served.stderr.startswith("llmp: error: model 'tiny-org/not-here' is not on this machine")
    assert len(served.stderr.strip().splitlines()) == 1, served.stderr  # no traceback


def test_an_unreachable_hub_is_one_line_naming_the_endpoint(hub_env):
    dead = f"http://127.0.0.1:{free_port()}"
    started = time.perf_counter()
    pulled = run_llmp("pull", "tiny-org/anything", env={**hub_env, "HF_ENDPOINT": dead}, check=False)
    assert pulled.returncode == 2 and len(pulled.stderr.strip().splitlines()) == 1, pulled.stderr
    assert f"the Hub at {dead} could not be reached" in pulled.stderr and "llmp pull" in pulled.stderr
    assert time.perf_counter() - started < 60
