"""Converting a GGUF file into a Hugging Face directory.

A GGUF file is converted once into a Hugging Face directory (config, float32
safetensors of the dequantized weights, tokenizer) under the llmp cache, so
every later load reads plain safetensors and needs no GGUF parsing. The
conversion is keyed by the file's content, so a re-download or a reinstall
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
    from llmp.progress import Bar

log = logging.getLogger("llmp.model_files")

# llama.cpp tensor names -> Hugging Face names, for Llama-architecture files.
_GGUF_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_GGUF_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}

_CONVERSION_VERSION = 3  # bump when the converted layout changes, so old caches are not reused
GGUF_ARCHITECTURES = ("llama",)  # the general.architecture values the converter handles
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


def _write_hf_dir(path: Path, out: Path) -> None:
    import gguf

    from llmp.progress import progress_bar

    try:
        reader = gguf.GGUFReader(path)
    except Exception as exc:
        raise ModelLoadError(f"{path} is not a readable GGUF file: {exc}") from exc
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    if arch not in GGUF_ARCHITECTURES:
        raise ModelLoadError(f"GGUF file {path} has architecture {arch!r}; only 'llama' files are supported")
    # steps: the config, each tensor, the safetensors file, the tokenizer (the slowest step after the tensors)
    with progress_bar("Converting GGUF: config", len(reader.tensors) + 3, "steps") as bar:
        _convert(path, out, reader, bar)


def _convert(path: Path, out: Path, reader: Any, bar: Bar) -> None:
    import gguf
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    bar.advance()
    bar.describe("Converting GGUF: tensors")
    for attr in ("quantization_config", "_model_name_or_path"):
        if hasattr(config, attr):
            delattr(config, attr)
    config.architectures = ["LlamaForCausalLM"]
    float32_bytes = 4 * sum(int(tensor.n_elements) for tensor in reader.tensors)
    config.dtype = "float32" if float32_bytes <= FLOAT32_COMPUTE_BYTES else "bfloat16"
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    tensors = {}
    for tensor in reader.tensors:
        name = _hf_name(tensor.name)
        weight = torch.from_numpy(gguf.quants.dequantize(tensor.data, tensor.tensor_type).copy()).float()
        if name.endswith("q_proj.weight"):
            weight = _unpermute_rope(weight, heads)
        elif name.endswith("k_proj.weight"):
            weight = _unpermute_rope(weight, kv_heads)
        tensors[name] = weight.contiguous()
        bar.advance()
    bar.describe("Converting GGUF: safetensors")
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(out)
    bar.advance()
    bar.describe("Converting GGUF: tokenizer")
    AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name).save_pretrained(out)
    bar.advance()


def _hf_name(name: str) -> str:
    if name in _GGUF_GLOBAL_NAMES:
        return _GGUF_GLOBAL_NAMES[name]
    parts = name.split(".")  # blk.N.attn_q.weight
    if parts[0] == "blk" and parts[2] in _GGUF_LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_GGUF_LAYER_NAMES[parts[2]]}.{parts[3]}"
    raise ModelLoadError(f"unknown GGUF tensor {name!r}")


def _unpermute_rope(weight: "torch.Tensor", num_heads: int) -> "torch.Tensor":  # noqa: F821
    # llama.cpp interleaves each head's rotary halves; undo it for the neox (half-split) layout
    rows, cols = weight.shape
    return weight.reshape(num_heads, rows // num_heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


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
