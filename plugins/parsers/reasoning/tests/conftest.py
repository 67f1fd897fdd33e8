"""Tokenizers for the reasoning-parser tests (built offline, once per session)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # for reasoning_parsers_support (tests import it too)

from reasoning_parsers_support import make_tokenizer


@pytest.fixture(scope="session")
def marker_tokenizer() -> Any:
    """Markers are one token each."""
    return make_tokenizer(marker_tokens=True)


@pytest.fixture(scope="session")
def split_tokenizer() -> Any:
    """Markers are several tokens each."""
    return make_tokenizer(marker_tokens=False)


@pytest.fixture(scope="session", params=["marker-token", "multi-token-marker"])
def tokenizer(request: pytest.FixtureRequest, marker_tokenizer: Any, split_tokenizer: Any) -> Any:
    return marker_tokenizer if request.param == "marker-token" else split_tokenizer
