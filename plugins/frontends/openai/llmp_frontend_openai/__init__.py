"""The OpenAI-compatible front-end: ``llmp serve --frontend openai`` (the default)."""

from llmp.api import require_api

require_api(">=0.5,<0.6")  # first, before any other llmp import (docs/plugins.md, "API versioning")

from collections.abc import Iterator

from llmp import hookimpl
from llmp.api import CommandSpec, FrontendSpec


@hookimpl
def llmp_register_frontends() -> Iterator[FrontendSpec]:
    yield FrontendSpec(
        name="openai",
        impl="llmp_frontend_openai.frontend:OpenAIFrontend",
        probe="llmp_frontend_openai.probe:CompletionsProbe",
        description="OpenAI API: /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/responses, /v1/models, "
        "/tokenize, /detokenize; vLLM's /v1/chat/completions/render, /v1/completions/render, "
        "/v1/score, /v1/rerank (and /v2/rerank), /v1/classify, /pooling; "
        "LoRA adapters as models, loaded at run time (--enable-lora-runtime-updates) through "
        "/v1/load_lora_adapter, /v1/unload_lora_adapter and /v1/loras; "
        "the Files and Batch APIs (/v1/files, /v1/batches), jobs kept in --batch-dir",
    )


@hookimpl
def llmp_register_commands() -> Iterator[CommandSpec]:
    yield CommandSpec(
        name="run-batch",
        impl="llmp_frontend_openai.run_batch:run_batch",
        help="Run a file of OpenAI batch requests through a model, offline (vLLM's run-batch).",
    )
