"""llmp plugin: the native Gemma and Gemma 2 models.

This module only registers; ``model.py`` (which imports torch) loads on selection.
"""

from collections.abc import Iterator

from llmp import hookimpl
from llmp.api import ModelSpec


@hookimpl
def llmp_register_models() -> Iterator[ModelSpec]:
    yield ModelSpec(
        name="GemmaForCausalLM",
        impl="llmp_models_gemma.model:GemmaForCausalLM",
        description="Gemma 2B/7B (scaled embeddings, GELU MLP, (1 + w) RMSNorm).",
    )
    yield ModelSpec(
        name="Gemma2ForCausalLM",
        impl="llmp_models_gemma.model:Gemma2ForCausalLM",
        description="Gemma 2 (alternating sliding-window layers, attention and logit soft-capping).",
    )
