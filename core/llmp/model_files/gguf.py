"""Converting a GGUF file into a Hugging Face directory.

A GGUF file is converted once into a Hugging Face directory (config, float32
safetensors of the dequantized weights, tokenizer) under the llmp cache, so
every later load reads plain safetensors and needs no GGUF parsing.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

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

_CONVERSION_VERSION = 2  # bump when the converted layout changes, so old caches are not reused


def convert_gguf(path: Path) -> Path:
    """Convert a GGUF file to a cached Hugging Face directory (once) and return it."""
    if not path.is_file():
        raise ModelLoadError(f"GGUF file {path} does not exist")
    stat = path.stat()
    source = f"{_CONVERSION_VERSION}:{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"
    key = hashlib.sha256(source.encode()).hexdigest()[:16]
    target = cache_dir() / "gguf" / f"{path.stem}-{key}"
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
    if arch != "llama":
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
    config.dtype = "bfloat16"  # the precision such models are trained in; the file holds float32
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
