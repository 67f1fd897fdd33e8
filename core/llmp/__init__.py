"""llmp: an LLM inference and serving platform built from plugins.

Importing this package is cheap: it imports no torch, transformers or triton.
Plugin authors import from :mod:`llmp.api` and use :data:`hookimpl`.
"""

import os
from typing import Any

# OpenMP worker threads keep spinning between parallel regions instead of sleeping (GNU OpenMP's
# default spin is short): a CPU decode step is hundreds of small matmuls, and waking the threads
# for each one cost 30-40% of bf16 matrix-vector bandwidth on a 2-core machine (docs/benchmarks.md).
# Intel's OpenMP, which vLLM's CPU build preloads, spins for 200 ms by default. GNU OpenMP reads
# this when torch first loads it, so it only takes effect when llmp is imported before torch.
# LLMP_OMP_SPIN=0 keeps GNU OpenMP's default (the test suite does: it runs many engines at once).
if os.environ.get("LLMP_OMP_SPIN", "1") != "0":
    os.environ.setdefault("GOMP_SPINCOUNT", "10000000")  # about 0.2 s of spinning

from llmp.hookspecs import hookimpl  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "LLM",
    "AsyncLLM",
    "CompletionOutput",
    "PoolingParams",
    "PoolingRequestOutput",
    "RequestOutput",
    "SamplingParams",
    "StructuredOutputsParams",
    "__version__",
    "hookimpl",
]

_LAZY = {
    "LLM": "llmp.llm",
    "AsyncLLM": "llmp.async_llm",
    "SamplingParams": "llmp.sampling_params",
    "StructuredOutputsParams": "llmp.sampling_params",
    "RequestOutput": "llmp.outputs",
    "CompletionOutput": "llmp.outputs",
    "PoolingParams": "llmp.pooling_params",
    "PoolingRequestOutput": "llmp.outputs",
}


def __getattr__(name: str) -> Any:
    # The user-facing API loads on first use, so `import llmp` stays cheap for the CLI.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'llmp' has no attribute {name!r}")
