"""Models by name from the Hugging Face Hub: huggingface_hub's real client against a server on loopback
speaking the Hub's HTTP protocol (HF_ENDPOINT), downloading into a Hugging Face cache of the test's own
(HF_HOME), then served from it with HF_HUB_OFFLINE=1; and every way it fails being one line saying
what was tried and how to fix it."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from llmp.api import ModelLoadError
from llmp.model_files.hub import choose_files
from llmp.model_files.lookup import find_model_dir
from llmp.model_files.resolve import resolve_model
from llmp.options import EngineConfig
from llmp.testing import HubRepo, free_port, run_llmp, save_tiny_gguf, save_tiny_llama, serving, serving_hub

LLAMA = "tiny-org/tiny-llama"
GGUF = "tiny-org/Tiny-GGUF"
GATED = "tiny-org/gated-llama"
SHARDED = "tiny-org/sharded-llama"
PHI3_GGUF = "tiny-org/phi3-GGUF"
BIG = "tiny-org/big-llama"
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
    # names that hold the tag too, but do not end in it or are longer: the plain tiny-Q4_K_M.gguf wins
    ggufs |= {f"tiny-{odd}.gguf": ggufs["tiny-Q4_K_M.gguf"] for odd in ("Q4_K_M-imatrix", "UD-Q4_K_M")}
    save_tiny_llama(root / "sharded", max_shard_size="200KB")
    sharded = {**HubRepo.files_of(root / "sharded"), "consolidated.safetensors": b"0" * 64}  # Mistral's second copy
    save_tiny_gguf(root / "phi3.gguf", file_type=15, architecture="phi3")
    big = {**llama, "model.safetensors": os.urandom(3_000_000)}
    return [
        HubRepo(LLAMA, {"main": {**llama, **extras}, "v2": longer}),
        HubRepo(GGUF, {"main": {**ggufs, "mmproj-tiny-F16.gguf": ggufs["tiny-F16.gguf"], "README.md": b"#"}}),
        HubRepo(GATED, {"main": llama}, gated=True),
        HubRepo(SHARDED, {"main": sharded}),
        HubRepo(PHI3_GGUF, {"main": {"phi3-Q4_K_M.gguf": (root / "phi3.gguf").read_bytes()}}),
        HubRepo(BIG, {"main": big}),
    ]


def hub_files(hub, repo_id: str) -> list[str]:
    return [s["rfilename"] for s in httpx.get(f"{hub.url}/api/models/{repo_id}").json()["siblings"]]


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
    hub.ranges.clear()
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
    with caplog.at_level("INFO", logger="llmp.model_files"):
        default = find_model_dir(GGUF)
    assert default.name.startswith("tiny-Q4_K_M-")  # llama.cpp's default tag, converted once
    picked = next(r.getMessage() for r in caplog.records if "no tag given" in r.getMessage())
    assert "serving tiny-Q4_K_M.gguf" in picked and f"{GGUF}:TAG" in picked and "tiny-UD-Q4_K_M.gguf" in picked
    assert find_model_dir(f"hf.co/{GGUF}:Q4_K_M") == default  # Ollama's spelling
    # an exact tag beats -imatrix; of two names ending in it, the shorter, saying which and the other
    tie = choose_files(GGUF, sorted(hub_files(hub, GGUF)), "q4_k_m", None)
    assert tie.gguf == "tiny-Q4_K_M.gguf" and "(also tiny-UD-Q4_K_M.gguf)" in (tie.note or "")
    assert find_model_dir(f"https://huggingface.co/{GGUF.lower()}:q8_0").name.startswith("tiny-Q8_0-")  # any case
    assert find_model_dir(GGUF, gguf_file="tiny-F16.gguf").name.startswith("tiny-F16-")
    assert sorted(hub.downloads()) == [f"{GGUF}/tiny-{t}.gguf" for t in sorted(quantization.values())]
    assert find_model_dir(f"{GGUF}:tiny-Q4_K_M-imatrix.gguf").name.startswith("tiny-Q4_K_M-imatrix-")  # by name
    with pytest.raises(ModelLoadError) as caught:
        find_model_dir(f"{GGUF}:Q5_K_S")
    message = str(caught.value)
    assert "no GGUF file matching tag 'Q5_K_S'" in message and hub.url in message and "revision main" in message
    assert "tags F16, Q4_K_M, Q8_0" in message and "mmproj" not in message
    with pytest.raises(ModelLoadError, match="has no GGUF file 'nope.gguf'"):
        find_model_dir(GGUF, gguf_file="nope.gguf")


def test_without_a_tag_the_gguf_file_is_the_first_of_llama_cpps_preference_floats_last():
    files = ["m-F16.gguf", "m-BF16.gguf", "m-Q8_0.gguf", "m-Q5_K_S.gguf", "m-IQ4_XS.gguf", "README.md"]
    assert choose_files("o/m", files, None, None).gguf == "m-Q5_K_S.gguf"
    assert choose_files("o/m", ["m-F32.gguf", "m-BF16.gguf", "m-F16.gguf"], None, None).gguf == "m-F16.gguf"
    assert choose_files("o/m", ["m.Q8_0.gguf", "m.Q4_0.gguf"], None, None).gguf == "m.Q4_0.gguf"  # TheBloke's dots
    # quantisations llmp does not load come last, and a file of one is refused before any download
    iq = ["m-IQ4_XS.gguf", "m-IQ3_M.gguf", "m-Q4_1.gguf", "m-TQ1_0.gguf"]
    assert choose_files("o/m", iq, None, None).gguf == "m-Q4_1.gguf"
    assert choose_files("o/m", ["m-IQ4_XS.gguf", "m-F16.gguf"], None, None).gguf == "m-F16.gguf"
    for files, tag, gguf_file in ((["m-IQ4_XS.gguf", "m-IQ2_M.gguf"], None, None), (iq, "iq4_xs", None)):
        with pytest.raises(ModelLoadError, match=r"m-IQ\w+.gguf is quantised as IQ\w+, which llmp does not load"):
            choose_files("o/m", files, tag, gguf_file)
    with pytest.raises(ModelLoadError, match="nothing was downloaded"):
        choose_files("o/m", iq, None, "m-TQ1_0.gguf")


def test_hf_token_is_sent_as_authorization_and_a_gated_repo_without_it_says_how_to_get_access(hub, hub_env):
    refused = run_llmp("pull", GATED, env=hub_env, check=False)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    error = refused.stderr.strip()
    assert error.startswith(f"llmp: error: model '{GATED}' is gated on the Hub at {hub.url}")
    assert f"{hub.url}/{GATED}" in error and "HF_TOKEN" in error and "no token was sent" in error
    assert "`hf auth login`" in error
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
    assert "HF_TOKEN" not in pulled.stderr  # no token fixes a network that is down
    assert time.perf_counter() - started < 60


def test_a_hub_that_accepts_the_connection_and_never_answers_is_one_line_within_the_timeout(hub_env):
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)  # connections complete in the backlog; nothing ever reads or answers them
        dead = f"http://127.0.0.1:{silent.getsockname()[1]}"
        env = {**hub_env, "HF_ENDPOINT": dead, "HF_HUB_ETAG_TIMEOUT": "2", "HF_HUB_DOWNLOAD_TIMEOUT": "2"}
        started = time.perf_counter()
        try:
            pulled = run_llmp("pull", "tiny-org/anything", env=env, check=False, timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail("llmp pull waited for ever on a Hub that never answers")
    assert time.perf_counter() - started < 15
    assert pulled.returncode == 2 and len(pulled.stderr.strip().splitlines()) == 1, pulled.stderr
    assert f"the Hub at {dead} did not answer within 2 s" in pulled.stderr and "HF_HUB_ETAG_TIMEOUT" in pulled.stderr


def test_an_interrupted_download_is_resumed_online_and_named_offline(hub, hub_env, caplog, monkeypatch):
    from huggingface_hub import constants

    with caplog.at_level("INFO", logger="llmp.model_files"):
        snapshot = find_model_dir(SHARDED)
    shards = sorted(set(json.loads((snapshot / "model.safetensors.index.json").read_text())["weight_map"].values()))
    fetched = sorted(p.removeprefix(f"{SHARDED}/") for p in hub.downloads())
    assert set(shards) <= set(fetched) and len(shards) == 3
    assert "consolidated.safetensors" not in fetched  # only the shards the index names
    assert f"downloading 8 files (0.6 MB) of {SHARDED}@main from {hub.url}" in caplog.text  # the index came first

    # kill -9 during the download: a shard half written (huggingface_hub's temporary file), the tokenizer not begun
    shard, tokenizer = snapshot / shards[-1], snapshot / "tokenizer.json"
    data = shard.read_bytes()
    for link in (shard, tokenizer):
        link.resolve().unlink()
        link.unlink()
    blobs = snapshot.parents[1] / "blobs"
    (blobs / f"{hashlib.sha1(data).hexdigest()}.0123abcd.incomplete").write_bytes(data[:1000])

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelLoadError) as caught:
        find_model_dir(SHARDED)
    message = str(caught.value)
    assert f"'{SHARDED}' is only partly in the Hugging Face cache" in message and "\n" not in message
    assert f"{shards[-1]} (and 1 more) is missing" in message and f"llmp pull {SHARDED}` on a machine" in message
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)

    hub.requests.clear()
    assert find_model_dir(SHARDED) == snapshot  # online: the same files asked for again, what is here kept
    assert sorted(hub.downloads()) == sorted(f"{SHARDED}/{f}" for f in (shards[-1], "tokenizer.json"))
    assert shard.read_bytes() == data

    pulled = run_llmp("pull", SHARDED, env={**hub_env, "HF_HUB_OFFLINE": "1"})  # as `hf download` offline
    assert pulled.stdout.startswith(f"{SHARDED} (revision main) is already here, in the Hugging Face cache")


def test_a_gguf_file_llmp_cannot_convert_is_refused_from_its_header_before_downloading(hub, hub_env):
    with pytest.raises(ModelLoadError) as caught:
        find_model_dir(PHI3_GGUF)
    message = str(caught.value)
    assert "phi3-Q4_K_M.gguf is a GGUF file of architecture 'phi3', which llmp cannot load" in message
    assert "(it loads llama, qwen2, qwen3, qwen3moe, gemma, gemma2)" in message
    assert "nothing was downloaded" in message
    assert hub.downloads() == [] and [r for _, r in hub.ranges] == ["bytes=0-262143"]
    assert not list(Path(hub_env["HF_HOME"], "hub").glob("models--*/blobs/*"))


def test_a_full_disk_is_one_line_naming_the_cache_and_the_space_needed(hub, hub_env, tmp_path):
    disk = tmp_path / "small-disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a 1 MB tmpfs to fill (needs root): {mounted.stderr.decode().strip()}")
    try:
        pulled = run_llmp("pull", BIG, env={**hub_env, "HF_HOME": str(disk)}, check=False)
    finally:
        subprocess.run(["umount", str(disk)], check=True)
    assert pulled.returncode == 2 and "Traceback" not in pulled.stderr, pulled.stderr
    error = pulled.stderr.strip().splitlines()[-1]  # after huggingface_hub's progress bar
    assert f"llmp: error: no space left on the disk holding {disk / 'hub'} while downloading {BIG}" in error
    assert "it needs about 3 MB" in error and "HF_HOME" in error and "could not be reached" not in error
