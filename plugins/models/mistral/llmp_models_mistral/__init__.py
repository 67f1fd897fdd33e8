"""llmp plugin: the native Mistral (sliding-window attention) and Mixtral (mixture of experts) models.

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
        name="MistralForCausalLM",
        impl="llmp_models_mistral.model:MistralForCausalLM",
        description="Mistral 7B, Ministral and other Mistral-architecture causal LMs (sliding-window attention).",
    )
    yield ModelSpec(
        name="MixtralForCausalLM",
        impl="llmp_models_mistral.model:MixtralForCausalLM",
        description="Mixtral 8x7B / 8x22B: mixture of experts with top-k routing.",
    )
    yield ModelSpec(
        name="MistralModel",
        impl="llmp_models_mistral.model:MistralModel",
        description="A Mistral base model used for embeddings (E5-Mistral, SFR-Embedding; last-token pooling).",
        tasks=("embed",),
    )
    yield ModelSpec(
        name="MistralForSequenceClassification",
        impl="llmp_models_mistral.model:MistralForSequenceClassification",
        description="A Mistral-architecture classifier or reward model (a score head on the last token).",
        tasks=("classify",),
    )
