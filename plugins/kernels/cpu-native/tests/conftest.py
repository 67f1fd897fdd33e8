"""Helpers shared by the kernel tests: a thread count for one test, and a check run on one instruction set."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from llmp_kernels_cpu_native.library import load

ISAS = ("scalar", "avx2", "avx512")


@pytest.fixture
def set_threads():
    """``torch.set_num_threads`` for this test; the count it had is restored after it."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


@pytest.fixture
def run_on_isa():
    """``run(isa, code, *args)``: ``python -c code isa *args`` with ``LLMP_NATIVE_ISA=isa`` in a fresh process (the
    library picks its loops once, at load), which must print ``ok``; skipped where the CPU lacks that level."""

    def run(isa: str, code: str, *args: str) -> None:
        best = load()
        if ISAS.index(isa) > ISAS.index(best):
            pytest.skip(f"this CPU runs {best} at best")
        env = {**os.environ, "LLMP_NATIVE_ISA": isa}
        result = subprocess.run(
            [sys.executable, "-c", code, isa, *args], env=env, capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]

    return run
