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

import json
import math
import numbers
import typing
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Literal

__all__ = [
    "DEFAULT_MODEL",
    "PANELS",
    "EngineConfig",
    "FrontendOptions",
    "ServerOptions",
    "device_name",
    "json_object",
    "nonempty",
    "option",
    "url_path",
]

DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"  # what ``model=None`` serves (a packaged GGUF)
# The --help panels of llmp's own options, in the order they are shown; a plugin's option may
# name another panel (shown after these), and an option naming none is in its record's panel.
PANELS = (
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

Dtype = Literal["auto", "bfloat16", "float16", "float32", "half", "float"]  # the last two: aliases
DTYPE_ALIASES = {"half": "float16", "float": "float32"}  # vLLM's (and torch's) other names
# vLLM's --quantization, the methods llmp loads (vLLM's GPU kernel names for AWQ and GPTQ checkpoints too)
Quantization = Literal["awq", "gptq", "compressed-tensors", "gguf", "awq_marlin", "gptq_marlin"]
QUANTIZATION_ALIASES = {"awq_marlin": "awq", "gptq_marlin": "gptq"}  # the checkpoint format each one reads
SchedulingPolicy = Literal["fcfs", "priority"]
ModelImpl = Literal["auto", "native", "transformers"]
Task = Literal["auto", "generate", "embed", "classify", "score", "reward"]
Runner = Literal["auto", "generate", "pooling"]
Convert = Literal["auto", "none", "embed", "classify", "reward"]
# what an engine does with a request that does not say (llmp.api.ModelTask; this module imports nothing from llmp)
PrimaryTask = Literal["generate", "embed", "classify", "reward"]
LogLevel = Literal["debug", "info", "warning", "error"]
OverloadStatus = Literal[503, 429]
SSLCertReqs = Literal[0, 1, 2]  # ssl.CERT_NONE, CERT_OPTIONAL, CERT_REQUIRED, as vLLM's --ssl-cert-reqs
MetricsNames = Literal["llmp", "vllm"]
MaxLoRARank = Literal[1, 8, 16, 32, 64, 128, 256, 320, 512]  # vLLM's choices


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
    ``flag`` overrides the generated ``--field-name`` (``"--json/--no-json"``), and the ``LLMP_*``
    variable and YAML key follow it (``LLMP_JSON``, ``json:``);
    ``short`` adds a short alias (``-tp``). Further keywords are kept as metadata
    for the command generator:

    - ``argument=True``: a positional argument rather than an option;
    - ``name="..."``: the option's public name (flag, ``LLMP_*`` variable and YAML
      key) when it differs from the field name;
    - ``scale=N``: the option is given in units of N of the field (GiB of a byte count);
    - ``ge=``, ``gt=``, ``le=``, ``lt=``: the bounds of the value, in the option's units
      (``ge=0, le=65535`` for a port; ``gt=0, le=1`` for a fraction);
    - ``check=function``: a rule beyond bounds and choices, ``function(value) -> str | None`` returning
      the problem (``"must not be empty"``) or ``None``; applied to each item of a repeatable option
      (:func:`nonempty`, :func:`url_path`);
    - ``component="kind"``: the value names a registered component of that kind
      (``"executor"``, ``"tool_parser"`` ...), checked against the registry when parsed;
    - ``panel="..."``: the ``--help`` panel listing the option (default: one panel per record
      a command takes, titled after its parameter; "Options" for a command of one record);
    - ``metavar="..."``: the value's name in ``--help``;
    - ``nargs="+"``: a repeatable option also takes several values after one flag, as vLLM's
      (``--lora-modules a=P b=Q``; values run to the next token starting with ``-``).

    Bounds, choices (a ``Literal`` type) and ``check`` are checked wherever the value comes from: the
    command line, ``LLMP_*``, the YAML file (naming the flag, the variable or the key), and a
    program building the record (naming the field).

    A bool option with default ``True`` gets a ``--no-...`` form; one with default
    ``False`` is a plain switch. A ``tuple[str, ...]`` option is repeatable, and a
    comma-separated ``LLMP_*`` value gives several items.
    """
    meta = {"help": help, "flag": flag, "short": short, **metadata}
    if factory is not MISSING:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def device_name(value: Any) -> str | None:
    """The problem with a ``--device`` value (auto, cpu, cuda or cuda:N), or None."""
    name, _, index = str(value).partition(":")
    if name in ("auto", "cpu") and not index or name == "cuda" and (not _ or index.isdigit()):
        return None
    return f"must be auto, cpu, cuda or cuda:N, got {value!r}"


def positive(value: Any) -> str | None:
    return None if isinstance(value, int) and value >= 1 else f"must be a whole number >= 1, got {value!r}"


def nonempty(value: Any) -> str | None:
    """An option's ``check``: refuses an empty (or all-blank) text."""
    return "must not be empty" if isinstance(value, str) and not value.strip() else None


