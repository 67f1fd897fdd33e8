"""Serving a GGUF file: its config and tokenizer as a Hugging Face directory, its tensors straight from the file.

A GGUF file's config and tokenizer are written once into a small Hugging Face directory under the llmp cache
(reading a vocabulary out of GGUF takes seconds), keyed by the file's content, so a re-download or a reinstall
reuses it; the directory names the file (:data:`GGUF_SOURCE`). The weights are read from the file at every
load by :func:`iter_gguf_weights`, memory-mapped: quantised matrices stay in their blocks. The file is read
as transformers reads it (its GGUF loader's config, tensor names and per-architecture transforms), for the
architectures of :data:`GGUF_ARCHITECTURES`. A small header reader answers ``llmp ls`` (the file type) and the
Hub download (the architecture, from the first bytes) without parsing the vocabulary.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import math
import os
import re
import shutil
import struct
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from llmp.api import ModelLoadError
from llmp.model_files import cache_dir
from llmp.model_files.gguf_tensors import READ_AS

if TYPE_CHECKING:
    pass


log = logging.getLogger("llmp.model_files")

_CONVERSION_VERSION = 6  # bump when the converted layout changes, so old caches are not reused
# The general.architecture of the GGUF files llmp loads: those transformers reads (its GGUF loader names and
# un-transforms their tensors) whose model a native llmp plugin serves, and those of READ_AS. A Mistral model is a
# "llama" file, as llama.cpp writes it.
GGUF_ARCHITECTURES = ("llama", "qwen2", "qwen3", "qwen3moe", "gemma", "gemma2")
# GGUF metadata transformers leaves out of the config it reads (its defaults then fit only some models):
# architecture -> {key under the architecture: config attribute}
_METADATA_TRANSFORMERS_SKIPS = {
    "qwen3": {"attention.key_length": "head_dim"},  # its default, 128, is every released Qwen3's
    "qwen3moe": {"expert_feed_forward_length": "moe_intermediate_size"},  # 768: Qwen3-30B-A3B's, not 235B-A22B's
}
# The largest model (in float32 bytes) whose conversion computes in float32, as llama.cpp does: a file's
# numbers rounded to bfloat16 flip near-ties (the default model then answers "L'Étoile" for Paris);
# a larger model computes in bfloat16 so that its dequantised weights still fit in memory.
FLOAT32_COMPUTE_BYTES = 4 << 30
GGUF_SOURCE = "gguf-source.json"  # in a converted directory: the GGUF file its weights are read from
HUB_BLOB = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")  # a Hugging Face cache blob: named by its hash


def conversion_dir(path: Path) -> Path:
    """Where :func:`convert_gguf` puts (or has put) the conversion of the GGUF file ``path``: keyed by
    the file's content, so copies of one file (a re-download, a reinstalled package) share it."""
    source = f"{_CONVERSION_VERSION}:{_content_id(path)}"
    return cache_dir() / "gguf" / f"{path.stem}-{hashlib.sha256(source.encode()).hexdigest()[:16]}"


def remove_conversion(target: Path) -> None:
    """Remove a conversion directory of :func:`conversion_dir`, with its lock and any partial
    directory a killed converter left."""
    for leftover in [target, *target.parent.glob(f"{target.name}.partial-*")]:
        shutil.rmtree(leftover, ignore_errors=True)
    target.with_name(target.name + ".lock").unlink(missing_ok=True)


def _remove_old_layouts(directory: Path) -> None:
    """Remove what older llmp releases wrote for GGUF files (their ``.complete`` does not name this
    layout's version; one held a float32 copy of the weights, half a gigabyte for the default model):
    nothing would ever read them again, and ``llmp ls``/``rm`` do not see them."""
    for complete in directory.glob("*/.complete"):
        try:
            current = complete.read_text().strip() == str(_CONVERSION_VERSION)
        except OSError:
            continue
        if not current:
            log.info("removing %s, written for GGUF files by an older llmp", complete.parent)
            remove_conversion(complete.parent)


