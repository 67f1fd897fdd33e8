"""What ``/api/tags``, ``/api/show`` and ``/api/ps`` say about the served model, read once from its files.

A GGUF model is served from the small Hugging Face directory of its config and tokenizer (under the llmp
cache, named after the file), which names the file: its quantisation is read from that name, its size and
parameter count from the file.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from llmp.frontend import gguf_file_type, gguf_parameter_count, gguf_source

# a GGUF file's quantisation, as its name ends (SmolLM2-135M-Instruct.Q4_1, model-q4_k_m)
_QUANT = re.compile(r"[.\-_](I?Q\d(?:_K)?(?:_[A-Z0-9]+)?|BF16|F16|F32)$", re.IGNORECASE)
_DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}


@dataclass
class ModelFacts:
    """The served model as Ollama describes one."""

    format: str = "safetensors"
    family: str = ""
    parameter_count: int = 0
    quantization_level: str = ""
    size: int = 0  # bytes of the model's files
    modified_at: str = ""
    digest: str = ""
    config: dict[str, Any] = field(default_factory=dict)

    def details(self, context_length: int | None = None) -> dict[str, Any]:
        """Ollama's ``ModelDetails``; its newer ``context_length`` (the window a request can use here)
        and ``embedding_length`` (the model's hidden size) where known."""
        details: dict[str, Any] = {
            "parent_model": "",
            "format": self.format,
            "family": self.family,
            "families": [self.family] if self.family else None,
            "parameter_size": parameter_size(self.parameter_count),
            "quantization_level": self.quantization_level,
        }
        if context_length:
            details["context_length"] = context_length
        if self.config.get("hidden_size"):
            details["embedding_length"] = self.config["hidden_size"]
        return details


def read_facts(model_root: str, dtype: str | None) -> ModelFacts:
    """The facts of the model in ``model_root`` (a Hugging Face directory); unknown ones stay empty."""
    root = Path(model_root) if model_root else None
    facts = ModelFacts()
    if root is None or not root.is_dir():
        return facts
    try:
        facts.config = json.loads((root / "config.json").read_text())
    except (OSError, ValueError):
        facts.config = {}
    facts.family = str(facts.config.get("model_type") or "")
    weights = sorted(root.glob("*.safetensors"))
    facts.size = sum(f.stat().st_size for f in weights) or sum(f.stat().st_size for f in root.glob("*.bin"))
    facts.parameter_count = sum(_safetensors_elements(f) for f in weights)
    stamp = max((f.stat().st_mtime for f in weights), default=root.stat().st_mtime)
    facts.modified_at = datetime.fromtimestamp(stamp, UTC).isoformat().replace("+00:00", "Z")
    source = gguf_source(root)
    if source is not None:  # what Ollama reports: the GGUF file
        # the header names it (a file downloaded from the Hub is a blob named by its hash); else the file's name
        file_type = gguf_file_type(source)
        if file_type == "unknown":
            quant = _QUANT.search(source.stem)
            file_type = quant.group(1).upper() if quant else ""
        facts.format, facts.quantization_level = "gguf", file_type
        facts.size, facts.parameter_count = source.stat().st_size, gguf_parameter_count(source)
        facts.modified_at = datetime.fromtimestamp(source.stat().st_mtime, UTC).isoformat().replace("+00:00", "Z")
    else:
        declared = facts.config.get("torch_dtype") or facts.config.get("dtype") or dtype or ""
        facts.quantization_level = _DTYPES.get(str(declared), str(declared).upper())
    facts.digest = hashlib.sha256(str(root.resolve()).encode()).hexdigest()
    return facts


def parameter_size(count: int) -> str:
    """Ollama's short form of a parameter count (its ``format.HumanNumber``): 8B, 7.6B, 134.52M, 135M, 97K."""
    if not count:
        return ""
    for scale, suffix, decimals in ((10**9, "B", 1), (10**6, "M", 2)):
        if count >= scale:
            number = count / scale
            return f"{number:.0f}{suffix}" if number == int(number) else f"{number:.{decimals}f}{suffix}"
    return f"{count / 1000:.0f}K" if count >= 1000 else str(count)


def _safetensors_elements(path: Path) -> int:
    """The number of values in a safetensors file, from its header (no tensor is read)."""
    try:
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
    except (OSError, ValueError, struct.error):
        return 0
    total = 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        count = 1
        for dim in entry.get("shape", []):
            count *= dim
        total += count
    return total


def model_info(facts: ModelFacts, name: str, max_model_len: int) -> dict[str, Any]:
    """``/api/show``'s ``model_info``: GGUF's metadata keys, from the Hugging Face config.
    ``general.basename`` is the name the request used (what Copilot shows, as Ollama echoes it);
    the context length is what a request can use here, the server's ``--max-model-len``."""
    config, arch = facts.config, facts.family or "unknown"
    info: dict[str, Any] = {
        "general.architecture": arch,
        "general.basename": name,
        "general.parameter_count": facts.parameter_count,
    }
    keys = {
        "context_length": max_model_len,
        "embedding_length": config.get("hidden_size"),
        "block_count": config.get("num_hidden_layers"),
        "feed_forward_length": config.get("intermediate_size"),
        "attention.head_count": config.get("num_attention_heads"),
        "attention.head_count_kv": config.get("num_key_value_heads"),
        "vocab_size": config.get("vocab_size"),
    }
    info.update({f"{arch}.{key}": value for key, value in keys.items() if value is not None})
    return info


def now_rfc3339() -> str:
    """The time as Ollama stamps ``created_at``: RFC 3339, UTC, microseconds."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def stop_texts(tokenizer: Any, model_root: str) -> list[str]:
    """The texts of the tokens that end a reply: the model's end-of-sequence tokens, from its
    ``generation_config.json`` and its tokenizer (what Ollama's Modelfile lists as ``stop``)."""
    ids: list[int] = []
    try:
        declared = json.loads((Path(model_root) / "generation_config.json").read_text()).get("eos_token_id")
    except (OSError, ValueError, TypeError):
        declared = None
    ids += declared if isinstance(declared, list) else [declared] if isinstance(declared, int) else []
    if isinstance(getattr(tokenizer, "eos_token_id", None), int):
        ids.append(tokenizer.eos_token_id)
    texts = [tokenizer.convert_ids_to_tokens(i) for i in dict.fromkeys(ids)]
    return [text for text in texts if isinstance(text, str) and text]


def go_value(value: Any) -> str:
    """A parameter's value as Ollama prints it (Go's ``%#v``): strings quoted, whole floats bare."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)
