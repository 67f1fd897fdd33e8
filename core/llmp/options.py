"""Typed option records: each option's default and help text are written here, once.

A field declared with :func:`option` is a command-line option: ``llmp serve`` (and
every command built from these records) generates ``--flag-name`` from the field
name, reads ``LLMP_<FIELD>`` and the ``--config`` YAML key of the same name, and
shows the help text. A field without ``help`` is filled in at run time and is not
an option.

This module is the ground floor: it imports nothing from llmp and no CLI library.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field
from typing import Any


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

    ``help`` is the ``--help`` text; ``flag`` overrides the generated ``--field-name``;
    ``short`` adds a short alias (``-tp``); further keywords are kept as metadata
    for the command generator (for example ``cli=False`` to keep a field off the CLI).
    """
    meta = {"help": help, "flag": flag, "short": short, **metadata}
    if factory is not MISSING:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


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
    task: str = "generate"  # generate | embed
    host: str = "127.0.0.1"  # the HTTP server's address: front-ends with their own port listen there too
    api_keys: tuple[str, ...] = ()  # the server's --api-key values: front-ends with their own port check them
    max_request_body_bytes: int = 2 << 20
    # request handling (llmp serve options)
    chat_template: str | None = option(None, "Chat template: a file path or the template text.")
    trust_request_chat_template: bool = option(False, "Allow a request's own chat_template (off: 400).")
    response_role: str = option("assistant", "Role of generated chat messages.")
    generation_config: str = option(
        "auto", "auto: sampling defaults from the model's generation_config.json; none: llmp's defaults."
    )
    max_logprobs: int = option(20, "Cap on logprobs, top_logprobs and prompt_logprobs.")
    max_n: int = option(128, "Cap on n (choices per request).")
    max_stop_sequences: int = option(64, "Cap on the number of stop strings in a request.")
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
