"""llmp plugin: the ``cpu`` kernel set, chosen by default on CPU.

This module only registers; ``kernels.py`` (which imports torch) loads on selection.
"""

from llmp.api import require_api

require_api(">=0.5,<0.6")  # first, before any other llmp import (docs/plugins.md, "API versioning")

from collections.abc import Iterator

from llmp import hookimpl
from llmp.api import KernelSetSpec


@hookimpl
def llmp_register_kernels() -> Iterator[KernelSetSpec]:
    yield KernelSetSpec(
        name="cpu",
        impl="llmp_kernels_cpu.kernels:CpuKernels",
        description="CPU kernels: oneDNN-packed bf16/fp16 linear layers, decode attention planned once per step.",
        devices=("cpu",),
        priority=5,
    )
