"""What the build left: the compiled library's path, or why it cannot be used (checked without importing torch)."""

from __future__ import annotations

import os
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

PACKAGE_DIR = Path(__file__).parent
BUILD_ERROR = PACKAGE_DIR / "_build_error.txt"  # written by setup.py when the library could not be built
BUILT_WITH = PACKAGE_DIR / "_built_with.txt"  # the torch version the library was built against
LIBRARY_VARIABLE = "LLMP_NATIVE_LIBRARY"  # a library to load instead of the installed one
REINSTALL = "reinstall llmp-kernels-cpu-native with a C++ compiler and torch present (pip --no-build-isolation)"


class NativeLibraryUnavailable(RuntimeError):
    """The compiled library cannot be used: the one-line reason, and what to do."""


def library_path() -> Path:
    """The compiled library to load: ``$LLMP_NATIVE_LIBRARY``, else the one built into this package."""
    if forced := os.environ.get(LIBRARY_VARIABLE):
        return Path(forced)
    built = sorted(PACKAGE_DIR.glob("_C*.so"))
    return built[0] if built else PACKAGE_DIR / "_C.so"


def check_library() -> Path:
    """The library's path, after the checks that need no torch import; ``NativeLibraryUnavailable`` says why not."""
    path = library_path()
    if os.environ.get(LIBRARY_VARIABLE):
        if not path.is_file():
            raise NativeLibraryUnavailable(f"{LIBRARY_VARIABLE}={path} does not exist")
        return path
    # the last build's error wins over a library an earlier build left in the source tree (editable installs)
    if BUILD_ERROR.is_file() or not path.is_file():
        reason = BUILD_ERROR.read_text().splitlines()[0] if BUILD_ERROR.is_file() else "no compiled library"
        raise NativeLibraryUnavailable(f"the compiled kernels were not built ({reason}); {REINSTALL}")
    if BUILT_WITH.is_file():
        built, installed = BUILT_WITH.read_text().strip(), _installed_torch()
        # torch's C++ ABI changes between releases: a library built for another one would not load
        if installed and built != installed:
            raise NativeLibraryUnavailable(
                f"the compiled kernels were built for torch {built}, not {installed}; {REINSTALL}"
            )
    return path


def _installed_torch() -> str | None:
    try:
        return version("torch")
    except PackageNotFoundError:
        return None


# the CPU flags each path's loops need (csrc/isa.cpp checks the same with __builtin_cpu_supports)
ISA_FLAGS = {
    "avx512": {"avx512f", "avx512bw", "avx512vl", "avx512dq", "fma", "f16c"},
    "avx2": {"avx2", "fma", "f16c"},
    "scalar": set(),
}


def expected_isa() -> str:
    """The path the library's loops will take on this CPU (``LLMP_NATIVE_ISA`` may only lower it), from
    /proc/cpuinfo: what ``llmp plugins show`` says without loading the library."""
    try:
        flags = set(Path("/proc/cpuinfo").read_text().partition("flags")[2].partition("\n")[0].split())
    except OSError:
        flags = set()
    names = list(ISA_FLAGS)  # best first
    best = next(name for name in names if ISA_FLAGS[name] <= flags)
    forced = os.environ.get("LLMP_NATIVE_ISA", "")
    if forced in names and names.index(forced) > names.index(best):
        return forced
    return best
