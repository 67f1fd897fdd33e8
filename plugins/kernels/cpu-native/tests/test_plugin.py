"""The plugin's registration: listed ok with its library, broken in one line without it (the engine then
picks the cpu set), and no torch imported to decide."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import llmp_kernels_cpu_native.built as plugin
import pytest

LLMP = [sys.executable, "-m", "llmp"]


def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "COLUMNS": "200", **env}
    environment.pop("LLMP_STRICT_PLUGINS", None)  # strict loading raises at a broken plugin instead of listing it
    return subprocess.run(args, env=environment, capture_output=True, text=True, timeout=120)


SELECTED = "from llmp import registry; print(registry.select_kernels(None, 'cpu').name)"


def test_listed_and_chosen_on_cpu():
    listing = run(*LLMP, "plugins", "list", "--kind", "kernels")
    assert listing.returncode == 0, listing.stderr
    assert "cpu-native" in listing.stdout and "broken" not in listing.stdout
    assert run(sys.executable, "-c", SELECTED).stdout.strip() == "cpu-native"


def test_without_its_library_it_is_broken_in_one_line_and_cpu_is_chosen(tmp_path):
    missing = str(tmp_path / "_C.so")
    listing = run(*LLMP, "plugins", "list", LLMP_NATIVE_LIBRARY=missing)  # a broken plugin has no kind
    assert listing.returncode == 0, listing.stderr
    lines = [line for line in listing.stdout.splitlines() if "kernels-cpu-native" in line]
    assert lines == [
        "broken plugin kernels-cpu-native (llmp-kernels-cpu-native): running llmp_register_kernels: "
        f"NativeLibraryUnavailable: LLMP_NATIVE_LIBRARY={missing} does not exist"
    ]
    assert run(sys.executable, "-c", SELECTED, LLMP_NATIVE_LIBRARY=missing).stdout.strip() == "cpu"


def test_a_library_that_does_not_load_is_reported(tmp_path):
    bad = tmp_path / "_C.so"
    bad.write_text("not a shared library")
    # torch imported first: the registration then loads the library, and its failure is the reason
    code = f"import torch; {SELECTED}"
    result = run(sys.executable, "-c", code, LLMP_NATIVE_LIBRARY=str(bad))
    assert result.stdout.strip() == "cpu"
    assert "do not load" in result.stderr


def test_the_build_error_is_the_reason(monkeypatch, tmp_path):
    (tmp_path / "_build_error.txt").write_text("CompileError: command 'g++' failed\n\ntraceback ...")
    monkeypatch.delenv(plugin.LIBRARY_VARIABLE, raising=False)
    monkeypatch.setattr(plugin, "PACKAGE_DIR", tmp_path)
    monkeypatch.setattr(plugin, "BUILD_ERROR", tmp_path / "_build_error.txt")
    with pytest.raises(plugin.NativeLibraryUnavailable, match=r"not built \(CompileError: command 'g\+\+' failed\)"):
        plugin.check_library()


def test_a_failed_rebuild_is_not_hidden_by_the_library_an_earlier_build_left(monkeypatch, tmp_path):
    (tmp_path / "_C.cpython-311-x86_64-linux-gnu.so").write_bytes(b"")
    (tmp_path / "_build_error.txt").write_text("CompileError: command 'g++' failed\n")
    monkeypatch.delenv(plugin.LIBRARY_VARIABLE, raising=False)
    monkeypatch.setattr(plugin, "PACKAGE_DIR", tmp_path)
    monkeypatch.setattr(plugin, "BUILD_ERROR", tmp_path / "_build_error.txt")
    with pytest.raises(plugin.NativeLibraryUnavailable, match="not built"):
        plugin.check_library()


def test_a_library_built_for_another_torch_is_refused(monkeypatch, tmp_path):
    (tmp_path / "_C.cpython-311-x86_64-linux-gnu.so").write_bytes(b"")
    (tmp_path / "_built_with.txt").write_text("1.0.0\n")
    monkeypatch.delenv(plugin.LIBRARY_VARIABLE, raising=False)
    monkeypatch.setattr(plugin, "PACKAGE_DIR", tmp_path)
    monkeypatch.setattr(plugin, "BUILD_ERROR", tmp_path / "_build_error.txt")
    monkeypatch.setattr(plugin, "BUILT_WITH", tmp_path / "_built_with.txt")
    with pytest.raises(plugin.NativeLibraryUnavailable, match=r"built for torch 1\.0\.0, not "):
        plugin.check_library()


def test_registering_imports_no_torch():
    code = "import sys; from llmp import registry; registry.components('kernels'); print('torch' in sys.modules)"
    assert run(sys.executable, "-c", code).stdout.strip() == "False"


def test_the_package_data_is_beside_the_module():
    assert Path(plugin.__file__).parent == plugin.PACKAGE_DIR


@pytest.mark.parametrize("forced", ["", "avx2", "scalar"])
def test_plugins_show_names_the_path_the_library_takes(forced):
    loaded = "from llmp_kernels_cpu_native.library import load; print(load())"
    isa = run(sys.executable, "-c", loaded, LLMP_NATIVE_ISA=forced)
    assert isa.returncode == 0, isa.stderr
    shown = run(*LLMP, "plugins", "show", "kernels-cpu-native", LLMP_NATIVE_ISA=forced)
    assert f"the {isa.stdout.strip()} path on this CPU" in shown.stdout, shown.stdout


STARTUP = """
import sys
from pathlib import Path
from llmp import LLM
from llmp.testing import save_tiny_llama
save_tiny_llama(Path(sys.argv[1]))
llm = LLM(sys.argv[1], dtype="bfloat16", block_size=4, max_model_len=64)
print("ISA", llm.engine.info.options["isa"])
"""


def _bf16_cpu() -> bool:
    return "avx512_bf16" in Path("/proc/cpuinfo").read_text().split()


@pytest.mark.parametrize("amx", ["", "onednn"])
def test_the_start_up_line_names_the_path_its_bfloat16_layers_take(tmp_path, amx):
    """Not torch's view of the CPU (on an AVX2 CPU oneDNN's bfloat16 matmul is emulated, which this set never
    runs): its loops' ISA and its own matmul path, or the cpu set's float32 copies where oneDNN is chosen."""
    result = run(sys.executable, "-c", STARTUP, str(tmp_path / "tiny"), LLMP_NATIVE_AMX=amx)
    assert result.returncode == 0, result.stderr
    [summary] = [line for line in result.stderr.splitlines() if "engine ready in" in line]
    isa = result.stdout.split("ISA ", 1)[1].strip()
    assert f"dtype bfloat16, kernels cpu-native ({isa})," in summary
    avx512 = "avx512f" in Path("/proc/cpuinfo").read_text().split()
    assert isa.startswith("AVX512 loops, " if avx512 else "AVX2 loops, "), isa
    if amx == "onednn":
        assert isa.endswith(f"bfloat16 matmul {'native' if _bf16_cpu() else 'on float32 copies'} (oneDNN)"), isa
    elif _bf16_cpu():
        assert isa.endswith(("bfloat16 matmul avx512-bf16 pairs", "bfloat16 matmul amx tiles")), isa
    else:
        assert isa.endswith("bfloat16 matmul avx2 pairs"), isa
    report = run(*LLMP, "collect-env", "--json", LLMP_NATIVE_AMX=amx)  # the same words, for the default model's dtype
    assert report.returncode == 0, report.stderr
    assert json.loads(report.stdout)["engine"]["isa_path"] == ("AVX512 loops" if avx512 else "AVX2 loops")
