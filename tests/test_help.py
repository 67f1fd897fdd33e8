"""``--help`` of every command, as a user's terminal shows it: flag names whole at 80 and 120
columns, no type noise, lines within the width, and ``llmp serve``'s options in their panels.

The commands are discovered from the CLI itself (plugin commands included); each help is the
real ``python -m llmp ... --help`` in a subprocess with ``COLUMNS`` set.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest
import typer

from llmp import plugins
from llmp.cli import app
from llmp.options import PANELS, EngineConfig, FrontendOptions, ServerOptions
from llmp.testing import run_llmp

WIDTHS = (80, 120)
# a type in angle brackets anywhere, or a type's name as an option's value
TYPE_NOISE = re.compile(r"<(str|int|float|bool|file|path|text)>|(--|-)[\w\[\]-]+ (TEXT|INTEGER|FLOAT|BOOLEAN)\b")
SERVE_PANELS = (
    "Model",
    "Engine",
    "Parallelism",
    "Server",
    "Security and limits",
    "Tools and reasoning",
    "LoRA adapters",
    "Front-ends",
    "Operations",
)


def all_commands() -> dict[str, Any]:
    """Every command and sub-command of ``llmp``, by its path (``"bench serve"``; ``""``: llmp itself)."""
    plugins.load_plugins()
    root = typer.main.get_command(app)
    found = {}

    def walk(path: str, command: Any) -> None:
        found[path] = command
        if hasattr(command, "list_commands"):
            ctx = typer.Context(command)
            for name in command.list_commands(ctx):
                walk(f"{path} {name}".strip(), command.get_command(ctx, name))

    walk("", root)
    return found


COMMANDS = all_commands()


def flag_names(command: Any) -> list[str]:
    """The flags ``command``'s help must show whole; ``--x/--no-x`` is shown as ``--[no-]x``."""
    names = []
    for param in command.get_params(typer.Context(command, **command.context_settings)):  # as click makes it
        if isinstance(param, typer.core.TyperArgument):
            continue
        opts, secondary = list(param.opts), list(param.secondary_opts)
        if len(secondary) == 1 and secondary[0] in (f"--no-{o[2:]}" for o in opts):
            long = secondary[0].removeprefix("--no-")
            opts, secondary = [o for o in opts if o != f"--{long}"] + [f"--[no-]{long}"], []
        names += opts + secondary
    return names


def help_at(path: str, width: int) -> str:
    result = run_llmp(*path.split(), "--help", env={"COLUMNS": str(width)})
    assert result.stderr == "", result.stderr
    return result.stdout


def panels(text: str) -> dict[str, str]:
    """Panel title -> the panel's text."""
    found = {}
    for chunk in text.split("╭─ ")[1:]:
        title, _, body = chunk.partition("\n")
        found[title.split(" ─")[0]] = body.split("╰")[0]
    return found


def test_every_command_is_discovered() -> None:
    assert {"", "serve", "chat", "complete", "bench serve", "bench throughput", "plugins list", "collect-env"} <= set(
        COMMANDS
    )


@pytest.mark.parametrize("path", sorted(COMMANDS), ids=lambda path: path or "llmp")
def test_help_shows_every_flag_whole_without_type_noise(path: str) -> None:
    flags = flag_names(COMMANDS[path])
    assert "--help" in flags and "-h" in flags  # -h as in vLLM's and most commands
    for width in WIDTHS:
        text = help_at(path, width)
        where = f"llmp {path} --help at {width} columns:\n{text}"
        assert "…" not in text, where
        for flag in flags:  # whole: not followed by more of a name, as a cut one would be
            assert re.search(re.escape(flag) + r"(?![\w-])", text), f"{flag} is not whole in {where}"
        assert not TYPE_NOISE.search(text), f"{TYPE_NOISE.search(text).group()} in {where}"
        assert max(len(line) for line in text.splitlines()) <= width, where


def test_serve_help_groups_its_options_in_panels() -> None:
    assert set(SERVE_PANELS) <= set(PANELS)
    for width in WIDTHS:
        text = help_at("serve", width)
        shown = panels(text)
        assert list(shown) == [*SERVE_PANELS, "Options"], list(shown)
        for panel, flags in {
            "Model": ("MODEL", "--dtype", "--max-model-len", "--served-model-name"),
            "Engine": ("--max-num-seqs", "--kv-cache-memory-gib", "--kernels", "--[no-]enable-prefix-caching"),
            "Parallelism": ("--executor", "--tensor-parallel-size, -tp N", "--ray-address"),
            "Server": ("--host", "--port", "--log-level"),
            "Security and limits": ("--api-key", "--max-request-body-bytes", "--allowed-hosts"),
            "Tools and reasoning": ("--tool-call-parser", "--enable-auto-tool-choice", "--reasoning-parser"),
            "LoRA adapters": ("--enable-lora", "--max-loras", "--lora-modules"),
            "Front-ends": ("--frontend", "--grpc-port"),
            "Options": ("--config", "--help"),
        }.items():
            for flag in flags:
                assert flag in shown[panel], f"{flag} not in the {panel} panel at {width} columns:\n{text}"
        assert "--dtype {auto,bfloat16,float16,float32,half,float}" in text  # a closed set's values, compactly
        assert "[default: 8000]" in shown["Server"]
    # 117 lines before LoRA, 134 before Operations, 149 before -q, 155 before the GPU options, 164 before
    # vLLM's tokenizer-info, generation-override and middleware flags
    assert len(help_at("serve", 120).splitlines()) < 180


@pytest.mark.parametrize("record", [EngineConfig, ServerOptions, FrontendOptions], ids=lambda r: r.__name__)
def test_every_option_of_llmps_records_names_one_of_its_panels(record: type) -> None:
    for f in dataclasses.fields(record):
        if f.metadata.get("help"):
            assert f.metadata.get("panel") in PANELS, f"{record.__name__}.{f.name} names no panel of PANELS"


def test_a_group_lists_its_commands_with_their_help() -> None:
    text = help_at("", 80)
    commands = panels(text)["Commands"]
    for name in ("serve", "chat", "bench", "plugins", "collect-env"):
        assert re.search(rf"^│ {name}\s", commands, re.MULTILINE), text
    assert text.splitlines()[1].strip() == "Usage: llmp [OPTIONS] COMMAND [ARGS]..."


@pytest.mark.parametrize("path", sorted(p for p in COMMANDS if p), ids=str)
def test_the_settings_note_gives_an_example_of_the_commands_own_options(path: str) -> None:
    """The note under the panels (LLMP_<OPTION>, --config keys) shows one of this command's options."""
    text = re.sub(r"\s+", " ", help_at(path, 120))
    flags = flag_names(COMMANDS[path])
    if "--config" not in text or not set(flags) - {"--config", "-h", "--help"}:  # nothing to set but arguments
        return
    example = re.search(r"LLMP_<OPTION> \(LLMP_(\w+)=\S+\) or as a key of the --config file \(([\w-]+): ", text)
    assert example, text
    variable, key = example.groups()
    assert key == variable.lower().replace("_", "-")
    assert f"--{key}" in flags or f"--[no-]{key}" in flags, f"{key} is no option of llmp {path}:\n{text}"
