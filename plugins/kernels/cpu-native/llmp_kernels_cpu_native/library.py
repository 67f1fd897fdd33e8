"""Loading the compiled library (``torch.ops.llmp_native``) once per process."""

from __future__ import annotations

import functools
import logging
import os

import torch

from llmp_kernels_cpu_native.built import NativeLibraryUnavailable, check_library

log = logging.getLogger(__name__)

# 0: vdpbf16ps pairs even on an AMX CPU; onednn: the cpu set's matmuls; emulate: the tile path in scalar code
AMX_VARIABLE = "LLMP_NATIVE_AMX"


@functools.cache
def load() -> str:
    """Load the library's ops into ``torch.ops.llmp_native``; the instruction set its hot loops run on
    (``avx512``, ``avx2`` or ``scalar``: the best the CPU has, or lower with ``LLMP_NATIVE_ISA``)."""
    path = check_library()
    try:
        torch.ops.load_library(str(path))
    except OSError as error:  # built for another torch or platform: undefined symbols, a wrong ELF class
        raise NativeLibraryUnavailable(f"the compiled kernels at {path} do not load: {error}") from error
    isa = torch.ops.llmp_native.isa()
    own = torch.ops.llmp_native.dense_matmul_supported() and os.environ.get(AMX_VARIABLE, "") != "onednn"
    matmul = torch.ops.llmp_native.dense_matmul_path() if own else "the cpu set's oneDNN"
    log.info("cpu-native kernels: %s loops, bfloat16 matmuls: %s, threads: %s (%s)", isa, matmul, threads(), path.name)
    return isa


@functools.cache
def quant_matmul_types() -> frozenset[int]:
    """The GGML type ids the library's ``quant_matmul`` computes."""
    load()
    return frozenset(torch.ops.llmp_native.quant_matmul_types())


# dense_matmul's two forms of the pairs: vdpbf16ps (AVX-512 BF16), and AVX2 widening each pair to float32
PAIRS_PATHS = ("avx512-bf16 pairs", "avx2 pairs")


@functools.cache
def dense_supported() -> bool:
    """Whether the library's ``dense_matmul`` runs here: a CPU with AVX2 at least, its AVX2 or AVX-512 loops
    selected (``LLMP_NATIVE_ISA=scalar`` leaves bfloat16 layers to the cpu set)."""
    load()
    return bool(torch.ops.llmp_native.dense_matmul_supported())


@functools.cache
def dense_chosen() -> bool:
    """Whether bfloat16 layers take ``dense_matmul``: wherever it runs (on AMX tiles where the CPU has them,
    :func:`dense_path`), unless ``LLMP_NATIVE_AMX=onednn`` leaves them to the cpu set's oneDNN matmuls, called in
    padded 32-row blocks (kept to compare the two on an AMX CPU)."""
    return dense_supported() and os.environ.get(AMX_VARIABLE, "") != "onednn"


def dense_path() -> str:
    """How ``dense_matmul`` multiplies here: ``amx tiles``, ``avx512-bf16 pairs``, ``avx2 pairs`` (a CPU without
    AVX-512 BF16, or ``LLMP_NATIVE_ISA=avx2``), ``emulated amx tiles`` (``LLMP_NATIVE_AMX=emulate``, a test of
    the tile path on any AVX-512 BF16 CPU) or ``none``."""
    load()
    return torch.ops.llmp_native.dense_matmul_path()


def dense_on_pairs() -> bool:
    """Whether ``dense_matmul`` multiplies on the pairs here (either form), where the gated epilogue and the
    decoder layer in one call run."""
    return dense_path() in PAIRS_PATHS


def threads() -> str:
    """What a call runs on: ``openmp`` (split over torch's threads, ``torch.get_num_threads()``) or
    ``calling thread`` (a library built without OpenMP). Before ``load``, ``unknown``."""
    try:
        return torch.ops.llmp_native.threads()
    except (AttributeError, RuntimeError):  # not loaded yet; a library from before this op
        return "unknown"
