"""llmp: an LLM inference and serving platform built from plugins.

Importing this package is cheap: it imports no torch, transformers or triton, and it changes
no process-wide setting (an engine's thread settings are applied where the engine starts:
``llmp.engine.process_settings``).
Users import ``LLM``, ``AsyncLLM``, ``SamplingParams`` and the rest of ``__all__`` from here;
plugins mark hook implementations with :data:`hookimpl`. The modules plugins may import are
listed in :data:`llmp.api.PUBLIC_MODULES` (and ``docs/plugins.md``).
"""

from typing import Any

from llmp.hookspecs import hookimpl

__version__ = "0.1.0"

__all__ = [
    "LLM",
    "AsyncLLM",
    "BeamSearchOutput",
    "BeamSearchParams",
    "BeamSearchSequence",
    "ClassificationOutput",
    "ClassificationRequestOutput",
    "CompletionOutput",
    "EmbeddingOutput",
    "EmbeddingRequestOutput",
    "LoRARequest",
    "PoolingOutput",
    "PoolingParams",
    "PoolingRequestOutput",
    "Prompt",
    "ReasoningMarkers",
    "RequestOutput",
    "RequestOutputKind",
    "SamplingParams",
    "ScoringOutput",
    "ScoringRequestOutput",
    "StructuredOutputsParams",
    "TextPrompt",
    "TokensPrompt",
    "__version__",
    "hookimpl",
]

_LAZY = {
    "LLM": "llmp.llm",
    "AsyncLLM": "llmp.async_llm",
    "SamplingParams": "llmp.sampling_params",
    "BeamSearchParams": "llmp.beam_search",
    "BeamSearchOutput": "llmp.beam_search",
    "BeamSearchSequence": "llmp.beam_search",
    "StructuredOutputsParams": "llmp.sampling_params",
    "ReasoningMarkers": "llmp.sampling_params",
    "RequestOutputKind": "llmp.sampling_params",
    "RequestOutput": "llmp.outputs",
    "CompletionOutput": "llmp.outputs",
    "PoolingParams": "llmp.pooling_params",
    "Prompt": "llmp.inputs",
    "TextPrompt": "llmp.inputs",
    "TokensPrompt": "llmp.inputs",
    "LoRARequest": "llmp.lora",
    "PoolingRequestOutput": "llmp.outputs",
    "PoolingOutput": "llmp.outputs",
    "EmbeddingOutput": "llmp.outputs",
    "EmbeddingRequestOutput": "llmp.outputs",
    "ClassificationOutput": "llmp.outputs",
    "ClassificationRequestOutput": "llmp.outputs",
    "ScoringOutput": "llmp.outputs",
    "ScoringRequestOutput": "llmp.outputs",
}


def __getattr__(name: str) -> Any:
    # The user-facing API loads on first use, so `import llmp` stays cheap for the CLI.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'llmp' has no attribute {name!r}")
