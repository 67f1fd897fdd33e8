"""What a prompt may be, for every entry point (``LLM``, ``AsyncLLM``, the engine)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

PromptType = str | Mapping[str, Any]  # text, or {"prompt_token_ids": [...]} (optionally with "prompt")