def json_object(value: Any) -> str | None:
    """An option's ``check``: JSON text of an object (a dict given by a program passes as is)."""
    if isinstance(value, dict):
        return None
    if not isinstance(value, str):
        return f"must be a dict or the JSON text of an object, got {value!r}"
    try:
        parsed = json.loads(value)
    except ValueError as exc:
        return f"must be a JSON object, got {value!r} ({exc.msg} at column {exc.colno})"
    return None if isinstance(parsed, dict) else f"must be a JSON object, got {value!r}"


# generation_config.json's sampling defaults that requests without their own value take (vLLM's set)
GENERATION_DEFAULTS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_new_tokens")


# the values SamplingParams takes for each (checked when a server starts, not at each request)
_SAMPLING_DEFAULT_RULES = {
    "temperature": (lambda v: 0 <= v <= 2, "in [0, 2]"),
    "top_p": (lambda v: 0 < v <= 1, "in (0, 1]"),
    "top_k": (lambda v: v == int(v) and v >= -1, "a whole number, at least -1 (0 or -1: off)"),
    "min_p": (lambda v: 0 <= v <= 1, "in [0, 1]"),
    "repetition_penalty": (lambda v: v > 0, "above 0"),
    "max_new_tokens": (lambda v: v == int(v) and v >= 1, "a whole number, at least 1"),
}


def sampling_defaults(value: Any) -> str | None:
    """An option's ``check``: a JSON object (or dict) of :data:`GENERATION_DEFAULTS` keys, each a
    finite number in the range ``SamplingParams`` takes for it."""
    error = json_object(value)
    if error is not None:
        return error
    given = json.loads(value) if isinstance(value, str) else value
    unknown = sorted(set(given) - set(GENERATION_DEFAULTS))
    if unknown:
        return f"may set {', '.join(GENERATION_DEFAULTS)}; not {', '.join(unknown)}"
    for key, number in given.items():
        if isinstance(number, bool) or not isinstance(number, int | float) or not math.isfinite(number):
            return f"{key} must be a finite number, got {number!r}"
        rule, bounds = _SAMPLING_DEFAULT_RULES[key]
        if not rule(number):
            return f"{key} must be {bounds}, got {number!r}"
    return None


