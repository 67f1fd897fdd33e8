"""Ollama's ``options`` (its Modelfile parameters) as llmp's sampling fields.

Three kinds of option: those llmp honours (mapped below), those that only tune Ollama's runner
(threads, GPU layers, memory mapping: nothing to do with the output, accepted and ignored), and
those that would change the output in ways llmp cannot (mirostat, tail-free and typical sampling):
a 400 naming the option unless it holds its "off" value, so a request never silently means less.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from llmp.frontend import bad_request

# Ollama option -> SamplingParams field
SAMPLING = {
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "min_p": "min_p",
    "seed": "seed",
    "stop": "stop",
    "repeat_penalty": "repetition_penalty",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
}
# how much this request may use of the context, and what it generates: read here
CONTEXT = ("num_ctx", "num_predict", "num_keep", "repeat_last_n")
# the runner's own settings (memory, threads, GPUs, batching): the output does not depend on them
RUNNER_ONLY = (
    "numa",
    "num_batch",
    "num_gpu",
    "main_gpu",
    "low_vram",
    "f16_kv",
    "logits_all",
    "vocab_only",
    "use_mmap",
    "use_mlock",
    "embedding_only",
    "num_thread",
    "penalize_newline",  # Ollama itself ignores it now
)
# samplers llmp does not have: accepted only at the value that turns them off
OFF_VALUES = {"mirostat": 0, "tfs_z": 1.0, "typical_p": 1.0}
# the settings of mirostat, meaningless while it is off
MIROSTAT_SETTINGS = ("mirostat_tau", "mirostat_eta")
NUMBERS = {
    "temperature": float,
    "top_k": int,
    "top_p": float,
    "min_p": float,
    "seed": int,
    "repeat_penalty": float,
    "presence_penalty": float,
    "frequency_penalty": float,
    "num_ctx": int,
    "num_predict": int,
    "num_keep": int,
    "repeat_last_n": int,
}
KNOWN = (*SAMPLING, *CONTEXT, *RUNNER_ONLY, *OFF_VALUES, *MIROSTAT_SETTINGS)


@dataclass
class Options:
    """What a request's ``options`` ask of llmp."""

    sampling: dict[str, Any] = field(default_factory=dict)  # SamplingRequest fields
    num_ctx: int | None = None  # this request's context window (tokens)
    num_predict: int | None = None  # tokens to generate; <= 0: until the context ends
    num_keep: int = 0  # prompt tokens kept at the start when the prompt is cut to fit
    names: dict[str, str] = field(default_factory=dict)  # SamplingParams field -> the option's name


def read_options(options: dict[str, Any] | None) -> Options:
    """The request's ``options``, checked: a 400 names an unknown option, a value of the wrong type,
    or an option llmp cannot honour."""
    out = Options()
    for name, value in (options or {}).items():
        param = f"options.{name}"
        if name not in KNOWN:
            raise bad_request(
                f"{param} is not an Ollama option llmp knows (it takes {', '.join(sorted(KNOWN))})", param
            )
        if value is None or name in RUNNER_ONLY or name in MIROSTAT_SETTINGS:
            continue
        value = _number(name, value, param) if name in NUMBERS else value
        if name in OFF_VALUES:
            if value != OFF_VALUES[name]:
                raise bad_request(
                    f"{param}={value!r}: llmp has no {name} sampling; leave it unset (or {OFF_VALUES[name]}) "
                    "and use temperature, top_k, top_p and min_p",
                    param,
                )
        elif name == "stop":
            if isinstance(value, str):
                value = [value]
            if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
                raise bad_request(f"{param} must be a list of strings", param)
            out.sampling["stop"] = value or None
            out.names["stop"] = param
        elif name in SAMPLING:
            out.sampling[SAMPLING[name]] = value
            out.names[SAMPLING[name]] = param
        elif name == "num_ctx":
            if value < 1:
                raise bad_request(f"{param} must be at least 1, got {value}", param)
            out.num_ctx = value
        elif name == "num_predict":
            out.num_predict = value
            out.names["max_tokens"] = param
        elif name == "num_keep":
            out.num_keep = max(0, value)
    _repeat_window(options or {}, out)
    return out


def _repeat_window(options: dict[str, Any], out: Options) -> None:
    """llmp's repetition penalty reads every token of the context (Ollama's ``repeat_last_n: -1``);
    0 turns the penalty off; another window would change what the penalty means."""
    window = options.get("repeat_last_n")
    if window is None or window == -1:
        return
    window = _number("repeat_last_n", window, "options.repeat_last_n")
    if window == 0:
        out.sampling.pop("repetition_penalty", None)
        return
    penalty = out.sampling.get("repetition_penalty")
    if penalty is not None and penalty != 1.0:
        raise bad_request(
            f"options.repeat_last_n={window}: llmp applies repeat_penalty to the whole context; "
            "set repeat_last_n to -1 (or 0 to turn the penalty off)",
            "options.repeat_last_n",
        )


def _number(name: str, value: Any, param: str) -> Any:
    kind = NUMBERS[name]
    if isinstance(value, bool) or not isinstance(value, int | float) or (kind is int and value != int(value)):
        raise bad_request(f"{param} must be {'an integer' if kind is int else 'a number'}, got {value!r}", param)
    return kind(value)
