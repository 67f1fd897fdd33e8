"""What ``/api/tags``, ``/api/show`` and ``/api/ps`` say about the served model, read once from its files.

A GGUF model is served from the Hugging Face directory llmp converted it into (under the llmp cache,
named after the file), so its format and quantisation are read from that name.
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

    def details(self) -> dict[str, Any]:
        return {
            "parent_model": "",
            "format": self.format,
            "family": self.family,
            "families": [self.family] if self.family else None,
            "parameter_size": parameter_size(self.parameter_count),
            "quantization_level": self.quantization_level,
        }


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
    quant = _QUANT.search(root.name.rsplit("-", 1)[0]) if root.parent.name == "gguf" else None
    if quant:
        facts.format, facts.quantization_level = "gguf", quant.group(1).upper()
    else:
        declared = facts.config.get("torch_dtype") or facts.config.get("dtype") or dtype or ""
        facts.quantization_level = _DTYPES.get(str(declared), str(declared).upper())
    facts.digest = hashlib.sha256(str(root.resolve()).encode()).hexdigest()
    return facts


def parameter_size(count: int) -> str:
    """Ollama's short form of a parameter count: 8.0B, 134.52M."""
    if count >= 1e9:
        return f"{count / 1e9:.1f}B"
    if count >= 1e6:
        return f"{count / 1e6:.2f}M"
    return f"{count / 1e3:.2f}K" if count else ""


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


def model_info(facts: ModelFacts, max_model_len: int) -> dict[str, Any]:
    """``/api/show``'s ``model_info``: GGUF's metadata keys, from the Hugging Face config."""
    config, arch = facts.config, facts.family or "unknown"
    info: dict[str, Any] = {"general.architecture": arch, "general.parameter_count": facts.parameter_count}
    keys = {
        "context_length": config.get("max_position_embeddings") or max_model_len,
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