def _content_id(path: Path) -> str:
    """The file's content hash: a Hugging Face cache blob's name (its sha256), else the sha256 of
    its bytes, remembered by path, size and mtime so it is read once."""
    real = path.resolve()
    if real.parent.name == "blobs" and HUB_BLOB.match(real.name):
        return real.name
    stat = real.stat()
    where = f"{real}:{stat.st_size}:{stat.st_mtime_ns}"
    memo = cache_dir() / "gguf" / "content-ids" / hashlib.sha256(where.encode()).hexdigest()[:32]
    try:
        return memo.read_text().strip()
    except OSError:
        pass
    digest = hashlib.sha256()
    with open(real, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    try:  # a read-only cache only costs hashing again next time
        memo.parent.mkdir(parents=True, exist_ok=True)
        partial = memo.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(digest.hexdigest())
        os.replace(partial, memo)
    except OSError:
        pass
    return digest.hexdigest()


def no_space_message(doing: str, directory: Path, variable: str, needed: int | None) -> str:
    """One line for a full disk (ENOSPC): what was being written where, the variable moving that
    place, the space needed and the space free."""
    try:
        free = f"{shutil.disk_usage(_existing(directory)).free / 1e6:.0f} MB is free"
    except OSError:
        free = "the free space is unknown"
    need = f"it needs about {needed / 1e6:.0f} MB and " if needed else ""
    return (
        f"no space left on the disk holding {directory} while {doing}: {need}{free}. Free some space "
        f"(`llmp rm` a model no longer needed) or point {variable} at a larger disk"
    )


def _existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def convert_gguf(path: Path) -> Path:
    """The cached Hugging Face directory of a GGUF file (its config and tokenizer, written once, naming the file)."""
    if not path.is_file():
        raise ModelLoadError(f"GGUF file {path} does not exist")
    architecture = check_gguf_architecture(path)  # before the file is hashed or a tensor read
    target = conversion_dir(path)
    if (target / ".complete").is_file():
        _record_source(target, path)
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # one converter at a time (servers and test workers may start on the same file together);
    # the others wait and then find the finished directory, which nobody replaces once complete
    with open(target.with_name(target.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / ".complete").is_file():
            _record_source(target, path)
            return target
        partial = target.with_name(target.name + f".partial-{os.getpid()}")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        started = time.perf_counter()
        log.info("reading the config and tokenizer of %s, once (cached in %s) …", path.name, target.parent)
        try:
            _write_hf_dir(path, partial, architecture)
            (partial / ".complete").write_text(str(_CONVERSION_VERSION))
            shutil.rmtree(target, ignore_errors=True)  # an incomplete leftover of a killed converter
            os.replace(partial, target)
            _remove_old_layouts(target.parent)
            log.info("read the config and tokenizer of %s in %.1f s", path.name, time.perf_counter() - started)
        except Exception as exc:
            shutil.rmtree(partial, ignore_errors=True)
            if isinstance(exc, ModelLoadError):
                raise
            if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
                doing = f"writing the config and tokenizer of {path.name}"
                raise ModelLoadError(no_space_message(doing, target.parent, "LLMP_CACHE_DIR", None)) from None
            raise ModelLoadError(f"cannot read GGUF file {path}: {exc}") from exc
    return target


def check_gguf_architecture(path: Path) -> str:
    """The GGUF file's ``general.architecture``, read from its header; a one-line ``ModelLoadError`` naming it and
    the supported ones when llmp does not load it."""
    try:
        architecture = gguf_metadata(path, {"general.architecture"}).get("general.architecture")
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path} is not a readable GGUF file: {exc}") from None
    if architecture not in GGUF_ARCHITECTURES:
        raise ModelLoadError(
            f"GGUF file {path} has architecture {architecture!r}, which llmp does not load; supported: "
            f"{', '.join(GGUF_ARCHITECTURES)} (a Mistral model is a llama file)"
        )
    return architecture


def _write_hf_dir(path: Path, out: Path, architecture: str) -> None:
    from llmp.progress import progress_bar

    # the header's few keys llmp needs, read by its own reader: gguf's decodes the whole vocabulary first
    keys = {f"{architecture}.{key}" for key in _METADATA_TRANSFORMERS_SKIPS.get(architecture, {})}
    try:
        metadata = gguf_metadata(path, {"llama.expert_count", *keys})
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path} is not a readable GGUF file: {exc}") from exc
    if metadata.get("llama.expert_count"):  # transformers reads a llama file's MLP only: Mixtral's would be lost
        raise ModelLoadError(
            f"GGUF file {path} is a mixture-of-experts llama file (Mixtral), which llmp does not load; "
            "serve the model's safetensors repository instead"
        )
    with progress_bar("Reading GGUF: config", 3, "steps") as bar:  # the tokenizer is the slow step
        from llmp.model_files.gguf_tensors import write_tensor_plan

        config = _hf_config(path, architecture, metadata)
        config.save_pretrained(out)
        bar.advance()
        bar.describe("Reading GGUF: tensor names")
        write_tensor_plan(path, out, config, architecture)
        bar.advance()
        bar.describe("Reading GGUF: tokenizer")
        _gguf_tokenizer(path, config.model_type).save_pretrained(out)
        bar.advance()
    _record_source(out, path)


