"""What every ``llmp bench`` command shares: its report options, printing and saving the report, percentiles.

Its own module so that ``bench_cmd`` (the group and ``bench serve``) and ``bench_offline``
(``throughput`` and ``latency``) both import it, and not each other.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer

from llmp.options import option


@dataclass(frozen=True, kw_only=True)
class ReportOptions:
    json_output: bool = option(False, "Print the result as JSON, not a table.", flag="--json/--no-json")
    save_result: Path | None = option(None, "Also write the result as JSON to this file.")


def emit_report(report: dict[str, Any], options: ReportOptions, print_table: Any) -> None:
    """Print a benchmark's report as JSON or as its table; also save it when asked."""
    if options.json_output:
        typer.echo(json.dumps(report, indent=2))
    else:
        print_table(report)
    if options.save_result is not None:
        save_report(report, options.save_result)


def save_report(report: dict[str, Any], path: Path) -> None:
    try:
        path.write_text(json.dumps(report, indent=2) + "\n")
    except OSError as exc:  # after the report is printed, so a long run is not lost to a typo in the path
        print(f"llmp: error: cannot write {path}: {exc.strerror or exc}", file=sys.stderr)
        raise typer.Exit(1) from None


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile with linear interpolation between ranks (numpy's default)."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
