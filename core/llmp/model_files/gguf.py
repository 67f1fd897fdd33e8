"""Converting a GGUF file into a Hugging Face directory.

A GGUF file is converted once into a Hugging Face directory (config, float32
safetensors of the dequantized weights, tokenizer) under the llmp cache, so
every later load reads plain safetensors and needs no GGUF parsing. The file is
read as transformers reads it (its GGUF loader's config, tensor names and
per-architecture transforms), for the architectures of :data:`GGUF_ARCHITECTURES`.
The conversion is keyed by the file's content, so a re-download or a reinstall
reuses it. A small header reader answers ``llmp ls`` (the file type) and the
Hub download (the architecture, from the first bytes) without parsing the vocabulary.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import logging
import os
import re
import shutil
import struct
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from llmp.api import ModelLoadError
from llmp.model_files import cache_dir

if TYPE_CHECKING:
    import torch

    from llmp.progress import Bar

log = logging.getLogger("llmp.model_files")

_CONVERSION_VERSION = 3  # bump when the converted layout changes, so old caches are not reused
# The general.architecture of the GGUF files llmp converts: those transformers reads (its GGUF loader names and
# un-transforms their tensors) whose model a native llmp plugin serves. A Mistral model is a "llama" file, as
# llama.cpp writes it; transformers cannot read a gemma (1) file.
GGUF_ARCHITECTURES = ("llama", "qwen2", "qwen3", "qwen3moe", "gemma2")
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
    """Convert a GGUF file to a cached Hugging Face directory (once) and return it."""
    if not path.is_file():
        raise ModelLoadError(f"GGUF file {path} does not exist")
    check_gguf_architecture(path)  # before the file is hashed or a tensor read
    target = conversion_dir(path)
    if (target / ".complete").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # one converter at a time (servers and test workers may start on the same file together);
    # the others wait and then find the finished directory, which nobody replaces once complete
    with open(target.with_name(target.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / ".complete").is_file():
            return target
        partial = target.with_name(target.name + f".partial-{os.getpid()}")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        started = time.perf_counter()
        log.info("converting %s to a Hugging Face directory, once (cached in %s) …", path.name, target.parent)
        try:
            _write_hf_dir(path, partial)
            (partial / ".complete").touch()
            shutil.rmtree(target, ignore_errors=True)  # an incomplete leftover of a killed converter
            os.replace(partial, target)
            log.info("converted %s in %.1f s", path.name, time.perf_counter() - started)
        except Exception as exc:
            shutil.rmtree(partial, ignore_errors=True)
            if isinstance(exc, ModelLoadError):
                raise
            if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
                doing = f"converting {path.name} (float32 weights, about 4 bytes a parameter)"
                raise ModelLoadError(no_space_message(doing, target.parent, "LLMP_CACHE_DIR", None)) from None
            raise ModelLoadError(f"cannot convert GGUF file {path}: {exc}") from exc
    return target


def check_gguf_architecture(path: Path) -> str:
    """The GGUF file's ``general.architecture``, read from its header; a one-line ``ModelLoadError`` naming it and
    the supported ones when llmp does not convert it."""
    try:
        architecture = gguf_metadata(path, {"general.architecture"}).get("general.architecture")
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path} is not a readable GGUF file: {exc}") from None
    if architecture not in GGUF_ARCHITECTURES:
        raise ModelLoadError(
            f"GGUF file {path} has architecture {architecture!r}, which llmp does not convert; supported: "
            f"{', '.join(GGUF_ARCHITECTURES)} (a Mistral model is a llama file)"
        )
    return architecture


def _write_hf_dir(path: Path, out: Path) -> None:
    import gguf

    from llmp.progress import progress_bar

    try:
        reader = gguf.GGUFReader(path)
    except Exception as exc:
        raise ModelLoadError(f"{path} is not a readable GGUF file: {exc}") from exc
    if _field(reader, "llama.expert_count"):  # transformers reads a llama file's MLP only: Mixtral's would be lost
        raise ModelLoadError(
            f"GGUF file {path} is a mixture-of-experts llama file (Mixtral), which llmp does not convert; "
            "serve the model's safetensors repository instead"
        )
    # steps: the config, each tensor, the safetensors file, the tokenizer (the slowest step after the tensors)
    with progress_bar("Converting GGUF: config", len(reader.tensors) + 3, "steps") as bar:
        _convert(path, out, reader, bar)


def _convert(path: Path, out: Path, reader: Any, bar: Bar) -> None:
    from safetensors.torch import save_file
    from transformers import AutoTokenizer

    config = _hf_config(path, reader)
    bar.advance()
    bar.describe("Converting GGUF: tensors")
    tensors = _hf_tensors(reader, config, bar)
    bar.describe("Converting GGUF: safetensors")
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    del tensors
    config.save_pretrained(out)
    bar.advance()
    bar.describe("Converting GGUF: tokenizer")
    AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name).save_pretrained(out)
    bar.advance()


def _hf_config(path: Path, reader: Any) -> Any:
    """The config transformers reads from the file, completed with what it leaves out, naming the causal-LM class
    llmp serves and the compute dtype (:data:`FLOAT32_COMPUTE_BYTES`)."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    for attr in ("quantization_config", "_model_name_or_path"):
        if hasattr(config, attr):
            delattr(config, attr)
    architecture = _field(reader, "general.architecture")
    for key, attribute in _METADATA_TRANSFORMERS_SKIPS.get(architecture, {}).items():
        if (value := _field(reader, f"{architecture}.{key}")) is not None:
            setattr(config, attribute, value)
    config.architectures = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[config.model_type]]
    float32_bytes = 4 * sum(int(tensor.n_elements) for tensor in reader.tensors)
    config.dtype = "float32" if float32_bytes <= FLOAT32_COMPUTE_BYTES else "bfloat16"
    return config


