"""Typed option records: each option's default and help text are written here, once.

For programs and plugins: :class:`EngineConfig` (what an engine is built from; executors
and workers receive it), :class:`ServerOptions` (``llmp serve``'s HTTP server),
:class:`FrontendOptions` (what a front-end is built with), and :func:`option`, which
declares a field of a plugin's own record (a command plugin's options: see
:mod:`llmp.cli.options`).

A field declared with :func:`option` is a command-line option: every command built
from these records (``llmp serve``, ``llmp bench``, ``llmp mcp``, plugin commands;
see :mod:`llmp.cli.options`) generates ``--flag-name`` from the field name, reads
``LLMP_<FIELD>`` and the ``--config`` YAML key of the same name, and shows the help
text. A field without ``help`` is filled in at run time and is not an option.

This module is the ground floor: it imports nothing from llmp and no CLI library.
"""

from __future__ import annotations

import typing
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Literal

__all__ = ["DEFAULT_MODEL", "EngineConfig", "FrontendOptions", "ServerOptions", "option"]

DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"  # what ``model=None`` serves (a packaged GGUF)

Dtype = Literal["auto", "bfloat16", "float16", "float32"]
SchedulingPolicy = Literal["fcfs", "priority"]
ModelImpl = Literal["auto", "native", "transformers"]
Task = Literal["auto", "generate", "embed"]
LogLevel = Literal["debug", "info", "warning", "error"]


def option(
    default: Any = MISSING,
    help: str = "",
    *,
    flag: str | None = None,
    short: str | None = None,
    factory: Any = MISSING,
    **metadata: Any,
) -> Any:
    """A dataclass field that is also a command-line option.

    ``help`` is the ``--help`` text (required: a field without it is no option);
    ``flag`` overrides the generated ``--field-name`` (``"--json/--no-json"``);
    ``short`` adds a short alias (``-tp``). Further keywords are kept as metadata
    for the command generator:

    - ``argument=True``: a positional argument rather than an option;
    - ``name="..."``: the option's public name (flag, ``LLMP_*`` variable and YAML
      key) when it differs from the field name;
    - ``scale=N``: the option is given in units of N of the field (GiB of a byte count);
    - ``ge=``, ``gt=``: the least value allowed (inclusive, exclusive);
    - ``metavar="..."``: the value's name in ``--help``.

    A bool option with default ``True`` gets a ``--no-...`` form; one with default
    ``False`` is a plain switch. A ``tuple[str, ...]`` option is repeatable, and a
    comma-separated ``LLMP_*`` value gives several items.
    """
    meta = {"help": help, "flag": flag, "short": short, **metadata}
    if factory is not MISSING:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(kw_only=True)