def _gguf_tokenizer(path: Path, model_type: str) -> Any:
    """The file's tokenizer, as ``AutoTokenizer`` reads it. Its class is taken directly where that works: for a
    GGUF file, ``AutoTokenizer`` first reads the config again with gguf's reader, which decodes the whole
    vocabulary (8 s of the default model's 9; the class itself reads the file's tokenizer in under a second)."""
    from transformers import AutoTokenizer
    from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING_NAMES, tokenizer_class_from_name
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    name = TOKENIZER_MAPPING_NAMES.get(model_type)
    try:
        return (tokenizer_class_from_name(name) if name else TokenizersBackend).from_pretrained(
            path.parent, gguf_file=path.name
        )
    except Exception:  # a class that needs what AutoTokenizer passes it (Gemma's unknown token)
        return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def _record_source(model_dir: Path, path: Path) -> None:
    """Name the GGUF file whose tensors ``model_dir``'s model loads (the last path it was converted from:
    a directory is shared by copies of one file, and any of them will do)."""
    record = model_dir / GGUF_SOURCE
    text = json.dumps({"file": str(path.resolve())})
    try:
        if record.is_file() and record.read_text() == text:
            return
        partial = record.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(text)
        os.replace(partial, record)
    except OSError as exc:
        raise ModelLoadError(f"cannot record the GGUF file of {model_dir}: {exc}") from exc


def gguf_source(model_dir: Path) -> Path | None:
    """The GGUF file whose tensors the model of ``model_dir`` loads, or None for a directory of safetensors."""
    record = model_dir / GGUF_SOURCE
    if not record.is_file():
        return None
    source = Path(json.loads(record.read_text())["file"])
    if not source.is_file():
        raise ModelLoadError(f"GGUF file {source}, which {model_dir} was read from, is gone: serve the file again")
    return source


def _hf_config(path: Path, architecture: str, metadata: dict[str, Any]) -> Any:
    """The config transformers reads from the file, completed with what it leaves out (from ``metadata``, the
    header's values), naming the causal-LM class llmp serves and the compute dtype (:data:`FLOAT32_COMPUTE_BYTES`)."""
    from transformers import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    config_dict = _transformers_config_dict(path, architecture)
    config = CONFIG_MAPPING[config_dict["model_type"]].from_dict(config_dict)
    for attr in ("quantization_config", "_model_name_or_path"):
        if hasattr(config, attr):
            delattr(config, attr)
    for key, attribute in _METADATA_TRANSFORMERS_SKIPS.get(architecture, {}).items():
        if (value := metadata.get(f"{architecture}.{key}")) is not None:
            setattr(config, attribute, value)
    config.architectures = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[config.model_type]]
    float32_bytes = 4 * gguf_parameter_count(path)
    config.dtype = "float32" if float32_bytes <= FLOAT32_COMPUTE_BYTES else "bfloat16"
    return config


def _transformers_config_dict(path: Path, architecture: str) -> dict[str, Any]:
    """The config dict ``AutoConfig.from_pretrained(gguf_file=...)`` reads from a GGUF file of ``architecture``,
    built with transformers' own mapping tables from the header as llmp's reader reads it: transformers' reader
    (``gguf.GGUFReader``) decodes every field of the file first, the vocabulary's 100 000 strings included, which
    was seconds of a cold start. ``tests/engine/test_gguf_architectures.py`` checks the two are equal."""
    import mmap

    from transformers.integrations.ggml import GGUF_CONFIG_DEFAULTS_MAPPING
    from transformers.modeling_gguf_pytorch_utils import GGUF_TO_TRANSFORMERS_MAPPING

    from llmp.model_files.gguf_tensors import read_tensor_table

    with open(path, "rb") as f:
        metadata = read_gguf_metadata(f, None)
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            tensor_names = {tensor.name for tensor in read_tensor_table(data)}
    # as transformers reads it: a llama file whose general.name is exactly "mistral" is a Mistral model
    renamed = "mistral" if architecture == "llama" and metadata.get("general.name") == "mistral" else architecture
    renamed = {"qwen3moe": "qwen3_moe", **READ_AS}.get(architecture, renamed)
    config: dict[str, Any] = {"tie_word_embeddings": "output.weight" not in tensor_names}
    defaults = GGUF_CONFIG_DEFAULTS_MAPPING
    for key, value in defaults.get(renamed, defaults.get(architecture, {})).items():
        config.setdefault(key, value)
    renames = GGUF_TO_TRANSFORMERS_MAPPING["config"]
    for key, value in metadata.items():
        prefix, _, config_key = key.replace(architecture, renamed).partition(".")
        if isinstance(value, list) and len(value) == 1:
            value = value[0]
        if isinstance(value, str) and architecture in value and architecture not in READ_AS:
            value = value.replace(architecture, renamed)
        target = renames.get(prefix, {}).get(config_key)
        if target is not None and target != -1:
            config[target] = value
    if architecture in READ_AS:
        config["model_type"] = architecture  # read with another's tables, a model of its own
    if "vocab_size" not in config:  # as transformers: the tokenizer's vocabulary (its strings are decoded here only)
        tokens = gguf_metadata(path, {"tokenizer.ggml.tokens"}).get("tokenizer.ggml.tokens")
        if tokens is not None:
            config["vocab_size"] = len(tokens)
    return config


