"""llmp plugin: the ``torch`` kernel set, the reference every other set is tested against.

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
        name="torch",
        impl="llmp_kernels_torch.kernels:TorchKernels",
        description="Reference kernels in plain PyTorch (any device torch supports).",
        devices=("cpu", "cuda"),
        priority=0,
    )
