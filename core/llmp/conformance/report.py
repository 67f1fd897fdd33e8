"""What ``verify`` found: one result per check, printed as a table or written as JSON."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Status = Literal["passed", "failed", "skipped"]


@dataclass(frozen=True)
class CheckResult:
    """One check of one component: ``detail`` says how it failed or why it was skipped."""

    kind: str
    component: str
    check: str
    status: Status
    detail: str = ""
    seconds: float = 0.0


@dataclass
class Report:
    """Every check run for one plugin. ``passed`` holds when no check failed and at least one ran."""

    plugin: str
    distribution: str
    version: str
    api_version: str
    results: list[CheckResult] = field(default_factory=list)
    error: str = ""  # the plugin could not be verified at all (not installed, broken, no components)

    @property
    def failed(self) -> list[CheckResult]:
        return [r for r in self.results if r.status == "failed"]

    @property
    def passed(self) -> bool:
        return not self.error and not self.failed and any(r.status == "passed" for r in self.results)

    def to_json(self) -> dict[str, Any]:
        return {
            "plugin": self.plugin,
            "distribution": self.distribution,
            "version": self.version,
            "api_version": self.api_version,
            "passed": self.passed,
            "error": self.error,
            "results": [asdict(r) for r in self.results],
        }

    def summary(self) -> str:
        counts = {s: sum(r.status == s for r in self.results) for s in ("passed", "failed", "skipped")}
        if self.error:
            return f"{self.plugin}: not verified: {self.error}"
        verdict = "conforms" if self.passed else "does NOT conform"
        return (
            f"{self.plugin} ({self.distribution} {self.version}, plugin API {self.api_version}) {verdict}: "
            f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped"
        )


def print_report(report: Report) -> None:
    """The report as ``llmp plugins verify`` prints it: one line per check, failures with their detail."""
    from rich.console import Console
    from rich.text import Text

    console = Console(highlight=False, soft_wrap=True)
    marks = {"passed": ("PASS", "green"), "failed": ("FAIL", "red"), "skipped": ("SKIP", "yellow")}
    current = None
    for result in report.results:
        if (result.kind, result.component) != current:
            current = (result.kind, result.component)
            console.print(Text(f"{result.kind} {result.component}", style="bold"))
        mark, style = marks[result.status]
        line = Text("  ") + Text(mark, style=style) + Text(f"  {result.check}  ({result.seconds:.1f} s)")
        console.print(line)
        if result.detail and result.status != "passed":
            for detail_line in _shortened(result.detail.splitlines()):
                console.print(Text("        " + detail_line))
    console.print(Text(report.summary(), style="green" if report.passed else "red"))


def _shortened(lines: list[str], head: int = 8, tail: int = 12) -> list[str]:
    """A long detail's first and last lines: a traceback's exception and a log's last words are at its end."""
    if len(lines) <= head + tail + 1:
        return lines
    return [*lines[:head], f"... ({len(lines) - head - tail} lines left out: --json has them all)", *lines[-tail:]]