def url_path(value: Any) -> str | None:
    """An option's ``check``: a URL path prefix starts with ``/`` (or is empty: none)."""
    return None if not value or str(value).startswith("/") else f"must start with /, got {value!r}"


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
        "Model directory, .gguf file or Hugging Face id (org/name, org/name:Q4_K_M for a GGUF file), "
        f"downloaded when not cached; default {DEFAULT_MODEL.rpartition('/')[2]}.",
        argument=True,
        metavar="MODEL",
        check=nonempty,
        panel="Model",
    )
    revision: str | None = option(
        None,
        "Hub branch, tag or commit of the model (default main).",
        metavar="REVISION",
        check=nonempty,
        panel="Model",
    )
    gguf_file: str | None = option(
        None,
        "The GGUF file of the model's repository or directory to serve (default: the tag's, or Q4_K_M).",
        metavar="FILE",
        check=nonempty,
        panel="Model",
    )
    tokenizer: str | None = None  # defaults to the model's directory
    device: str = option(
        "auto",
        "Device the model runs on: auto (cuda when torch sees a GPU, else cpu), cpu, cuda or cuda:N.",
        metavar="DEVICE",
        check=device_name,
        panel="Engine",
    )
    executor: str = option("uniproc", "Executor plugin: uniproc, mp or ray.", component="executor", panel="Parallelism")
    tensor_parallel_size: int = option(
        1, "Tensor-parallel workers (more than 1 needs --executor mp or ray).", short="-tp", ge=1, panel="Parallelism"
    )
    ray_address: str | None = option(
        None, "Ray cluster for --executor ray (default: RAY_ADDRESS).", metavar="ADDRESS", panel="Parallelism"
    )
    dtype: Dtype = option("auto", "Data type of the weights and, by default, the KV cache.", panel="Model")
    kv_cache_dtype: Dtype = option(  # vLLM's --kv-cache-dtype, without its fp8 formats
        "auto",
        "KV cache dtype (auto: --dtype's); 16 bits: twice the tokens.",
        panel="Model",
    )
    quantization: Quantization | None = option(
        None,
        "Quantisation: awq, gptq, compressed-tensors or gguf (default: detected; awq_marlin, gptq_marlin: awq, gptq).",
        short="-q",
        metavar="METHOD",
        panel="Model",
    )
    max_model_len: int | None = option(
        None, "Context length (default: the model's, capped by the KV cache).", ge=2, panel="Model"
    )
    max_num_seqs: int = option(256, "Most sequences in one step.", ge=1, panel="Engine")
    max_num_batched_tokens: int = option(2048, "Most tokens in one step.", ge=1, panel="Engine")
    scheduling_policy: SchedulingPolicy = option(
        "fcfs",
        "fcfs: arrival order. priority: waiting requests ordered by (priority, arrival), lower value "
        "first; when the KV cache is full the running request last in that order is preempted "
        "(a waiting request never preempts a running one).",
        panel="Engine",
    )
    enable_prefix_caching: bool = option(True, "Reuse the KV cache of a shared prompt prefix.", panel="Engine")
    enable_chunked_prefill: bool = option(True, "Split long prompts over several steps.", panel="Engine")
    kv_cache_memory_bytes: int = option(
        0,
        "Memory for the KV cache, in GiB (0, the default: 4 on the CPU; on a GPU, what --gpu-memory-utilization "
        "leaves).",
        name="kv_cache_memory_gib",
        scale=1 << 30,
        ge=0,
        metavar="GIB",
        panel="Engine",
    )
    num_kv_blocks: int | None = None  # overrides kv_cache_memory_bytes
    gpu_memory_utilization: float = option(
        0.9,
        "Fraction of the GPU's memory this engine may use (weights, activations, KV cache); the KV cache "
        "gets what a profiling forward pass at the largest batch leaves.",
        gt=0,
        le=1,
        panel="Engine",
    )
    enforce_eager: bool = option(
        False, "Every decode step runs eagerly: no CUDA graphs, no TorchScript traces on the CPU.", panel="Engine"
    )
    cuda_graph_sizes: tuple[int, ...] = option(
        (),
        "Decode batch sizes captured as CUDA graphs (repeatable; default 1, 2, 4, 8 and multiples of 8 "
        "up to 256, capped by --max-num-seqs); a batch runs in the smallest that holds it.",
        check=positive,
        nargs="+",
        metavar="N",
        panel="Engine",
    )
    block_size: int = option(16, "Tokens per KV-cache block.", ge=1, panel="Engine")
    kernels: str | None = option(
        None, "Kernel set plugin (default: the best for the device).", component="kernels", panel="Engine"
    )
    model_impl: ModelImpl = option(
        "auto",
        "auto (native when a plugin provides the architecture, else transformers), native or transformers.",
        panel="Model",
    )
    task: Task = option(
        "auto",
        "What the model serves: auto (from its architecture), generate, embed (/v1/embeddings; a causal LM's "
        "pooled hidden states), classify (/classify), score (/score and /rerank: a cross-encoder, or the "
        "cosine of embeddings) or reward.",
        panel="Model",
    )
    runner: Runner = option(
        "auto",
        "auto (from the architecture), generate (text) or pooling (embed, classify, score or reward).",
        panel="Model",
    )
    convert: Convert = option(
        "auto",
        "Serve a causal LM as a pooling model: embed, classify or reward; none: as it is; auto: when --task "
        "or --runner asks for a pooling task the model does not do natively.",
        panel="Model",
    )
    hf_overrides: dict[str, Any] | None = option(
        None,
        "Values replacing those of the model's config.json, as a JSON object "
        '({"architectures": ["Qwen3ForSequenceClassification"]}).',
        check=json_object,
        metavar="JSON",
        panel="Model",
    )
    enable_lora: bool = option(False, "Serve LoRA adapters (LoRARequest, --lora-modules).", panel="LoRA adapters")
    max_loras: int = option(1, "Most LoRA adapters in one step (adapter slots).", ge=1, panel="LoRA adapters")
    max_lora_rank: MaxLoRARank = option(16, "Largest LoRA rank served.", panel="LoRA adapters")
    max_cpu_loras: int | None = option(
        None, "LoRA adapters kept in CPU memory (default: --max-loras).", ge=1, panel="LoRA adapters"
    )
    num_threads: int | None = option(
        None,
        "Torch threads of the engine (default: the cores other processes leave free, all when they are idle).",
        ge=1,
        panel="Engine",
    )
    # torch's generators take 0 to 2**64-1; vLLM refuses a negative engine seed too (numpy's seeding)
    seed: int = option(0, "Engine seed for requests without one.", ge=0, le=2**64 - 1, panel="Engine")
    disable_log_stats: bool = option(
        False,
        "No periodic engine statistics line (throughput, running/waiting, KV cache, prefix-cache hits).",
        panel="Engine",
    )
    profiler_dir: str | None = option(
        None,
        "Directory of torch profiler traces (/start_profile; Perfetto reads them).",
        metavar="DIR",
        panel="Operations",
    )
    scheduler: str = "default"  # scheduler plugin
    kv_manager: str = "default"  # KV-cache manager plugin
    worker_timeout_s: float = 300.0  # a worker silent this long in a step is taken for dead
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("dtype", "kv_cache_dtype"):  # vLLM's other spellings: "half", "float", torch.float16
            value = getattr(self, name)
            if type(value).__name__ == "dtype" and str(value).startswith("torch."):
                value = str(value).removeprefix("torch.")
            setattr(self, name, DTYPE_ALIASES.get(value, value) if isinstance(value, str) else value)
        check_fields(self)
        if isinstance(self.hf_overrides, str):  # JSON text from the command line, LLMP_HF_OVERRIDES or YAML
            self.hf_overrides = json.loads(self.hf_overrides)

    def keywords(self) -> dict[str, Any]:
        """This config as ``LLM``/``AsyncLLM`` keywords, the model aside: ``AsyncLLM(model, **config.keywords())``."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "model"}


@dataclass(frozen=True, kw_only=True)
class ServerOptions:
    """How ``llmp serve`` listens and guards its HTTP server (the engine and request options are elsewhere)."""

    frontend: tuple[str, ...] = option(
        ("openai",), "Front-end plugin to mount (repeatable; default openai).", component="frontend", panel="Front-ends"
    )
    host: str = option(
        "127.0.0.1", "Address to bind; 0.0.0.0 for every interface.", metavar="ADDRESS", check=nonempty, panel="Server"
    )
    port: int = option(8000, "Port to bind (0: any free port).", ge=0, le=65535, panel="Server")
    uds: str | None = option(
        None, "Serve on this Unix domain socket instead of --host and --port.", metavar="PATH", panel="Server"
    )
    api_key: tuple[str, ...] = option(
        (),
        "Require 'Authorization: Bearer KEY' on every inference route (repeatable).",
        metavar="KEY",
        check=nonempty,
        panel="Security and limits",
    )
    lora_modules: tuple[str, ...] = option(
        (),
        'Adapters served as models: NAME=PATH or {"name","path","base_model_name"} (several after '
        "one flag, or the flag repeated).",
        metavar="MODULE",
        nargs="+",
        check=nonempty,
        panel="LoRA adapters",
    )
    served_model_name: tuple[str, ...] = option(
        (),
        "Public model names (several after one flag, or the flag repeated); the first is echoed in responses.",
        metavar="NAME",
        nargs="+",
        check=nonempty,
        panel="Model",
    )
    allowed_origins: tuple[str, ...] = option(
        (),
        "CORS origin allowed to call the API (repeatable; default none).",
        metavar="ORIGIN",
        panel="Security and limits",
    )
    allow_credentials: bool = option(False, "CORS: allow credentials.", panel="Security and limits")
    middleware: tuple[str, ...] = option(
        (),
        "ASGI middleware to wrap the app in, as module.attribute: a class (add_middleware) or an async "
        "function (request, call_next) (repeatable).",
        metavar="IMPORT",
        check=nonempty,
        panel="Server",
    )
    root_path: str = option(
        "", "Path prefix when behind a path-routing proxy (/llm).", metavar="PATH", check=url_path, panel="Server"
    )
    max_request_body_bytes: int = option(2 << 20, "Larger request bodies get 413.", ge=1, panel="Security and limits")
    max_queue_len: int | None = option(
        1024,
        "Model requests that may wait beyond --max-num-seqs running ones; more are refused at once.",
        ge=0,
        panel="Security and limits",
    )
    overload_status: OverloadStatus = option(
        503, "Status of a refusal at capacity: 503 (Retry-After) or 429.", panel="Security and limits"
    )
    request_timeout: float | None = option(
        None,
        "Seconds a request may wait and run before it is aborted (408); default: no limit.",
        ge=0,
        panel="Security and limits",
    )
    health_check_timeout: float = option(
        5.0,
        "/ready and /health fail if the engine does not answer a ping within this many seconds.",
        ge=0,
        panel="Server",
    )
    header_timeout: float = option(
        10.0,
        "Seconds a connection has to send a request's headers (against slowloris); 0: no limit.",
        ge=0,
        panel="Security and limits",
    )
    allowed_hosts: tuple[str, ...] = option(
        (),
        "Host header names accepted (repeatable); default: loopback names when "
        "bound to loopback (against DNS rebinding), else any.",
        metavar="HOST",
        panel="Security and limits",
    )
    disable_fastapi_docs: bool = option(False, "No /docs, /redoc, /openapi.json.", panel="Server")
    shutdown_timeout: float = option(
        10.0,
        "Seconds in-flight requests get to finish on SIGTERM before they are aborted (0: at once).",
        ge=0,
        panel="Server",
    )
    api_server_count: int = option(
        1,
        "API-server processes sharing the port and one engine.",
        short="-asc",
        ge=1,
        panel="Server",
    )
    ssl_keyfile: str | None = option(
        None, "TLS: the private key file (PEM).", metavar="FILE", panel="Security and limits"
    )
    ssl_certfile: str | None = option(
        None, "TLS: the certificate file (PEM).", metavar="FILE", panel="Security and limits"
    )
    ssl_ca_certs: str | None = option(
        None,
        "TLS: CA certificates that client certificates must chain to.",
        metavar="FILE",
        panel="Security and limits",
    )
    ssl_cert_reqs: SSLCertReqs = option(
        0, "TLS client certificates: 0 none, 1 optional, 2 required (mutual TLS).", panel="Security and limits"
    )
    enable_admin_api: bool = option(
        False,
        "Serve the management routes: /sleep, /wake_up, /reset_prefix_cache, /start_profile ...",
        panel="Operations",
    )
    admin_api_key: str | None = option(
        None,
        "Key the management routes require instead of --api-key.",
        metavar="KEY",
        check=nonempty,
        panel="Operations",
    )
    enable_log_requests: bool = option(
        False, "Log each request: id, route, sampling parameters, prompt and outcome.", panel="Operations"
    )
    max_log_len: int | None = option(
        None, "Prompt characters and token ids a request log line shows.", ge=0, panel="Operations"
    )
    otlp_traces_endpoint: str | None = option(
        None, "OpenTelemetry collector for a span per request (http://host:4317).", metavar="URL", panel="Operations"
    )
    metrics_names: MetricsNames = option(
        "llmp", "vllm: /metrics also under vLLM's vllm: names (its dashboards).", panel="Operations"
    )
    log_level: LogLevel = option("info", "Server log level.", panel="Server")
    disable_access_log: bool = option(False, "No per-request log lines.", panel="Server")

    def __post_init__(self) -> None:
        check_fields(self)


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
    task: PrimaryTask = "generate"
    # every task the engine takes ("generate", "embed", "classify", "score", "token_embed", "token_classify"):
    # the routes mounted
    supported_tasks: tuple[str, ...] = ("generate",)
    # the HTTP server's address (None: no server filled it in): front-ends with their own port listen there too
    host: str | None = None
    api_keys: tuple[str, ...] = ()  # the server's --api-key values: front-ends with their own port check them
    max_request_body_bytes: int | None = None  # the server's cap on a request body (None: no server in front)
    # seconds requests in flight get once the server is told to stop (--shutdown-timeout; None: no server in
    # front): a front-end with a server of its own is cancelled at once and drains that long
    shutdown_timeout: float | None = None
    # request handling (llmp serve options)
    chat_template: str | None = option(
        None, "Chat template: a file path or the template text.", metavar="TEMPLATE", panel="Model"
    )
    trust_request_chat_template: bool = option(
        False, "Allow a request's own chat_template (off: 400).", panel="Security and limits"
    )
    response_role: str = option(
        "assistant", "Role of generated chat messages.", metavar="ROLE", check=nonempty, panel="Front-ends"
    )
    generation_config: Literal["auto", "none"] = option(
        "auto", "auto: sampling defaults from the model's generation_config.json; none: llmp's defaults.", panel="Model"
    )
    override_generation_config: dict[str, Any] | None = option(
        None,
        'Sampling defaults over generation_config.json\'s: a JSON object ({"temperature": 0.6, "max_new_tokens": 99}).',
        check=sampling_defaults,
        metavar="JSON",
        panel="Model",
    )
    default_chat_template_kwargs: dict[str, Any] | None = option(
        None,
        'Chat-template variables for every request, under its own chat_template_kwargs ({"enable_thinking": false}).',
        check=json_object,
        metavar="JSON",
        panel="Model",
    )
    chat_template_content_format: Literal["auto", "string", "openai"] = option(
        "auto",
        "How message content reaches the chat template: string (text), openai (a list of text parts), "
        "auto (openai when the template loops over content).",
        panel="Model",
    )
    max_logprobs: int = option(
        20, "Cap on logprobs, top_logprobs and prompt_logprobs.", ge=0, panel="Security and limits"
    )
    max_n: int = option(128, "Cap on n (choices per request).", ge=1, panel="Security and limits")
    max_stop_sequences: int = option(
        64, "Cap on the number of stop strings in a request.", ge=0, panel="Security and limits"
    )
    max_score_pairs: int = option(
        1024, "Cap on the documents of a /rerank or the pairs of a /score request.", ge=1, panel="Security and limits"
    )
    tool_call_parser: str | None = option(
        None,
        "Tool-call parser plugin (hermes, llama3_json, mistral, pythonic, qwen3_xml, deepseek_v3, ...): "
        "needed for tool_choice auto, required or named.",
        component="tool_parser",
        metavar="NAME",
        panel="Tools and reasoning",
    )
    enable_auto_tool_choice: bool = option(
        False,
        "Let the model decide to call tools (tool_choice auto); needs --tool-call-parser.",
        panel="Tools and reasoning",
    )
    reasoning_parser: str | None = option(
        None,
        "Reasoning parser plugin (deepseek_r1, qwen3, mistral, ...): reasoning goes to message.reasoning.",
        component="reasoning_parser",
        metavar="NAME",
        panel="Tools and reasoning",
    )
    exclude_tools_when_tool_choice_none: bool = option(
        False, "With tool_choice none, keep tools out of the prompt.", panel="Tools and reasoning"
    )
    enable_lora_runtime_updates: bool = option(
        False, "Load and unload adapters over HTTP and through LoRA resolvers.", panel="LoRA adapters"
    )
    lora_resolver_dir: str | None = option(
        None, "Directory whose sub-directories the filesystem resolver serves.", metavar="DIR", panel="LoRA adapters"
    )
    return_tokens_as_token_ids: bool = option(False, "Logprob tokens as 'token_id:N'.", panel="Front-ends")
    enable_force_include_usage: bool = option(False, "Usage on every streamed chunk.", panel="Front-ends")
    enable_prompt_tokens_details: bool = option(
        False,
        "Usage reports the prompt tokens read from the prefix cache (prompt_tokens_details, cache_read_input_tokens).",
        panel="Front-ends",
    )
    enable_tokenizer_info_endpoint: bool = option(
        False, "Serve GET /tokenizer_info: the tokenizer's configuration and chat template.", panel="Front-ends"
    )
    enable_store: bool = option(
        False, "Keep /v1/responses results in memory (GET, previous_response_id).", panel="Front-ends"
    )
    batch_dir: str | None = option(
        None,
        "Where batch files and jobs persist (default: batches/<served model> in the llmp cache).",
        metavar="DIR",
        panel="Operations",
    )
    max_batch_file_bytes: int = option(200 << 20, "Largest file /v1/files takes (bytes).", ge=1, panel="Operations")
    max_batch_lines: int = option(50_000, "Most request lines in one batch file.", ge=1, panel="Operations")
    grpc_port: int = option(
        50051, "Port of the grpc front-end (--frontend grpc), on --host.", ge=0, le=65535, panel="Front-ends"
    )

    def __post_init__(self) -> None:
        check_fields(self)
        for name in ("override_generation_config", "default_chat_template_kwargs"):
            value = getattr(self, name)
            if isinstance(value, str):  # JSON text from the command line, an LLMP_* variable or YAML
                object.__setattr__(self, name, json.loads(value))


def check_fields(record: Any) -> None:
    """``ValueError`` naming the field when an option field of ``record`` holds a value its
    declaration refuses: outside its ``Literal`` choices or its bounds (``ge``, ``gt``, ``le``, ``lt``),
    or one its ``check`` refuses. Commands check the values they read before building a record,
    naming the flag (``llmp.config``). A field declared ``bool``, ``int`` or ``float`` (or one of them
    or None) must hold that type: ``"false"`` is not false, nor ``"64"`` a length."""
    for f, kind, optional in _typed(type(record)):
        value = getattr(record, f.name)
        if value is None and optional:
            continue
        plain = _plain_number(value, kind)
        if plain is None:
            raise ValueError(f"{f.name} must be {_TYPE_NAMES[kind]}{' or None' if optional else ''}, got {value!r}")
        if plain is not value:  # numpy's numbers (a sweep's np.int64) as Python's
            object.__setattr__(record, f.name, plain)
    for f, choices, optional in _declared(type(record)):
        value = getattr(record, f.name)
        if value is None and optional:
            continue
        check = f.metadata.get("check")
        for item in value if check is not None and isinstance(value, tuple) else (value,):
            problem = check(item) if check is not None else None
            if problem:
                raise ValueError(f"{f.name} {problem}")
        if choices is not None:
            if value not in choices:
                raise ValueError(f"{f.name} must be {alternatives(choices)}, got {value!r}")
            continue
        scale = f.metadata.get("scale") or 1
        problem = bounds_problem(value / scale if isinstance(value, int | float) else value, f.metadata)
        if problem:
            raise ValueError(f"{f.name} {problem}, got {value!r}")


def bounds_problem(value: Any, bounds: Mapping[str, Any]) -> str | None:
    """``"must be >= 1"`` (or between, or ...) when ``value`` breaks the ``ge``/``gt``/``le``/``lt``
    of ``bounds`` (an option's metadata, in the option's units); ``None`` when it keeps them."""
    ge, gt, le, lt = (bounds.get(k) for k in ("ge", "gt", "le", "lt"))
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    kept = (
        (ge is None or value >= ge)
        and (gt is None or value > gt)
        and (le is None or value <= le)
        and (lt is None or value < lt)
    )
    if kept:
        return None
    if ge is not None and le is not None:
        return f"must be between {_number(ge)} and {_number(le)}"
    parts = [
        f"{sign} {_number(bound)}"
        for sign, bound in ((">=", ge), (">", gt), ("<=", le), ("<", lt))
        if bound is not None
    ]
    return "must be " + " and ".join(parts)


def alternatives(choices: tuple[Any, ...]) -> str:
    """``"a, b or c"``."""
    names = [str(c) for c in choices]
    return f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else names[0]


def _number(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


_DECLARED: dict[type, list[tuple[Any, tuple[Any, ...] | None, bool]]] = {}
_TYPED: dict[type, list[tuple[Any, type, bool]]] = {}
_TYPE_NAMES = {bool: "true or false", int: "an integer", float: "a number"}


def _plain_number(value: Any, kind: type) -> Any:
    """``value`` as a Python ``kind`` (bool, int or float) when it is one, numpy's included; else None."""
    is_bool = isinstance(value, bool) or getattr(getattr(value, "dtype", None), "kind", None) == "b"
    if kind is bool:
        return bool(value) if is_bool else None
    if is_bool or not isinstance(value, numbers.Integral if kind is int else numbers.Real):
        return None
    plain = kind(value)
    return value if type(value) is kind or (kind is float and type(value) is int) else plain