def weights_quantization(model_dir: Path) -> str | None:
    """How the model's weights are quantised, for the start-up line: ``GGUF Q4_K_M`` for a GGUF file's
    model, else None."""
    source = gguf_source(model_dir)
    return None if source is None else f"GGUF {gguf_file_type(source)}"


def gguf_file_type(path: Path) -> str:
    """The file type a GGUF header names (``general.file_type``: Q4_K_M, Q4_1, F16 ...), read from
    the header alone; ``unknown`` when it names none or cannot be read."""
    try:
        import gguf

        file_type = gguf_metadata(path, {"general.file_type"}).get("general.file_type")
        return "unknown" if file_type is None else gguf.LlamaFileType(int(file_type)).name.split("_", 1)[1]
    except (OSError, ValueError):  # an unreadable header is shown as such, not a failed listing
        return "unknown"


def gguf_parameter_count(path: Path) -> int:
    """How many weights the GGUF file holds (its tensor table's element counts)."""
    import mmap

    from llmp.model_files.gguf_tensors import read_tensor_table

    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        return sum(math.prod(tensor.shape) for tensor in read_tensor_table(data))


def gguf_tensor_count(path: Path) -> int:
    """How many tensors the GGUF file holds (from its header: the metadata is skipped, not decoded)."""
    with open(path, "rb") as f:
        if _exactly(f, 4) != b"GGUF":
            raise ModelLoadError(f"{path} is not a GGUF file")
        _exactly(f, 4)
        (count,) = struct.unpack("<Q", _exactly(f, 8))
    return count


# -- the header: metadata without the tensors -----------------------------------------------------------

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


def gguf_metadata(path: Path, keys: set[str]) -> dict[str, Any]:
    """The values of ``keys`` in the GGUF file's header (those it has), read up to the last one wanted."""
    with open(path, "rb") as f:
        return read_gguf_metadata(f, keys)


def read_gguf_metadata(stream: IO[bytes], keys: set[str] | None) -> dict[str, Any]:
    """The values of ``keys`` among the key-value pairs at the start of a GGUF stream, reading no
    further than the last one wanted (arrays are skipped, not decoded); ``keys=None``: every value but
    the tokenizer's arrays. ``ValueError`` when the stream is not GGUF or ends first (a truncated read
    of a remote file's first bytes)."""
    if _exactly(stream, 4) != b"GGUF":
        raise ValueError("not a GGUF file")
    (version,) = struct.unpack("<I", _exactly(stream, 4))
    if version < 2:
        raise ValueError(f"GGUF version {version} is not read")
    _, count = struct.unpack("<QQ", _exactly(stream, 16))
    found: dict[str, Any] = {}
    for _ in range(count):
        if keys is not None and len(found) == len(keys):
            break
        key = _string(stream)
        (kind,) = struct.unpack("<I", _exactly(stream, 4))
        if key in keys if keys is not None else not (kind == _ARRAY and key.startswith("tokenizer.")):
            found[key] = _value(stream, kind)
        else:
            _skip(stream, kind)
    return found


def _exactly(stream: IO[bytes], size: int) -> bytes:
    data = stream.read(size)
    if len(data) != size:
        raise ValueError("the GGUF header ends early")
    return data


def _string(stream: IO[bytes]) -> str:
    (size,) = struct.unpack("<Q", _exactly(stream, 8))
    return _exactly(stream, size).decode("utf-8", "replace")


def _value(stream: IO[bytes], kind: int) -> Any:
    if kind in _SCALARS:
        fmt = _SCALARS[kind]
        return struct.unpack(fmt, _exactly(stream, struct.calcsize(fmt)))[0]
    if kind == _STRING:
        return _string(stream)
    if kind == _ARRAY:
        item, count = struct.unpack("<IQ", _exactly(stream, 12))
        return [_value(stream, item) for _ in range(count)]
    raise ValueError(f"unknown GGUF value type {kind}")


def _skip(stream: IO[bytes], kind: int) -> None:
    if kind in _SCALARS:
        _exactly(stream, struct.calcsize(_SCALARS[kind]))
    elif kind == _STRING:
        (size,) = struct.unpack("<Q", _exactly(stream, 8))
        _exactly(stream, size)  # read, not seeked: a truncated stream must say it ended
    elif kind == _ARRAY:
        item, count = struct.unpack("<IQ", _exactly(stream, 12))
        if item in _SCALARS:
            _exactly(stream, count * struct.calcsize(_SCALARS[item]))
        else:
            for _ in range(count):
                _skip(stream, item)
    else:
        raise ValueError(f"unknown GGUF value type {kind}")
