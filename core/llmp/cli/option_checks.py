"""What an option's declaration alone cannot check, checked before a command starts anything: the
plugins that options name (``component=`` on :func:`llmp.options.option`) against the registry, and
options that do not go together. Each problem names its options as the user set them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from difflib import get_close_matches
from pathlib import Path
from typing import Any

from llmp import registry
from llmp.config import OptionSpec, Setting
from llmp.options import alternatives

log = logging.getLogger(__name__)

# options that act only beside another: (option, the option it needs, whether that one's value lets it
# act, the value to name in the problem)
ONLY_BESIDE: tuple[tuple[str, str, Callable[[Any], bool], str], ...] = (
    ("lora_modules", "enable_lora", bool, ""),
    ("enable_lora_runtime_updates", "enable_lora", bool, ""),
    ("max_loras", "enable_lora", bool, ""),
    ("max_lora_rank", "enable_lora", bool, ""),
    ("max_cpu_loras", "enable_lora", bool, ""),
    ("admin_api_key", "enable_admin_api", bool, ""),
    ("allow_credentials", "allowed_origins", bool, " ORIGIN"),
    ("ray_address", "executor", lambda executor: executor == "ray", " ray"),
)
# of those, the ones that ask for something to be served (adapters): refused from any source, where a
# tuning knob set by a variable or a shared file is only warned about
ASKS_FOR_WORK = frozenset({"lora_modules", "enable_lora_runtime_updates"})


def option_problems(specs: list[OptionSpec], values: Mapping[str, Setting]) -> list[str]:
    """Every problem of ``values`` (the options set, by name) beyond their declarations."""
    return component_problems(specs, values) + combination_problems(specs, values)


def component_problems(specs: list[OptionSpec], values: Mapping[str, Setting]) -> list[str]:
    """Each component name that the registry does not know, with the names it does."""
    problems = []
    for spec in specs:
        if spec.component is None or spec.name not in values:
            continue
        setting = values[spec.name]
        names = setting.value if spec.repeatable else (setting.value,)
        known = registry.components(spec.component)
        for name in names:
            if name is None or name in known:
                continue
            close = get_close_matches(name, known, 1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            kind = spec.component.replace("_", " ")
            installed = f"{alternatives(tuple(sorted(known)))} (the installed {kind} plugins)" if known else None
            wanted = f"must be {installed}" if installed else f"must name a {kind} plugin (none is installed)"
            problems.append(f"{setting.source} {wanted}, got {name!r}{hint}")
    return problems


def combination_problems(specs: list[OptionSpec], values: Mapping[str, Setting]) -> list[str]:
    """What only the registry, the model or another option tells, among the options this command
    takes: more than one rank on an executor that runs one, a device no kernel set runs on, a
    context longer than the model's, a task, runner and conversion asking for different things,
    an option without the one it acts beside (``ONLY_BESIDE``: LoRA options without LoRA, an admin
    key without the admin API ...), auto tool choice without a parser."""
    taken = {s.name: s for s in specs}

    def setting(name: str) -> Setting:
        return values.get(name) or Setting.default(taken[name])

    problems = []
    if {"executor", "tensor_parallel_size"} <= taken.keys():
        tp, executor = setting("tensor_parallel_size"), setting("executor")
        spec = registry.components("executor").get(executor.value)
        if tp.value > 1 and spec is not None and not getattr(spec, "distributed", False):
            distributed = sorted(n for n, s in registry.components("executor").items() if getattr(s, "distributed", 0))
            problems.append(
                f"{tp.written} needs an executor that runs several ranks "
                f"(--executor {' or '.join(distributed) or 'mp'}); {executor.value} runs one"
            )
    if "device" in values:  # a named kernel set may run elsewhere (triton under TRITON_INTERPRET): not checked
        device = values["device"]
        devices = sorted({d for s in registry.components("kernels").values() for d in getattr(s, "devices", ())})
        kind = str(device.value).partition(":")[0]  # cuda:1 is a cuda device; auto is resolved by the engine
        if devices and kind != "auto" and kind not in devices:
            problems.append(f"{device.source} must be {alternatives(tuple(devices))}, got {device.value!r}")
    if "max_model_len" in values and "model" in taken and taken["model"].record == taken["max_model_len"].record:
        problems += context_problems(setting("model"), values["max_model_len"])
    if "model" in taken:
        problems += local_model_problems(setting("model"), values)
    problems += task_problems({name: setting(name) for name in ("task", "runner", "convert") if name in taken})
    for name, needed, acts, value in ONLY_BESIDE:  # set, but what it acts on is off: said, not ignored
        given = values.get(name)
        if given is None or given.value in (None, False, (), taken[name].default) or needed not in taken:
            continue
        if not acts(setting(needed).value):
            problem = f"{given.source} needs {taken[needed].flag_name}{value}"
            if given.source == taken[name].flag_name or name in ASKS_FOR_WORK:  # refused
                problems.append(problem)
            else:  # a standing variable or a shared config file: a deployment may set it for other hosts
                log.warning("%s: ignored", problem)
    if {"max_loras", "max_cpu_loras"} <= taken.keys():
        cpu, slots = setting("max_cpu_loras"), setting("max_loras")
        if cpu.value is not None and cpu.value < slots.value:
            problems.append(
                f"{cpu.written} must be at least {slots.source} ({slots.value}): "
                "the CPU cache holds every adapter in a slot"
            )
    if {"enable_auto_tool_choice", "tool_call_parser"} <= taken.keys():
        auto, parser = setting("enable_auto_tool_choice"), setting("tool_call_parser")
        if auto.value and not parser.value:
            problems.append(f"{auto.source} needs {parser.source} NAME (see llmp plugins list --kind tool_parser)")
    return problems


def task_problems(settings: Mapping[str, Setting]) -> list[str]:
    """``--runner generate`` with ``--convert classify`` (and the like): what the engine would refuse
    once started, without the model. Options a command does not take count as ``auto``."""
    from llmp.model_files.resolve import conflicting_options

    values = {name: settings[name].value if name in settings else "auto" for name in ("task", "runner", "convert")}
    conflict = conflicting_options(values["task"], values["runner"], values["convert"])
    if conflict is None:
        return []
    first, second = (settings[name].written for name in conflict)
    return [f"{first} contradicts {second}: they ask for different tasks"]


def context_problems(model: Setting, max_model_len: Setting) -> list[str]:
    """A context length beyond the model's (its config.json), as the engine would refuse it once
    started. A model that cannot be found is left to the command, which says why."""
    from llmp.model_files.config import load_plain_config
    from llmp.model_files.lookup import find_model_dir
    from llmp.model_files.resolve import context_limit, context_problem

    try:
        model_dir = find_model_dir(model.value, download=False)
        context, source = context_limit(load_plain_config(model_dir), model_dir)
    except Exception:  # noqa: BLE001 - no such model, an unreadable config: the command reports it
        return []
    problem = context_problem(max_model_len.value, context, source)
    return [f"{max_model_len.source} {problem}"] if problem else []


def local_model_problems(model: Setting, values: Mapping[str, Setting]) -> list[str]:
    """``--revision`` (a Hub revision) with a local MODEL, ``--gguf-file`` (a file of a directory
    or repository) with a local file: refused, where they would be ignored."""
    path = Path(str(model.value)).expanduser() if model.value else None
    if path is None or not path.exists():
        return []
    problems = []
    if "revision" in values:
        problems.append(f"{values['revision'].source} picks a revision of a Hub model; {model.value} is a local path")
    if "gguf_file" in values and path.is_file():
        problems.append(
            f"{values['gguf_file'].source} picks a file of a directory or repository; {model.value} is a file"
        )
    return problems
