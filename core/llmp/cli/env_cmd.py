"""``llmp collect-env``: what to paste into a bug report."""

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

LIBRARIES = ("torch", "transformers", "triton", "tokenizers", "safetensors", "numpy", "pluggy", "stevedore")


@dataclass(frozen=True, kw_only=True)
class CollectEnvOptions:
    json_output: bool = option(False, "Print JSON.", flag="--json/--no-json")


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


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
    simd = sorted(f for f in flags if f.startswith(("avx512", "avx2", "amx")))
    return {"model": model, "logical_cores": os.cpu_count(), "usable_cores": len(os.sched_getaffinity(0)), "simd": simd}


def _memory_gib() -> float | None:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        return None


def _gpus() -> dict[str, Any]:
    if _version("torch") is None:
        return {"available": False, "reason": "torch is not installed"}
    try:
        import torch
    except Exception as exc:  # a broken torch install is worth reporting, not crashing on
        return {"available": False, "reason": f"import torch failed: {exc}"}
    if not torch.cuda.is_available():
        return {"available": False, "torch_cuda": torch.version.cuda}
    devices = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return {"available": True, "torch_cuda": torch.version.cuda, "devices": devices}


def environment_report() -> dict[str, Any]:
    return {
        "llmp": __version__,
        "plugin_api": API_VERSION,
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "platform": platform.platform(),
        "cpu": _cpu(),
        "memory_gib": _memory_gib(),
        "gpu": _gpus(),
        "libraries": {name: _version(name) for name in LIBRARIES},
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(("LLMP_", "CUDA_VISIBLE", "OMP_"))},
        "plugins": [
            {"name": r.name, "distribution": r.distribution, "version": r.version, "status": r.status}
            for r in plugins.plugin_records()
        ],
    }


@options_command
def collect_env(settings: CollectEnvOptions) -> None:
    """Report llmp, Python and library versions, CPU/GPU, memory and installed plugins."""
    report = environment_report()
    if settings.json_output:
        typer.echo(json.dumps(report, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="llmp environment", show_header=False)
    table.add_column("item", style="bold")
    table.add_column("value")
    for key, value in report.items():
        if key == "plugins":
            value = ", ".join(f"{p['name']} ({p['distribution']} {p['version']}, {p['status']})" for p in value)
        elif isinstance(value, dict):
            value = ", ".join(f"{k}={v}" for k, v in value.items())
        table.add_row(key, str(value))
    Console().print(table)
