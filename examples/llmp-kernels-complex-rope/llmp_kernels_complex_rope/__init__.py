"""llmp-kernels-complex-rope: a kernel set for llmp, the torch reference set with its own rotary kernel.

This module is the plugin's entry point: llmp imports it to collect the registration below, so it
imports nothing but llmp's API; ``kernels.py`` (which imports torch) is imported when an engine
selects the set.
"""

from llmp.api import require_api

require_api(">=0.5,<0.6")  # first, before any other llmp import: an incompatible llmp says so

from collections.abc import Iterator

from llmp import hookimpl
from llmp.api import KernelSetSpec


@hookimpl
def llmp_register_kernels() -> Iterator[KernelSetSpec]:
    yield KernelSetSpec(
        name="complex_rope",
        impl="llmp_kernels_complex_rope.kernels:ComplexRopeKernels",
        description="The torch reference kernels with rotary embeddings as one complex multiplication",
        devices=("cpu", "cuda"),
        # an engine that names no set takes the highest priority for its device (cpu 5, triton 10):
        # 0 keeps this one to `--kernels complex_rope` until it has earned more
        priority=0,
    )
