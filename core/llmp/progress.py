"""What long work tells the user: INFO lines for each phase, progress bars, and one summary.

The conventions of vLLM and transformers: every message goes to stderr through the ``llmp``
logger, so ``LLMP_LOG_LEVEL=warning`` (or ``logging.getLogger("llmp").setLevel(logging.WARNING)``)
quiets all of it. Bars are drawn only while INFO is on and stderr is a terminal;
``LLMP_PROGRESS=1`` asks for them anyway (a log file that keeps escape codes), ``LLMP_PROGRESS=0``
never draws them. Without a bar the phase lines still say what is happening.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

log = logging.getLogger("llmp.engine")
LOG_FORMAT = "%(levelname)s %(name)s: %(message)s"  # the format of ``llmp serve``'s own lines
LEVELS = ("debug", "info", "warning", "error", "critical")


def configure_logging() -> None:
    """Send the ``llmp`` loggers' lines to stderr, as vLLM does for its own, unless the program
    configured logging itself (a handler on the root or ``llmp`` logger): then its levels rule.

    The level: the ``llmp`` logger's own if the program set one, else ``LLMP_LOG_LEVEL`` (debug,
    info, warning, error; an engine process gets its parent's level there), else info.
    """
    logger = logging.getLogger("llmp")
    if logger.handlers or logging.getLogger().handlers:
        return
    if logger.level == logging.NOTSET:
        name = os.environ.get("LLMP_LOG_LEVEL", "info")
        if name.lower() not in LEVELS:
            raise ValueError(f"LLMP_LOG_LEVEL must be debug, info, warning or error, got {name!r}")
        logger.setLevel(name.upper())
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    logger.addHandler(handler)


def bars_enabled(follow_log_level: bool = True) -> bool:
    """Whether to draw progress bars: INFO is on (unless not ``follow_log_level``: a command's own
    bar), and stderr is a terminal or ``LLMP_PROGRESS=1``."""
    asked = os.environ.get("LLMP_PROGRESS", "").strip().lower()
    if asked in ("0", "false", "no", "off") or (follow_log_level and not log.isEnabledFor(logging.INFO)):
        return False
    return asked in ("1", "true", "yes", "on") or sys.stderr.isatty()


class Bar:
    """A progress bar's handle: :meth:`advance` it, :meth:`describe` the current step. A no-op
    when no bar is drawn."""

    def __init__(self, progress: Any = None, task: Any = None) -> None:
        self.progress = progress
        self.task = task

    def advance(self, amount: float = 1) -> None:
        if self.progress is not None:
            self.progress.advance(self.task, amount)

    def describe(self, description: str) -> None:
        if self.progress is not None:
            self.progress.update(self.task, description=description)


@contextmanager
def progress_bar(description: str, total: float, unit: str = "", *, follow_log_level: bool = True) -> Iterator[Bar]:
    """A bar on stderr while the block runs, when :func:`bars_enabled` (``follow_log_level=False``: a
    command's own progress, drawn at any log level). Log nothing inside the block: a line written
    under a drawn bar garbles it."""
    if not bars_enabled(follow_log_level):
        yield Bar()
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns: list[Any] = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn()]
    if unit:
        columns.append(TextColumn(unit))
    columns.append(TimeElapsedColumn())
    console = Console(stderr=True, force_terminal=True) if not sys.stderr.isatty() else Console(stderr=True)
    with Progress(*columns, console=console) as progress:
        yield Bar(progress, progress.add_task(description, total=total))


def human_bytes(count: float) -> str:
    """``512 KiB``, ``257 MiB``, ``1.5 GiB``."""
    for unit in ("B", "KiB", "MiB"):
        if count < 1 << 10:
            return f"{count:.0f} {unit}"
        count /= 1 << 10
    return f"{count:.1f} GiB"


def isa_path(device: str, dtype: str) -> str:
    """The instruction path torch's kernels take here: ATen's vector ISA, AMX, and whether oneDNN
    multiplies ``dtype`` matrices natively (else they are emulated, much slower); a GPU's name and
    compute capability. What the ``torch`` set runs on (a set may describe its own path:
    :func:`kernels_isa_path`); empty if torch cannot say."""
    import torch

    try:
        if device.startswith("cuda"):
            major, minor = torch.cuda.get_device_capability(device)
            return f"{torch.cuda.get_device_name(device)}, sm_{major}{minor}"
        if device != "cpu":
            return ""
        parts = [torch.backends.cpu.get_cpu_capability()]  # AVX512, AVX2, ... : ATen's vectorized code
        if torch.cpu._is_amx_tile_supported():
            parts.append("AMX")
        native = {
            "bfloat16": torch.ops.mkldnn._is_mkldnn_bf16_supported,
            "float16": torch.ops.mkldnn._is_mkldnn_fp16_supported,
        }.get(dtype)
        if native is not None:
            parts.append(f"{dtype} matmul {'native' if native() else 'emulated'}")
        return ", ".join(parts)
    except (AttributeError, RuntimeError):  # private probes of another torch version
        return ""


def kernels_isa_path(kernels: Any, device: str, dtype: str) -> str:
    """The instruction path a kernel set takes: its own ``isa_path(device, dtype)`` where it has one (a compiled
    set that multiplies with its own loops), else torch's (:func:`isa_path`)."""
    own = getattr(kernels, "isa_path", None)
    return own(device, dtype) if callable(own) else isa_path(device, dtype)


def engine_summary(info: Mapping[str, Any]) -> str:
    """One line of what an engine serves and how: model (and its quantisation), dtype, kernel set and ISA path, context,
    KV cache. ``info`` is ``EngineInfo.options`` with ``model`` and ``kernels`` (``AsyncLLM.info``)."""
    kernels = info["kernels"] + (f" ({info['isa']})" if info.get("isa") else "")
    blocks, block_size = info["num_kv_blocks"], info["block_size"]
    cache_dtype = info.get("kv_cache_dtype", info["dtype"])
    return (
        f"model {info['model']}{f' ({quantization})' if (quantization := info.get('quantization')) else ''}, "
        f"dtype {info['dtype']}, kernels {kernels}, "
        f"max model len {info['max_model_len']}, "
        f"KV cache {blocks} blocks × {block_size} = {blocks * block_size} tokens"
        + (f" in {cache_dtype}" if cache_dtype != info["dtype"] else "")
    )
