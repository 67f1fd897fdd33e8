"""llmp plugin: the Transformers fallback models, serving any causal LM or sequence classifier no native plugin claims.

This module only registers; ``model.py`` (which imports torch and transformers) loads on selection.
"""

from llmp.api import require_api

require_api(">=0.5,<0.6")  # first, before any other llmp import (docs/plugins.md, "API versioning")

from collections.abc import Iterator

from llmp import hookimpl
from llmp.api import ModelSpec


@hookimpl
def llmp_register_models() -> Iterator[ModelSpec]:
    yield ModelSpec(
        name="*",
        impl="llmp_models_transformers.model:TransformersForCausalLM",
        description="Any Hugging Face AutoModelForCausalLM without a native plugin, run by transformers "
        "with llmp's paged attention.",
        model_impl="transformers",
    )
    yield ModelSpec(
        name="*ForSequenceClassification",
        impl="llmp_models_transformers.model:TransformersForSequenceClassification",
        description="Any Hugging Face AutoModelForSequenceClassification without a native plugin "
        "(ModernBERT, DeBERTa cross-encoders, reward models), run by transformers request by request.",
        tasks=("classify",),
        model_impl="transformers",
    )
