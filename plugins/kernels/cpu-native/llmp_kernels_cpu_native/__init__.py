"""llmp plugin: the ``cpu-native`` kernel set, the compiled CPU kernels (chosen before ``cpu`` when they load).

This module only registers, and cheaply: it checks that the compiled library was built (and for the torch
installed now) without importing torch; ``kernels.py`` loads the library on selection. When the library is
missing, the registration hook fails with the reason, so ``llmp plugins list`` shows the plugin broken in one
line and the engine picks the next set (``cpu``).
"""

from llmp.api import require_api

require_api(">=0.5,<0.6")  # first, before any other llmp import (docs/plugins.md, "API versioning")

import sys
from collections.abc import Iterator

from llmp import hookimpl
from llmp.api import KernelSetSpec
from llmp_kernels_cpu_native.built import NativeLibraryUnavailable, check_library, expected_isa

__all__ = ["NativeLibraryUnavailable", "check_library", "llmp_register_kernels"]


@hookimpl
def llmp_register_kernels() -> Iterator[KernelSetSpec]:
    check_library()
    if "torch" in sys.modules:  # loading costs nothing more here: check what only loading can tell (ABI, symbols)
        from llmp_kernels_cpu_native.library import load

        load()
    yield KernelSetSpec(
        name="cpu-native",
        impl="llmp_kernels_cpu_native.kernels:NativeKernels",
        description=f"Compiled CPU kernels, the {expected_isa()} path on this CPU (of avx512, avx2, scalar): "
        "matmuls straight from GGUF's quantised blocks (Q4_0 ... Q8_0, Q2_K ... Q6_K), paged attention, "
        "row-wise ops, and bfloat16 matmuls on AVX-512 BF16 CPUs (AMX tiles where present), over the cpu set.",
        devices=("cpu",),
        priority=6,
    )
