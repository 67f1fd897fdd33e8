"""``import llmp`` changes no process-wide setting; the engine's thread settings apply where it starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys

PRINT_ENV = "import json, os, sys; print(json.dumps(dict(os.environ)))"


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLMP_", "GOMP_"))}
    return {**env, **extra}


def run(code: str, **extra: str) -> dict[str, str]:
    result = subprocess.run(
        [sys.executable, "-c", code], env=child_env(**extra), capture_output=True, text=True, check=True
    )
    return json.loads(result.stdout)


def test_import_llmp_leaves_the_environment_unchanged():
    before = run(PRINT_ENV)
    after = run(f"import llmp, llmp.api, llmp.llm, llmp.async_llm; {PRINT_ENV}")
    assert after == before


def test_an_engine_process_spins_openmp_unless_opted_out():
    code = f"from llmp.engine.process_settings import apply_engine_process_settings as a; a(); {PRINT_ENV}"
    assert run(code)["GOMP_SPINCOUNT"] == "10000000"
    assert "GOMP_SPINCOUNT" not in run(code, LLMP_OMP_SPIN="0")
    assert run(code, GOMP_SPINCOUNT="5")["GOMP_SPINCOUNT"] == "5"  # a user's own value wins


RELEASE = """
import ctypes, json
from llmp.engine.process_settings import release_freed_memory
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.mallopt(-1, 512 << 20)  # M_TRIM_THRESHOLD as the cpu kernel set sets it: glibc keeps what is freed
libc.mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD: blocks of 64 KiB come from the heap
blocks = [libc.malloc(64 << 10) for _ in range(800)]  # 50 MiB
for b in blocks:
    ctypes.memset(b, 1, 64 << 10)
for b in blocks:
    libc.free(b)
print(json.dumps([release_freed_memory(), release_freed_memory()]))
"""


def test_memory_freed_while_loading_goes_back_to_the_os():
    result = subprocess.run(
        [sys.executable, "-c", RELEASE], env=child_env(), capture_output=True, text=True, check=True, timeout=60
    )
    first, second = json.loads(result.stdout)
    assert first >= 40 << 20  # the 50 MiB the heap kept
    assert second < 1 << 20  # nothing left to give
