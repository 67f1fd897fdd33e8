"""``llmp collect-env``: what to paste into a bug report.

Plain text by default: ``### section`` headings over ``- key: value`` items, which read
as plain lines in a terminal and as small headings over lists when pasted into a Markdown
issue. ``--json`` gives the same report as one object. Secrets (``LLMP_API_KEY``) are not shown.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer

from llmp import __version__, plugins
from llmp.api import API_VERSION
from llmp.cli.options import options_command
from llmp.options import option

REPORTED_VARIABLES = ("LLMP_", "CUDA_VISIBLE", "OMP_")
SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD")  # a bug report is public: LLMP_API_KEY's value stays out
LIBRARIES = ("torch", "transformers", "triton", "tokenizers", "safetensors", "numpy", "pluggy", "stevedore")
# the /proc/cpuinfo flags that decide which matmul and attention paths a CPU can take
CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_fp16")


@dataclass(frozen=True, kw_only=True)
class CollectEnvOptions:
    json_output: bool = option(False, "Print JSON.", flag="--json/--no-json")


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _torch() -> Any:
    """torch, or None when it is missing or broken (a broken install is reported, not crashed on)."""
    if _version("torch") is None:
        return None
    try:
        import torch
    except Exception:
        return None
    return torch


def _cpu() -> dict[str, Any]:
    model = platform.processor() or platform.machine()
    flags: list[str] = []
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and model in ("", platform.machine()):
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = line.split(":", 1)[1].split()
    except OSError:
        pass
    return {
        "model": model,
        "logical_cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "flags": [flag for flag in CPU_FLAGS if flag in flags],
    }


def _memory_gib() -> float | None:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        return None


def _torch_build(torch: Any) -> dict[str, Any]:
    if torch is None:
        return {"version": _version("torch"), "error": "torch is not installed or does not import"}
    if torch.version.cuda:
        build = f"cuda {torch.version.cuda}"
    elif getattr(torch.version, "hip", None):
        build = f"rocm {torch.version.hip}"
    else:
        build = "cpu"
    return {
        "version": torch.__version__,
        "build": build,
        "debug": bool(torch.version.debug),
        "threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "mkldnn": torch.backends.mkldnn.is_available(),
        "onednn_bf16": bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()),
        "onednn_fp16": bool(torch.ops.mkldnn._is_mkldnn_fp16_supported()),
    }


def _gpus(torch: Any) -> dict[str, Any]:
    if torch is None:
        return {"available": False, "reason": "no usable torch"}
    if not torch.cuda.is_available():
        reason = "torch is a CPU build" if not torch.version.cuda else "no CUDA device visible"
        return {"available": False, "reason": reason}
    devices = [
        f"{torch.cuda.get_device_name(i)} (sm_{''.join(map(str, torch.cuda.get_device_capability(i)))})"
        for i in range(torch.cuda.device_count())
    ]
    return {"available": True, "devices": devices}


def _engine() -> dict[str, Any]:
    """What ``llmp serve`` / ``LLM()`` would choose with no options: the default model's dtype, the
    kernel set for the default device and the instruction-set path it takes. A failing part is
    reported as an ``*_error`` entry: the rest of the report still helps."""
    from llmp import registry
    from llmp.options import DEFAULT_MODEL, EngineConfig

    try:
        config = EngineConfig()
    except Exception as exc:
        return {"model": DEFAULT_MODEL, "error": f"{type(exc).__name__}: {exc}"}
    report: dict[str, Any] = {"model": DEFAULT_MODEL}
    try:
        from llmp.model_files.resolve import resolve_model

        report["dtype"] = resolve_model(config).dtype
    except Exception as exc:  # the default model is not installed, say
        report["dtype"] = None
        report["dtype_error"] = f"{type(exc).__name__}: {exc}"
    from llmp.engine.device import resolve_device
    from llmp.progress import isa_path, kernels_isa_path

    try:  # what --device auto picks here, as the engine resolves it
        device = resolve_device(config.device, report["dtype"] or "float32")
    except Exception as exc:
        device = "cpu"
        report["device_error"] = f"{type(exc).__name__}: {exc}"
    report["device"] = device
    try:
        spec = registry.select_kernels(config.kernels, device.partition(":")[0])
        report["kernels"] = spec.name
        report["kernels_plugin"] = spec.plugin
        # as the engine's start-up line says it: the set's own account of its path, else torch's
        report["isa_path"] = kernels_isa_path(spec.load()(), device, report.get("dtype") or "")
    except Exception as exc:
        report["kernels"] = report.get("kernels")
        report["kernels_error"] = f"{type(exc).__name__}: {exc}"
        report["isa_path"] = isa_path(device, report.get("dtype") or "")
    return report


def environment_report() -> dict[str, Any]:
    torch = _torch()
    cpu = _cpu()
    build = _torch_build(torch)
    return {
        "llmp": __version__,
        "plugin_api": API_VERSION,
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "platform": platform.platform(),
        "torch": build,
        "cpu": cpu,
        "memory_gib": _memory_gib(),
        "gpu": _gpus(torch),
        "engine": _engine(),
        "libraries": {name: _version(name) for name in LIBRARIES},
        "env": {k: _shareable(k, v) for k, v in sorted(os.environ.items()) if k.startswith(REPORTED_VARIABLES)},
        "plugins": [
            {"name": r.name, "distribution": r.distribution, "version": r.version, "status": r.status}
            for r in plugins.plugin_records()
        ],
    }


def format_report(report: dict[str, Any]) -> str:
    """The report as ``### section`` headings over ``- key: value`` items: a list under small
    headings when pasted into a Markdown issue, and plain lines in a terminal (no tables, no colour)."""
    lines: list[str] = []

    def section(title: str, values: dict[str, Any]) -> None:
        lines.append(f"### {title}")
        lines.extend(f"- {key}: {_plain(value)}" for key, value in values.items())
        lines.append("")

    section("llmp", {k: report[k] for k in ("llmp", "plugin_api", "python", "executable", "platform")})
    section("default engine", report["engine"])
    section("torch", report["torch"])
    section("cpu", {**report["cpu"], "memory_gib": report["memory_gib"]})
    section("gpu", report["gpu"])
    section("libraries", {k: v or "not installed" for k, v in report["libraries"].items()})
    section("environment (`LLMP_*`, `CUDA_VISIBLE*`, `OMP_*`)", report["env"] or {"variables": "none set"})
    plugins_by_name = sorted(report["plugins"], key=lambda p: p["name"])
    section("plugins", {p["name"]: f"{p['status']} ({p['distribution']} {p['version']})" for p in plugins_by_name})
    return "\n".join(lines).rstrip() + "\n"


def _shareable(name: str, value: str) -> str:
    return "(set, not shown)" if any(word in name.upper() for word in SECRET_WORDS) else value


def _plain(value: Any) -> str:
    if isinstance(value, list | tuple):
        return " ".join(map(str, value)) or "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return "-" if value is None else str(value)


@options_command
def collect_env(settings: CollectEnvOptions) -> None:
    """Report llmp, Python, torch and library versions, CPU/GPU, memory, what the default engine would
    choose (kernel set, ISA path, dtype) and the installed plugins, as plain text for bug reports."""
    report = environment_report()
    if settings.json_output:
        typer.echo(json.dumps(report, indent=2))
        return
    typer.echo(format_report(report), nl=False)
