"""Builds the compiled part, ``llmp_kernels_cpu_native/_C*.so``, from ``csrc/*.cpp`` (metadata: pyproject.toml).

The extension is optional: when it cannot be built (no compiler, no torch headers, a flag this compiler
refuses) the install still succeeds with the Python package alone, and the reason is written to
``llmp_kernels_cpu_native/_build_error.txt``, which the plugin reports in ``llmp plugins list``.
"""

from __future__ import annotations

import re
import sys
import tempfile
import traceback
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).parent
PACKAGE = "llmp_kernels_cpu_native"
# relative to the package's root in the source tree or the build directory
BUILD_ERROR = Path(PACKAGE) / "_build_error.txt"  # why the library was not built
BUILT_WITH = Path(PACKAGE) / "_built_with.txt"  # the torch version it was built against (its C++ ABI)

# -O3 and no -march: the wheel runs on any x86-64, each hot loop picks its instruction set at load (csrc/isa.cpp);
# -g0 over Python's own -g: no debug information (a tenth of the size).
# No contraction of a * b + c into FMA where the source does not ask for one: the same bits from every compiler.
COMPILE_ARGS = ["-O3", "-g0", "-std=c++20", "-ffp-contract=off", "-fvisibility=hidden", "-Wall"]


def torch_build_ext() -> tuple[type, str | None]:
    """torch's BuildExtension (it adds the C++ ABI flag torch was built with), or setuptools' own and the reason
    torch cannot build (it is imported here, not at the top: reading the metadata must not need it)."""
    try:
        from torch.utils.cpp_extension import BuildExtension
    except Exception as error:
        return build_ext, f"torch cannot be imported to build against: {type(error).__name__}: {error}"
    return BuildExtension.with_options(no_python_abi_suffix=False), None


TorchBuildExt, TORCH_MISSING = torch_build_ext()


class OptionalBuildExt(TorchBuildExt):
    """Builds the extension; on any failure, records why and leaves the pure-Python package."""

    built = False

    def build_extensions(self) -> None:
        try:
            if TORCH_MISSING:
                raise RuntimeError(TORCH_MISSING)
            from torch.utils.cpp_extension import include_paths, library_paths

            openmp = self._openmp_flags(include_paths())
            for extension in self.extensions:
                extension.include_dirs += include_paths()
                extension.library_dirs += library_paths()
                extension.libraries += ["c10", "torch", "torch_cpu"]
                extension.extra_compile_args += openmp  # compiled, not linked: see _openmp_flags
            super().build_extensions()
        except Exception as error:  # a compiler's failure, a refused flag: the pure-Python package still installs
            self._record(f"{type(error).__name__}: {error}".strip(), traceback.format_exc())
        else:
            import torch

            self.built = True
            self._record(None, None, torch.__version__)

    def _openmp_flags(self, torch_include_dirs: list[str]) -> list[str]:
        """``-fopenmp`` to compile with, when torch's ATen runs its threads with OpenMP (torch's Linux wheels) and
        this compiler has OpenMP: at::parallel_for is then an OpenMP region inlined into the library, which runs
        on torch's threads only when compiled with the flag. Not linked with it: the library names no OpenMP
        runtime, and its few OpenMP calls (GOMP_parallel, omp_get_thread_num, ...) bind when it loads to the
        runtime libtorch_cpu already loaded (the copy in torch's wheel, whatever its file name): one runtime, one
        team of threads, never the system's libgomp beside torch's. Otherwise no flag: each call runs on the
        calling thread."""
        configs = [Path(d) / "ATen" / "Config.h" for d in torch_include_dirs]
        config = next((path.read_text() for path in configs if path.is_file()), "")
        if not re.search(r"#define\s+AT_PARALLEL_OPENMP\s+1\b", config):
            return []
        with tempfile.TemporaryDirectory() as tmp:
            source = Path(tmp) / "openmp.cpp"
            source.write_text("#include <omp.h>\nint threads() { return omp_get_max_threads(); }\n")
            try:
                self.compiler.compile([str(source)], output_dir=tmp, extra_postargs=["-fPIC", "-fopenmp"])
            except Exception as error:  # CompileError: e.g. a clang without OpenMP's headers
                print(f"warning: {PACKAGE}: built without threads, -fopenmp fails here: {error}", file=sys.stderr)
                return []
        return ["-fopenmp"]

    def _record(self, reason: str | None, details: str | None, torch_version: str | None = None) -> None:
        """Beside the package being installed: the build error file, or (after a successful build) the torch
        version built against. The plugin reads them at registration, without importing torch."""
        # an in-place or editable build puts the library in the source tree, so the record goes there too
        in_source = self.inplace or getattr(self, "editable_mode", False)
        roots = {Path(self.build_lib), HERE} if in_source else {Path(self.build_lib)}
        for root in roots:
            (root / PACKAGE).mkdir(parents=True, exist_ok=True)
            error = reason and f"{reason}\n\n{details}"
            for path, text in ((root / BUILD_ERROR, error), (root / BUILT_WITH, torch_version)):
                if text:
                    path.write_text(f"{text}\n")
                else:
                    path.unlink(missing_ok=True)
        if reason is not None:
            print(f"warning: {PACKAGE}: the compiled kernels were not built: {reason}", file=sys.stderr)

    # A failed build leaves no library: nothing to copy into the source tree (in place, editable), nothing to
    # install but the record files.

    def copy_extensions_to_source(self) -> None:
        if self.built:
            super().copy_extensions_to_source()

    def get_outputs(self) -> list[str]:
        built = [path for path in super().get_outputs() if Path(path).exists()]
        records = [str(Path(self.build_lib) / name) for name in (BUILD_ERROR, BUILT_WITH)]
        return built + [path for path in records if Path(path).exists()]

    def get_output_mapping(self) -> dict[str, str]:
        return {out: src for out, src in super().get_output_mapping().items() if Path(src).exists()}


def extensions() -> list:
    from setuptools import Extension

    sources = sorted(str(p.relative_to(HERE)) for p in (HERE / "csrc").glob("*.cpp"))
    # Extension, not torch's CppExtension: that needs torch, which may be missing when only the metadata or the
    # sdist is made; torch's include and library paths are added when it builds (OptionalBuildExt)
    return [
        Extension(
            f"{PACKAGE}._C",
            sources=sources,
            include_dirs=["csrc"],
            extra_compile_args=COMPILE_ARGS,
            language="c++",
        )
    ]


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
