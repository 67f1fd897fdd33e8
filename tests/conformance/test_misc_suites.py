"""The stat-logger, command and LoRA-resolver suites: the built-in components pass, deliberately
broken ones fail with a precise message.

Broken stat loggers and resolvers are registered in-process; broken commands are installed
(a ``.dist-info`` on the path), since ``--help`` runs in a subprocess.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from llmp import hookimpl, registry
from llmp.api import CommandSpec, LoRAAdapterNotFoundError, LoRAResolverSpec, StatLoggerSpec
from llmp.conformance import CheckResult, misc, verify
from llmp.conformance.runner import Context, _run_check
from llmp.lora import LoRARequest
from llmp.testing import registered


def run_one(suite: Callable[..., Any], kind: str, component: str, check: str) -> CheckResult:
    with tempfile.TemporaryDirectory() as workdir:
        for found in suite(registry.get_component(kind, component), Context(Path(workdir))):
            if found.name == check:
                return _run_check(kind, component, found)
    raise LookupError(check)


def failures(report: Any) -> dict[tuple[str, str], str]:
    return {(r.component, r.check): r.detail for r in report.failed}


def plugin(hook: str, *specs: Any) -> Any:
    """An in-process plugin whose hook ``hook`` yields ``specs``."""
    return type("Plugin", (), {hook: hookimpl(lambda self: list(specs))})()


def test_the_built_in_stat_logger_and_lora_resolver_pass():
    report = verify("llmp-engine", kinds=["stat_logger", "lora_resolver"])
    assert report.passed, failures(report)
    assert {(r.kind, r.component) for r in report.results} == {
        ("stat_logger", "logging"),
        ("lora_resolver", "filesystem"),
    }
    assert [r.check for r in report.results if r.status != "passed"] == []


# -- stat loggers -------------------------------------------------------------------------------------


class FormatsTimeToFirstToken:
    """Fails on a request that never produced a token (no time to first token)."""

    def __init__(self, info: Any) -> None:
        self.lines: list[str] = []

    def record_step(self, stats: Any) -> None:
        pass

    def record_finished(self, stats: Any) -> None:
        self.lines.append(f"{stats.request_id}: first token after {stats.time_to_first_token_seconds:.3f} s")


class Slow(FormatsTimeToFirstToken):
    def record_step(self, stats: Any) -> None:
        time.sleep(0.2)


class AlwaysFails(FormatsTimeToFirstToken):
    def record_step(self, stats: Any) -> None:
        raise RuntimeError("no metrics backend")


def no_logger(info: Any) -> Any:
    return object()


STAT_LOGGERS = plugin(
    "llmp_register_stat_loggers",
    *(
        StatLoggerSpec(name=f"conformance-test-{name}", impl=f"{__name__}:{name}")
        for name in ("FormatsTimeToFirstToken", "Slow", "no_logger")
    ),
)


@pytest.mark.parametrize(
    ("component", "check", "expected"),
    [
        (
            "FormatsTimeToFirstToken",
            "takes the engine's records without raising or blocking",
            "record_finished(record 12 of the engine trace: FinishedRequestStats(request_id='req-embed', "
            "finish_reason='stop', num_prompt_tokens=8, num_generation_tokens=0, num_cached_tokens=0, "
            "queued_seconds=0.001, time_to_first_token_seconds=None, end_to_end_seconds=0.05)) raised TypeError",
        ),
        ("Slow", "takes the engine's records without raising or blocking", "keep a call under 0.05 s"),
        ("no_logger", "builds from its record with the engine's info", "which has no record_step method"),
    ],
)
def test_a_broken_stat_logger_fails_its_check(monkeypatch, component: str, check: str, expected: str):
    monkeypatch.setattr(misc, "MAX_CALL_S", 0.05)
    with registered(STAT_LOGGERS, "broken-stat-loggers"):
        result = run_one(misc.stat_logger_suite, "stat_logger", f"conformance-test-{component}", check)
    assert result.status == "failed" and expected in result.detail, result


def test_a_stat_logger_the_engine_drops_fails_the_engine_run():
    failing = plugin("llmp_register_stat_loggers", StatLoggerSpec(name="failing", impl=f"{__name__}:AlwaysFails"))
    with registered(failing, "failing-stat-logger"):
        report = verify("failing-stat-logger")
    found = failures(report)
    assert (
        "raised RuntimeError: no metrics backend"
        in found[("failing", "takes the engine's records without raising or blocking")]
    )
    dropped = found[("failing", "runs in a real engine without being dropped")]
    assert dropped.startswith(
        "the engine dropped the stat logger 'failing': stat logger 'failing' failed; it is disabled"
    )
    assert dropped.endswith("RuntimeError: no metrics backend")


# -- commands -------------------------------------------------------------------------------------------

COMMANDS_PACKAGE = """
from llmp import hookimpl
from llmp.api import CommandSpec


