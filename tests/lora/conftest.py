"""Shared fixtures of the LoRA tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmp.testing import save_tiny_model


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama checkpoint (float32; shared by a module's tests)."""
    path = tmp_path_factory.mktemp("llama")
    save_tiny_model(path, "LlamaForCausalLM", seed=3, qk_scale=4.0)
    return path
