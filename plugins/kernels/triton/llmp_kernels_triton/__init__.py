"""llmp plugin: the ``triton`` kernel set, chosen automatically on CUDA.

This module only registers; ``kernels.py`` (which imports torch and triton)
loads on selection. On CPU the kernels run only under Triton's interpreter
(``TRITON_INTERPRET=1`` set before triton is imported), which is for tests.
"""

from llmp.api import require_api

require_api(">=0.5,<0.6")  # first, before any other llmp import (docs/plugins.md, "API versioning")

from collections.abc import Iterator

from llmp import hookimpl
from llmp.api import KernelSetSpec


@hookimpl
def llmp_register_kernels() -> Iterator[KernelSetSpec]:
    yield KernelSetSpec(
        name="triton",
        impl="llmp_kernels_triton.kernels:TritonKernels",
        description="Triton kernels for CUDA: one-launch paged attention for mixed prefill/decode batches "
        "(GQA, sliding window, soft-capping), fused RMSNorm, rotary, gated activations, KV writes, multi-LoRA, "
        "matmuls straight from GGUF blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K).",
        devices=("cuda",),
        priority=10,
    )
