"""The SageMaker front-end: ``llmp serve --frontend sagemaker`` (``POST /invocations``; ``/ping`` is the core's)."""

from llmp.api import require_api

require_api(">=0.5,<0.6")  # first, before any other llmp import (docs/plugins.md, "API versioning")

from collections.abc import Iterator

from llmp import hookimpl
from llmp.api import FrontendSpec


@hookimpl
def llmp_register_frontends() -> Iterator[FrontendSpec]:
    yield FrontendSpec(
        name="sagemaker",
        impl="llmp_frontend_sagemaker.frontend:SageMakerFrontend",
        probe="llmp_frontend_sagemaker.probe:InvocationsProbe",
        description="SageMaker: POST /invocations routed by body shape (messages: chat, prompt: completion, "
        "input: embeddings or classification, query+documents: rerank, text_1+text_2: score, task: pooling); "
        "GET /ping is the server's; LoRA adapters by the X-Amzn-SageMaker-Adapter-Identifier header, loaded "
        "through /adapters with --enable-lora-runtime-updates",
    )
