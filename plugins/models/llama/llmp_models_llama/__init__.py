"""llmp plugin: the native Llama model on the paged KV cache.

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
        name="LlamaForCausalLM",
        impl="llmp_models_llama.model:LlamaForCausalLM",
        description="Llama 1/2/3, SmolLM, TinyLlama and other Llama-architecture causal LMs.",
    )
    yield ModelSpec(
        name="LlamaModel",
        impl="llmp_models_llama.model:LlamaModel",
        description="A Llama-architecture base model used for embeddings (last-token pooling).",
        tasks=("embed",),
    )
    yield ModelSpec(
        name="LlamaForSequenceClassification",
        impl="llmp_models_llama.model:LlamaForSequenceClassification",
        description="A Llama-architecture classifier or reward model (a score head on the last token; "
        "Skywork-Reward-Llama).",
        tasks=("classify",),
    )
