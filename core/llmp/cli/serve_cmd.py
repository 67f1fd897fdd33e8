"""``llmp serve [MODEL]``: the engine behind one HTTP server, with front-end plugins mounted on it.

Kept light at import time: the server, the engine and torch load only when
the command runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from pydantic import field_validator
from pydantic_settings import NoDecode

from llmp.cli import ConfigOption
from llmp.config import CommandSettings, load_settings

ListOfStr = Annotated[list[str], NoDecode]  # LLMP_API_KEY=a,b rather than JSON


class ServeSettings(CommandSettings):
    model: str | None = None
    frontend: ListOfStr = ["openai"]
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: ListOfStr = []
    served_model_name: ListOfStr = []
    # the engine
    executor: str = "uniproc"
    tensor_parallel_size: int = 1
    ray_address: str | None = None
    dtype: str = "auto"
    max_model_len: int | None = None
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    kv_cache_memory_gib: float = 4.0
    block_size: int = 16
    kernels: str | None = None
    model_impl: str = "auto"
    task: str = "auto"
    num_threads: int | None = None
    seed: int = 0
    # requests
    chat_template: str | None = None
    trust_request_chat_template: bool = False
    response_role: str = "assistant"
    generation_config: str = "auto"
    max_logprobs: int = 20
    max_n: int = 128
    max_stop_sequences: int = 64
    tool_call_parser: str | None = None
    enable_auto_tool_choice: bool = False
    reasoning_parser: str | None = None
    exclude_tools_when_tool_choice_none: bool = False
    return_tokens_as_token_ids: bool = False
    enable_force_include_usage: bool = False
    enable_store: bool = False
    # HTTP
    allowed_origins: ListOfStr = []
    allow_credentials: bool = False
    root_path: str = ""
    max_request_body_bytes: int = 2 << 20
    max_queue_len: int | None = 1024
    overload_status: int = 503
    request_timeout: float | None = None
    health_check_timeout: float = 5.0
    header_timeout: float = 10.0
    allowed_hosts: ListOfStr = []
    grpc_port: int = 50051
    disable_fastapi_docs: bool = False
    shutdown_timeout: float = 10.0
    log_level: str = "info"
    disable_access_log: bool = False

    @field_validator("frontend", "api_key", "served_model_name", "allowed_origins", "allowed_hosts", mode="before")
    @classmethod
    def _split(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("overload_status")
    @classmethod
    def _overload_status(cls, value: int) -> int:
        if value not in (429, 503):
            raise ValueError("must be 503 (the default) or 429")
        return value

    @field_validator(
        "request_timeout",
        "health_check_timeout",
        "header_timeout",
        "shutdown_timeout",
        "max_queue_len",
        "max_request_body_bytes",
        "max_stop_sequences",
    )
    @classmethod
    def _not_negative(cls, value: float | None) -> float | None:
        if value is not None and value < 0:
            raise ValueError("must not be negative")
        return value


def serve(
    ctx: typer.Context,
    model: str | None = typer.Argument(
        None, help="Model directory, .gguf file or Hugging Face id in the local cache; default SmolLM2-135M-Instruct."
    ),
    frontend: list[str] | None = typer.Option(
        None, "--frontend", help="Front-end plugin to mount (repeatable; default openai)."
    ),
    host: str = typer.Option("127.0.0.1", help="Address to bind; 0.0.0.0 for every interface."),
    port: int = typer.Option(8000, help="Port to bind."),
    api_key: list[str] | None = typer.Option(
        None, "--api-key", help="Require 'Authorization: Bearer KEY' on every inference route (repeatable)."
    ),
    served_model_name: list[str] | None = typer.Option(
        None, "--served-model-name", help="Public model name(s); the first is echoed in responses."
    ),
    executor: str = typer.Option("uniproc", help="Executor plugin: uniproc, mp or ray."),
    tensor_parallel_size: int = typer.Option(1, "--tensor-parallel-size", "-tp", help="Tensor-parallel workers."),
    ray_address: str | None = typer.Option(None, help="Ray cluster for --executor ray (default: RAY_ADDRESS)."),
    dtype: str = typer.Option("auto", help="auto, bfloat16, float16 or float32."),
    max_model_len: int | None = typer.Option(
        None, help="Context length (default: the model's, capped by the KV cache)."
    ),
    max_num_seqs: int = typer.Option(256, help="Most sequences in one step."),
    max_num_batched_tokens: int = typer.Option(2048, help="Most tokens in one step."),
    enable_prefix_caching: bool = typer.Option(True, "--enable-prefix-caching/--no-enable-prefix-caching"),
    enable_chunked_prefill: bool = typer.Option(True, "--enable-chunked-prefill/--no-enable-chunked-prefill"),
    kv_cache_memory_gib: float = typer.Option(4.0, help="Memory for the KV cache, in GiB."),
    block_size: int = typer.Option(16, help="Tokens per KV-cache block."),
    kernels: str | None = typer.Option(None, help="Kernel set (default: the best for the device)."),
    model_impl: str = typer.Option(
        "auto", help="auto (native when a plugin provides the architecture, else transformers), native or transformers."
    ),
    task: str = typer.Option(
        "auto", help="auto, generate or embed (serve a causal LM's pooled hidden states on /v1/embeddings)."
    ),
    num_threads: int | None = typer.Option(None, help="Torch threads of the engine (default: all cores)."),
    seed: int = typer.Option(0, help="Engine seed for requests without one."),
    chat_template: str | None = typer.Option(None, help="Chat template: a file path or the template text."),
    trust_request_chat_template: bool = typer.Option(
        False, "--trust-request-chat-template", help="Allow a request's own chat_template (off: 400)."
    ),
    response_role: str = typer.Option("assistant", help="Role of generated chat messages."),
    generation_config: str = typer.Option(
        "auto", help="auto: sampling defaults from the model's generation_config.json; none: llmp's defaults."
    ),
    max_logprobs: int = typer.Option(20, help="Cap on logprobs, top_logprobs and prompt_logprobs."),
    max_n: int = typer.Option(128, help="Cap on n (choices per request)."),
    max_stop_sequences: int = typer.Option(64, help="Cap on the number of stop strings in a request."),
    tool_call_parser: str | None = typer.Option(
        None,
        help="Tool-call parser plugin (hermes, llama3_json, mistral, pythonic, qwen3_xml, deepseek_v3, ...): "
        "needed for tool_choice auto, required or named.",
    ),
    enable_auto_tool_choice: bool = typer.Option(
        False,
        "--enable-auto-tool-choice",
        help="Let the model decide to call tools (tool_choice auto); needs --tool-call-parser.",
    ),
    reasoning_parser: str | None = typer.Option(
        None, help="Reasoning parser plugin (deepseek_r1, qwen3, mistral, ...): reasoning goes to message.reasoning."
    ),
    exclude_tools_when_tool_choice_none: bool = typer.Option(
        False, "--exclude-tools-when-tool-choice-none", help="With tool_choice none, keep tools out of the prompt."
    ),
    return_tokens_as_token_ids: bool = typer.Option(
        False, "--return-tokens-as-token-ids", help="Logprob tokens as 'token_id:N'."
    ),
    enable_force_include_usage: bool = typer.Option(
        False, "--enable-force-include-usage", help="Usage on every streamed chunk."
    ),
    enable_store: bool = typer.Option(
        False, "--enable-store", help="Keep /v1/responses results in memory (GET, previous_response_id)."
    ),
    allowed_origins: list[str] | None = typer.Option(
        None, "--allowed-origins", help="CORS origin allowed to call the API (repeatable; default none)."
    ),
    allow_credentials: bool = typer.Option(False, "--allow-credentials", help="CORS: allow credentials."),
    root_path: str = typer.Option("", help="Path prefix when behind a path-routing proxy."),
    max_request_body_bytes: int = typer.Option(2 << 20, help="Larger request bodies get 413."),
    max_queue_len: int | None = typer.Option(
        1024, help="Model requests that may wait beyond --max-num-seqs running ones; more are refused at once."
    ),
    overload_status: int = typer.Option(503, help="Status of a refusal at capacity: 503 (Retry-After) or 429."),
    request_timeout: float | None = typer.Option(
        None, help="Seconds a request may wait and run before it is aborted (408); default: no limit."
    ),
    health_check_timeout: float = typer.Option(
        5.0, help="/ready and /health fail if the engine does not answer a ping within this many seconds."
    ),
    header_timeout: float = typer.Option(
        10.0, help="Seconds a connection has to send a request's headers (against slowloris); 0: no limit."
    ),
    allowed_hosts: list[str] | None = typer.Option(
        None,
        "--allowed-hosts",
        help="Host header names accepted (repeatable); default: loopback names when "
        "bound to loopback (against DNS rebinding), else any.",
    ),
    grpc_port: int = typer.Option(50051, help="Port of the grpc front-end (--frontend grpc), on --host."),
    disable_fastapi_docs: bool = typer.Option(False, "--disable-fastapi-docs", help="No /docs, /redoc, /openapi.json."),
    shutdown_timeout: float = typer.Option(
        10.0, help="Seconds in-flight requests get to finish on SIGTERM before they are aborted (0: at once)."
    ),
    log_level: str = typer.Option("info", help="debug, info, warning or error."),
    disable_access_log: bool = typer.Option(False, "--disable-access-log", help="No per-request log lines."),
    config: Path | None = ConfigOption,
) -> None:
    """Serve a model over HTTP: OpenAI-compatible by default (chat, completions, embeddings, responses)."""
    settings = load_settings(ServeSettings, ctx)
    from llmp.server.launch import run

    raise typer.Exit(run(settings))