@hookimpl
def llmp_register_commands():
    yield CommandSpec(name="conformance-fine", impl="llmp_conformance_commands.fine:run")
    yield CommandSpec(name="conformance-heavy", impl="llmp_conformance_commands.heavy:run")
    yield CommandSpec(name="conformance-broken-help", impl="llmp_conformance_commands.broken:run")
"""
COMMAND_MODULES = {
    "fine": (
        "from dataclasses import dataclass\n\nfrom llmp.cli.options import options_command\n"
        "from llmp.options import option\n\n\n@dataclass(frozen=True, kw_only=True)\nclass Options:\n"
        '    conformance_times: int = option(1, "How many times.")\n\n\n@options_command\n'
        'def run(options: Options) -> None:\n    """Print ok."""\n    print("ok" * options.conformance_times)\n'
    ),
    "heavy": 'import llmp_conformance_heavy_fixture  # noqa: F401\n\n\ndef run() -> None:\n    """Heavy."""\n',
    "broken": 'import llmp_conformance_missing_dependency  # noqa: F401\n\n\ndef run() -> None:\n    """Broken."""\n',
}


@pytest.fixture
def installed_commands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clean_plugin_env: None) -> Path:
    """``llmp-conformance-commands`` installed on a directory of the path, as pip leaves it."""
    package = tmp_path / "llmp_conformance_commands"
    package.mkdir()
    (package / "__init__.py").write_text(COMMANDS_PACKAGE)
    for name, source in COMMAND_MODULES.items():
        (package / f"{name}.py").write_text(source)
    (tmp_path / "llmp_conformance_heavy_fixture.py").write_text("")
    info = tmp_path / "llmp_conformance_commands-0.0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: llmp-conformance-commands\nVersion: 0.0.1\n")
    (info / "entry_points.txt").write_text("[llmp]\nconformance-commands = llmp_conformance_commands\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    return tmp_path


def test_an_installed_command_runs_help_in_a_subprocess(installed_commands: Path):
    report = verify("conformance-commands", heavy_modules=("llmp_conformance_heavy_fixture",))
    by_component = {}
    for result in report.results:
        by_component.setdefault(result.component, {})[result.check] = result
    help_check = "`llmp NAME --help` exits 0 in a subprocess and imports nothing heavy"
    assert [r.status for r in by_component["conformance-fine"].values()] == ["passed"] * 3, by_component[
        "conformance-fine"
    ]
    heavy = by_component["conformance-heavy"][help_check]
    assert heavy.status == "failed" and heavy.detail.startswith(
        "`llmp conformance-heavy --help` imported llmp_conformance_heavy_fixture: `llmp --help` imports every "
        "command's module, so keep the top level of llmp_conformance_commands.heavy light"
    )
    broken = by_component["conformance-broken-help"][help_check]
    assert broken.status == "failed" and broken.detail.startswith(
        "`llmp conformance-broken-help --help` printed no help of 'conformance-broken-help':"
    )
    assert "No module named 'llmp_conformance_missing_dependency'" in broken.detail


def greet() -> None:
    """Greet."""


def test_a_command_name_that_is_no_command_line_word_fails():
    bad = plugin("llmp_register_commands", CommandSpec(name="Greet Me", impl=f"{__name__}:greet"))
    with registered(bad, "badly-named-command"):
        report = verify("badly-named-command")
    found = failures(report)
    assert found == {
        ("Greet Me", "its name is a command-line word"): (
            "command name 'Greet Me' is not a command-line word: lowercase letters and digits, words joined by '-'"
        )
    }
    assert [r.status for r in report.results if r.check.startswith("`llmp NAME")] == ["skipped"]


def test_a_name_two_plugins_register_fails_registered_once(monkeypatch):
    monkeypatch.delenv("LLMP_STRICT_PLUGINS", raising=False)  # strict loading raises at the clash instead
    twice = CommandSpec(name="conformance-twice", impl=f"{__name__}:greet")
    with registered(plugin("llmp_register_commands", twice), "twice-a"):
        with registered(plugin("llmp_register_commands", twice), "twice-b"):
            report = verify("twice-a")
    assert not report.passed and not report.error
    assert [(r.component, r.check) for r in report.failed] == [("conformance-twice", "its name is registered once")]
    assert "is registered by both" in report.failed[0].detail


def test_a_registration_hook_that_fails_is_the_reason_verify_gives(monkeypatch):
    monkeypatch.delenv("LLMP_STRICT_PLUGINS", raising=False)  # strict loading raises at the hook instead

    class Raising:
        @hookimpl
        def llmp_register_commands(self):
            raise RuntimeError("registry down")

    with registered(Raising(), "raising-registration"):
        report = verify("raising-registration")
    assert report.error == "the plugin is broken: running llmp_register_commands: RuntimeError: registry down"


def test_a_distribution_of_the_name_without_an_llmp_entry_point_is_named():
    assert "the distribution pytest is installed but declares no entry point" in verify("pytest").error
    assert verify("no-such-plugin").error.endswith(")")  # nothing of that name: the plugins installed


def test_the_printed_report_keeps_a_long_details_last_lines(capsys):
    from llmp.conformance import Report
    from llmp.conformance.report import print_report

    detail = "\n".join([*(f"  log line {i}" for i in range(40)), "RuntimeError: front-end cannot start"])
    report = Report("p", "dist", "1", "0.5")
    report.results.append(CheckResult("frontend", "f", "starts and answers /health", "failed", detail, 1.0))
    print_report(report)
    printed = capsys.readouterr().out
    assert "RuntimeError: front-end cannot start" in printed and "log line 0" in printed
    assert "(21 lines left out: --json has them all)" in printed and "log line 20" not in printed


# -- LoRA resolvers -------------------------------------------------------------------------------------


class ResolvesAnything:
    def __init__(self, options: Any) -> None:
        pass

    async def resolve_lora(self, base_model_name: str, lora_name: str) -> Any:
        return LoRARequest(lora_name or "unnamed", 1, f"/adapters/{lora_name}")


class RaisesOnOddNames(ResolvesAnything):
    async def resolve_lora(self, base_model_name: str, lora_name: str) -> Any:
        if "/" in lora_name:
            raise ValueError(f"bad adapter name {lora_name!r}")
        return None


class SaysNotFound(ResolvesAnything):
    async def resolve_lora(self, base_model_name: str, lora_name: str) -> Any:
        raise LoRAAdapterNotFoundError(lora_name)


class Blocking(ResolvesAnything):
    async def resolve_lora(self, base_model_name: str, lora_name: str) -> Any:
        time.sleep(0.3)  # a blocking read on the event loop
        return None


class NotAsync(ResolvesAnything):
    def resolve_lora(self, base_model_name: str, lora_name: str) -> Any:  # type: ignore[override]
        return None


RESOLVERS = plugin(
    "llmp_register_lora_resolvers",
    *(
        LoRAResolverSpec(name=f"conformance-test-{name}", impl=f"{__name__}:{name}")
        for name in ("ResolvesAnything", "RaisesOnOddNames", "SaysNotFound", "Blocking", "NotAsync")
    ),
)


@pytest.fixture
def resolvers(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(misc, "MAX_LOOP_STALL_S", 0.15)
    with registered(RESOLVERS, "test-resolvers"):
        yield


@pytest.mark.parametrize(
    ("component", "check", "expected"),
    [
        (
            "ResolvesAnything",
            "an unknown adapter name resolves to None",
            "resolve_lora('llmp-conformance/tiny-base', 'no-such-adapter-",
        ),
        (
            "RaisesOnOddNames",
            "an unknown adapter name resolves to None",
            "resolve_lora('llmp-conformance/tiny-base', '../outside') (built with default options) raised ValueError",
        ),
        ("Blocking", "resolving does not stall the server's event loop", "resolve_lora held the event loop for 0.3"),
        ("NotAsync", "builds with the default FrontendOptions", "resolve_lora is not a coroutine function"),
    ],
)
@pytest.mark.usefixtures("resolvers")
def test_a_broken_lora_resolver_fails_its_check(component: str, check: str, expected: str):
    result = run_one(misc.lora_resolver_suite, "lora_resolver", f"conformance-test-{component}", check)
    assert result.status == "failed" and expected in result.detail, result


@pytest.mark.usefixtures("resolvers")
def test_a_resolver_may_raise_the_documented_error_for_an_unknown_name():
    check = "an unknown adapter name resolves to None"
    assert run_one(misc.lora_resolver_suite, "lora_resolver", "conformance-test-SaysNotFound", check).status == "passed"
