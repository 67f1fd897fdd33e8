"""Model files: finding a model (:mod:`.lookup`), reading GGUF files (:mod:`.gguf`),
reading config.json (:mod:`.config`), tokenizers (:mod:`.tokenizer`) and weights
(:mod:`.weights`), and resolving all of it once for an engine (:mod:`.resolve`)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """Where llmp keeps what it reads once from GGUF files (config, tokenizer, tensor plan) and config
    dumps (``LLMP_CACHE_DIR``, else ~/.cache/llmp)."""
    return Path(os.environ.get("LLMP_CACHE_DIR") or Path.home() / ".cache" / "llmp")
