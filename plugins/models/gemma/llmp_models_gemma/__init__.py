"""llmp plugin: the native Gemma and Gemma 2 models.

This module only registers; ``model.py`` (which imports torch) loads on selection.
"""

from llmp.api import require_api

require_api(">=0.5,<0.6")  # first, before any other llmp import (docs/plugins.md, "API versioning")

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
    yield ModelSpec(
        name="GemmaForSequenceClassification",
        impl="llmp_models_gemma.model:GemmaForSequenceClassification",
        description="A Gemma classifier, or bge-reranker-v2-gemma through hf_overrides "
        '(classifier_from_token ["Yes"], method no_post_processing).',
        tasks=("classify",),
    )
    yield ModelSpec(
        name="Gemma2ForSequenceClassification",
        impl="llmp_models_gemma.model:Gemma2ForSequenceClassification",
        description="A Gemma 2 classifier or reward model (a score head on the last token).",
        tasks=("classify",),
    )