class EngineConfig:
    """Everything an engine is built from, as one plain record (``LLM(model, **fields)``, and what
    executors, workers and the model runner receive).

    Fields declared with ``option`` are also the engine options of ``llmp serve``,
    ``llmp bench throughput``/``latency`` and ``llmp mcp`` (generated from this record);
    the others are set by programs and plugins only.
    """

    model: str | None = option(
        None,
        "Model directory, .gguf file or Hugging Face id in the local cache; "
        f"default {DEFAULT_MODEL.rpartition('/')[2]}.",
        argument=True,
    )
    tokenizer: str | None = None  # defaults to the model's directory
    device: str = option("cpu", "Device the model runs on: cpu or cuda.")
    executor: str = option("uniproc", "Executor plugin: uniproc, mp or ray.")
    tensor_parallel_size: int = option(1, "Tensor-parallel workers.", short="-tp")
    ray_address: str | None = option(None, "Ray cluster for --executor ray (default: RAY_ADDRESS).")
    dtype: Dtype = option("auto", "auto, bfloat16, float16 or float32.")
    max_model_len: int | None = option(None, "Context length (default: the model's, capped by the KV cache).")
    max_num_seqs: int = option(256, "Most sequences in one step.")
    max_num_batched_tokens: int = option(2048, "Most tokens in one step.")
    scheduling_policy: SchedulingPolicy = option(
        "fcfs",
        "fcfs: arrival order. priority: waiting requests ordered by (priority, arrival), lower value "
        "first; when the KV cache is full the running request last in that order is preempted "
        "(a waiting request never preempts a running one).",
    )
    enable_prefix_caching: bool = option(True, "Reuse the KV cache of a shared prompt prefix.")
    enable_chunked_prefill: bool = option(True, "Split long prompts over several steps.")
    kv_cache_memory_bytes: int = option(
        4 << 30, "Memory for the KV cache, in GiB.", name="kv_cache_memory_gib", scale=1 << 30, gt=0
    )
    num_kv_blocks: int | None = None  # overrides kv_cache_memory_bytes
    block_size: int = option(16, "Tokens per KV-cache block.")
    kernels: str | None = option(None, "Kernel set (default: the best for the device).")
    model_impl: ModelImpl = option(
        "auto", "auto (native when a plugin provides the architecture, else transformers), native or transformers."
    )
    task: Task = option("auto", "auto, generate or embed (serve a causal LM's pooled hidden states on /v1/embeddings).")
    num_threads: int | None = option(None, "Torch threads of the engine (default: all cores).")
    seed: int = option(0, "Engine seed for requests without one.")
    scheduler: str = "default"  # scheduler plugin
    kv_manager: str = "default"  # KV-cache manager plugin
    worker_timeout_s: float = 300.0  # a worker silent this long in a step is taken for dead
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_choices(self)
        for name in ("block_size", "tensor_parallel_size", "max_num_seqs", "max_num_batched_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.kv_cache_memory_bytes <= 0:
            raise ValueError(f"kv_cache_memory_bytes must be > 0, got {self.kv_cache_memory_bytes}")
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"num_threads must be >= 1, got {self.num_threads}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")

    def keywords(self) -> dict[str, Any]:
        """This config as ``LLM``/``AsyncLLM`` keywords, the model aside: ``AsyncLLM(model, **config.keywords())``."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "model"}


@dataclass(frozen=True, kw_only=True)
class ServerOptions:
    """How ``llmp serve`` listens and guards its HTTP server (the engine and request options are elsewhere)."""

    frontend: tuple[str, ...] = option(("openai",), "Front-end plugin to mount (repeatable; default openai).")
    host: str = option("127.0.0.1", "Address to bind; 0.0.0.0 for every interface.")
    port: int = option(8000, "Port to bind.")
    api_key: tuple[str, ...] = option((), "Require 'Authorization: Bearer KEY' on every inference route (repeatable).")
    served_model_name: tuple[str, ...] = option((), "Public model name(s); the first is echoed in responses.")
    allowed_origins: tuple[str, ...] = option((), "CORS origin allowed to call the API (repeatable; default none).")
    allow_credentials: bool = option(False, "CORS: allow credentials.")
    root_path: str = option("", "Path prefix when behind a path-routing proxy.")
    max_request_body_bytes: int = option(2 << 20, "Larger request bodies get 413.", ge=0)
    max_queue_len: int | None = option(
        1024, "Model requests that may wait beyond --max-num-seqs running ones; more are refused at once.", ge=0
    )
    overload_status: int = option(503, "Status of a refusal at capacity: 503 (Retry-After) or 429.")
    request_timeout: float | None = option(
        None, "Seconds a request may wait and run before it is aborted (408); default: no limit.", ge=0
    )
    health_check_timeout: float = option(
        5.0, "/ready and /health fail if the engine does not answer a ping within this many seconds.", ge=0
    )
    header_timeout: float = option(
        10.0, "Seconds a connection has to send a request's headers (against slowloris); 0: no limit.", ge=0
    )
    allowed_hosts: tuple[str, ...] = option(
        (),
        "Host header names accepted (repeatable); default: loopback names when "
        "bound to loopback (against DNS rebinding), else any.",
    )
    disable_fastapi_docs: bool = option(False, "No /docs, /redoc, /openapi.json.")
    shutdown_timeout: float = option(
        10.0, "Seconds in-flight requests get to finish on SIGTERM before they are aborted (0: at once).", ge=0
    )
    log_level: LogLevel = option("info", "debug, info, warning or error.")
    disable_access_log: bool = option(False, "No per-request log lines.")

    def __post_init__(self) -> None:
        _check_choices(self)
        if self.overload_status not in (429, 503):
            raise ValueError(f"overload_status must be 503 (the default) or 429, got {self.overload_status}")


@dataclass(frozen=True, kw_only=True)
class FrontendOptions:
    """What a front-end plugin is built with, besides the engine client.

    The first group is filled in by the server once the engine is ready; the rest
    are ``llmp serve`` options that govern how requests are read and answered.
    """

    # filled in by the server
    served_model_names: tuple[str, ...] = ()  # the first is echoed in responses
    model_root: str = ""  # the model's directory (or GGUF file), for /v1/models' root and generation_config.json
    max_model_len: int = 0
    task: Literal["generate", "embed"] = "generate"
    # the HTTP server's address (None: no server filled it in): front-ends with their own port listen there too
    host: str | None = None
    api_keys: tuple[str, ...] = ()  # the server's --api-key values: front-ends with their own port check them
    max_request_body_bytes: int | None = None  # the server's cap on a request body (None: no server in front)
    # request handling (llmp serve options)
    chat_template: str | None = option(None, "Chat template: a file path or the template text.")
    trust_request_chat_template: bool = option(False, "Allow a request's own chat_template (off: 400).")
    response_role: str = option("assistant", "Role of generated chat messages.")
    generation_config: Literal["auto", "none"] = option(
        "auto", "auto: sampling defaults from the model's generation_config.json; none: llmp's defaults."
    )
    max_logprobs: int = option(20, "Cap on logprobs, top_logprobs and prompt_logprobs.")
    max_n: int = option(128, "Cap on n (choices per request).")
    max_stop_sequences: int = option(64, "Cap on the number of stop strings in a request.", ge=0)
    tool_call_parser: str | None = option(
        None,
        "Tool-call parser plugin (hermes, llama3_json, mistral, pythonic, qwen3_xml, deepseek_v3, ...): "
        "needed for tool_choice auto, required or named.",
    )
    enable_auto_tool_choice: bool = option(
        False, "Let the model decide to call tools (tool_choice auto); needs --tool-call-parser."
    )
    reasoning_parser: str | None = option(
        None, "Reasoning parser plugin (deepseek_r1, qwen3, mistral, ...): reasoning goes to message.reasoning."
    )
    exclude_tools_when_tool_choice_none: bool = option(False, "With tool_choice none, keep tools out of the prompt.")
    return_tokens_as_token_ids: bool = option(False, "Logprob tokens as 'token_id:N'.")
    enable_force_include_usage: bool = option(False, "Usage on every streamed chunk.")
    enable_store: bool = option(False, "Keep /v1/responses results in memory (GET, previous_response_id).")
    grpc_port: int = option(50051, "Port of the grpc front-end (--frontend grpc), on --host.")

    def __post_init__(self) -> None:
        _check_choices(self)


_CHOICES: dict[type, dict[str, tuple[Any, ...]]] = {}


def _check_choices(record: Any) -> None:
    """``ValueError`` naming the field when a ``Literal``-typed field of ``record`` holds another value
    (the command line and ``LLMP_*`` are checked before a record is built; a program is checked here)."""
    cls = type(record)
    if cls not in _CHOICES:
        hints = typing.get_type_hints(cls)
        _CHOICES[cls] = {
            f.name: typing.get_args(hints[f.name]) for f in fields(cls) if typing.get_origin(hints[f.name]) is Literal
        }
    for name, choices in _CHOICES[cls].items():
        value = getattr(record, name)
        if value not in choices:
            raise ValueError(f"{name} must be {_alternatives(choices)}, got {value!r}")


def _alternatives(choices: tuple[Any, ...]) -> str:
    names = [str(c) for c in choices]
    return f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else names[0]
