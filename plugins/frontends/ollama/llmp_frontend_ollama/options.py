"""Ollama's ``options`` (its Modelfile parameters) as llmp's sampling fields, read as Ollama's
``Options.FromMap`` reads them: a value of the wrong type is a 400, an option Ollama's API does not
have (``mirostat``, ``tfs_z``, ``penalize_newline`` ...: Ollama dropped them) is accepted with a
warning in the server log, as Ollama does.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

from llmp.frontend import bad_request

log = logging.getLogger("llmp.frontend.ollama")

# Ollama option -> SamplingParams field
SAMPLING = {
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "min_p": "min_p",
    "typical_p": "typical_p",
    "seed": "seed",
    "stop": "stop",
    "repeat_penalty": "repetition_penalty",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
}
# how much this request may use of the context, and what it generates: read here
CONTEXT = ("num_ctx", "num_predict", "num_keep", "repeat_last_n")
# Ollama's runner settings (memory, threads, GPUs, batching, draft tokens): the output does not depend on them
RUNNER_ONLY = ("num_batch", "num_gpu", "main_gpu", "use_mmap", "num_thread", "draft_num_predict")
INTEGERS = ("top_k", "seed", "num_ctx", "num_predict", "num_keep", "repeat_last_n")
INTEGERS += ("num_batch", "num_gpu", "main_gpu", "num_thread", "draft_num_predict")
FLOATS = ("temperature", "top_p", "min_p", "typical_p", "repeat_penalty", "presence_penalty", "frequency_penalty")
BOOLEANS = ("use_mmap",)
KNOWN = (*SAMPLING, *CONTEXT, *RUNNER_ONLY)
# Ollama's defaults (api.DefaultOptions) of what neither a request nor the model's generation config
# (its Modelfile parameters, as /api/show lists them) sets. Its repeat_penalty 1.1 over the last 64
# tokens is left out, so that a request gives what the same request gives on the OpenAI routes.
SAMPLING_DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.9}
# Ollama's default num_keep: the first tokens kept when a prompt is cut to fit the window
DEFAULT_NUM_KEEP = 4
# a negative num_keep: as many as fit (Ollama's runner sets it to the prompt's length, then caps it)
KEEP_ALL = 1 << 62


@dataclass
class Options:
    """What a request's ``options`` ask of llmp."""

    sampling: dict[str, Any] = field(default_factory=dict)  # SamplingRequest fields
    num_ctx: int | None = None  # this request's context window (tokens)
    num_predict: int | None = None  # tokens to generate; <= 0: until the context ends
    num_keep: int = DEFAULT_NUM_KEEP  # prompt tokens kept at the start when the prompt is cut to fit
    names: dict[str, str] = field(default_factory=dict)  # SamplingParams field -> the option's name
    ignored: list[str] = field(default_factory=list)  # accepted, not applied: what the warning names


def read_options(options: dict[str, Any] | None) -> Options:
    """The request's ``options``, checked: a 400 names a value of the wrong type; options llmp
    does not apply are named in one warning line of the server log."""
    out = Options()
    for name, value in (options or {}).items():
        if name not in KNOWN:
            out.ignored.append(f"{name} (not an option of Ollama's API)")
            continue
        if value is None:
            continue
        value = _typed(name, value)
        if name in RUNNER_ONLY:
            continue
        if name == "typical_p":
            value = min(value, 1.0)  # llama.cpp's: 1 or more turns typical sampling off
        if name in SAMPLING:
            out.sampling[SAMPLING[name]] = (value or None) if name == "stop" else value
            out.names[SAMPLING[name]] = f"options.{name}"
        elif name == "num_ctx":
            if value < 1:
                raise bad_request(f"options.num_ctx must be at least 1, got {value}", "options.num_ctx")
            out.num_ctx = value
        elif name == "num_predict":
            out.num_predict = value
            out.names["max_tokens"] = "options.num_predict"
        elif name == "num_keep":
            out.num_keep = value if value >= 0 else KEEP_ALL
    # repeat_last_n (llama.cpp's): the penalties read the last N tokens; -1, the whole context; 0 turns them off
    # (neutral values, not left unset: unset takes the model's generation config, which may set a penalty)
    window = (options or {}).get("repeat_last_n")
    if window is not None and _typed("repeat_last_n", window) == 0:
        out.sampling.update(repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0)
    elif window is not None and _typed("repeat_last_n", window) > 0:
        out.sampling["penalty_window"] = _typed("repeat_last_n", window)
        out.names["penalty_window"] = "options.repeat_last_n"
    if out.ignored:
        log.warning("Ollama options accepted but not applied: %s", ", ".join(out.ignored))
    return out


def _typed(name: str, value: Any) -> Any:
    """An option's value as Ollama's Go struct holds it (integers truncate a JSON number, as Go's do)."""
    param = f"options.{name}"
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if name in INTEGERS:
        if not number:
            raise bad_request(f'option "{name}" must be of type integer, got {json.dumps(value)}', param)
        return int(value)
    if name in FLOATS:
        if not number:
            raise bad_request(f'option "{name}" must be of type float32, got {json.dumps(value)}', param)
        return float(value)
    if name in BOOLEANS:
        if not isinstance(value, bool):
            raise bad_request(f'option "{name}" must be of type boolean, got {json.dumps(value)}', param)
        return value
    if isinstance(value, str):  # stop: Ollama takes an array; one string is taken as a list of one
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise bad_request(f'option "{name}" must be an array of strings, got {json.dumps(value)}', param)
    return value