def _hf_tensors(reader: Any, config: Any, bar: Bar) -> dict[str, torch.Tensor]:
    """The file's tensors in float32 under the checkpoint names of ``config``'s model, as transformers' GGUF loader
    reads them (its name map and the tensor processor of the architecture: llama's q/k un-permutation, Gemma's
    norms less one, Qwen-MoE's experts), dequantised one at a time. Tensors the model has no place for (a llama
    file's ``rope_freqs``) are left out, as transformers leaves them."""
    import numpy as np
    import torch
    from gguf import dequantize
    from transformers import AutoModelForCausalLM
    from transformers.core_model_loading import revert_weight_conversion
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor, get_gguf_hf_weights_map

    architecture = _field(reader, "general.architecture")
    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=config.to_dict())
    with torch.device("meta"):  # the model's parameter names, without memory
        model = AutoModelForCausalLM.from_config(config)
    # GGUF names by the file's architecture: transformers goes by the model's, and a llama file it reads as
    # Mistral (one named "mistral") has no "mistral" names in gguf
    hf_names = get_gguf_hf_weights_map(_TopLevelNames(model), processor, model_type=architecture)
    parsed: dict[str, dict[str, torch.Tensor]] = {"tensors": {}}  # a processor merging tensors (experts) puts them here
    for tensor in reader.tensors:
        weights = dequantize(tensor.data, tensor.tensor_type)
        processed = processor.process(
            weights=weights, name=tensor.name, tensor_key_mapping=hf_names, parsed_parameters=parsed
        )
        if processed.name in hf_names:  # a float32 array of its own (an F32 tensor is a read-only view of the file)
            parsed["tensors"][hf_names[processed.name]] = torch.from_numpy(
                np.require(processed.weights, np.float32, "CW")
            )
        elif processed.name is not None:
            log.debug("GGUF tensor %s has no place in %s; left out", processed.name, config.architectures[0])
        bar.advance()
    # transformers' names in memory -> the checkpoint's (a Qwen-MoE layer's stacked experts -> one matrix each)
    return revert_weight_conversion(model, parsed["tensors"])


class _TopLevelNames:
    """A causal LM as ``get_gguf_hf_weights_map`` reads it, without its submodules: the map of the whole model's
    parameter names is complete, and mapping each of its hundreds of submodules again (for models converted from
    a submodule, as Bloom) builds gguf's name table each time: seconds for a 30-layer model."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.config, self._state_dict = model.config, model.state_dict()

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self._state_dict

    def named_children(self) -> list[tuple[str, torch.nn.Module]]:
        return []


def _field(reader: Any, key: str) -> Any:
    """A scalar or string field of the GGUF header, or None."""
    from transformers.modeling_gguf_pytorch_utils import read_field

    values = read_field(reader, key)
    return values[0] if values else None


# -- the header: metadata without the tensors -----------------------------------------------------------

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


def gguf_metadata(path: Path, keys: set[str]) -> dict[str, Any]:
    """The values of ``keys`` in the GGUF file's header (those it has), read up to the last one wanted."""
    with open(path, "rb") as f:
        return read_gguf_metadata(f, keys)


def read_gguf_metadata(stream: IO[bytes], keys: set[str]) -> dict[str, Any]:
    """The values of ``keys`` among the key-value pairs at the start of a GGUF stream, reading no
    further than the last one wanted (arrays are skipped, not decoded). ``ValueError`` when the
    stream is not GGUF or ends first (a truncated read of a remote file's first bytes)."""
    if _exactly(stream, 4) != b"GGUF":
        raise ValueError("not a GGUF file")
    (version,) = struct.unpack("<I", _exactly(stream, 4))
    if version < 2:
        raise ValueError(f"GGUF version {version} is not read")
    _, count = struct.unpack("<QQ", _exactly(stream, 16))
    found: dict[str, Any] = {}
    for _ in range(count):
        if len(found) == len(keys):
            break
        key = _string(stream)
        (kind,) = struct.unpack("<I", _exactly(stream, 4))
        if key in keys:
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