def _typed(cls: type) -> list[tuple[Any, type, bool]]:
    """The fields of ``cls`` declared ``bool``, ``int`` or ``float`` (or one of them or None): each
    with its type and whether it may be None."""
    if cls not in _TYPED:
        hints = typing.get_type_hints(cls)
        typed = []
        for f in fields(cls):
            args = [a for a in typing.get_args(hints[f.name]) if a is not type(None)] or [hints[f.name]]
            if len(args) == 1 and args[0] in _TYPE_NAMES:
                typed.append((f, args[0], type(None) in typing.get_args(hints[f.name])))
        _TYPED[cls] = typed
    return _TYPED[cls]


def _declared(cls: type) -> list[tuple[Any, tuple[Any, ...] | None, bool]]:
    """The option fields of ``cls`` that declare choices or bounds: each with its choices (None: bounds)
    and whether it may be None."""
    if cls not in _DECLARED:
        hints = typing.get_type_hints(cls)
        declared = []
        for f in fields(cls):
            hint = hints[f.name]
            optional = type(None) in typing.get_args(hint)
            if typing.get_origin(hint) is Literal:
                declared.append((f, typing.get_args(hint), optional))
            elif any(f.metadata.get(k) is not None for k in ("ge", "gt", "le", "lt", "check")):
                declared.append((f, None, optional))
        _DECLARED[cls] = declared
    return _DECLARED[cls]
