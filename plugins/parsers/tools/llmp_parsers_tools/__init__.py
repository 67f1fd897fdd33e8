"""Tool-call parsers for JSON-based formats: ``--tool-call-parser hermes``, ``llama3_json``, ``mistral``
and ``deepseek_v3``."""

from llmp.api import require_api

require_api(">=0.5,<0.6")  # first, before any other llmp import (docs/plugins.md, "API versioning")

from collections.abc import Iterator

from llmp import hookimpl
from llmp.api import ToolParserSpec


@hookimpl
def llmp_register_tool_parsers() -> Iterator[ToolParserSpec]:
    yield ToolParserSpec(
        name="hermes",
        impl="llmp_parsers_tools.hermes:HermesToolParser",
        description='<tool_call>{"name": ..., "arguments": {...}}</tool_call> blocks '
        "(Hermes 2 Pro, Qwen2.5, Qwen3 and others)",
    )
    yield ToolParserSpec(
        name="llama3_json",
        impl="llmp_parsers_tools.llama:Llama3JsonToolParser",
        description='[<|python_tag|>]{"name": ..., "parameters": {...}}; ... (Llama 3.1, 3.2)',
    )
    yield ToolParserSpec(
        name="mistral",
        impl="llmp_parsers_tools.mistral:MistralToolParser",
        description='[TOOL_CALLS][{"name": ..., "arguments": {...}}] (before tokenizer v11) and '
        "[TOOL_CALLS]name[ARGS]{...} (v11 and later)",
    )
    yield ToolParserSpec(
        name="deepseek_v3",
        impl="llmp_parsers_tools.deepseek:DeepSeekV3ToolParser",
        description="<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME ```json {...}``` "
        "<｜tool▁call▁end｜>... (DeepSeek-V3, R1-0528)",
    )
