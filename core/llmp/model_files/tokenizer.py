"""Loading a model's tokenizer quickly."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

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
