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
