"""Tool-call parsers for code-style formats: ``--tool-call-parser pythonic`` and ``--tool-call-parser qwen3_xml``."""

from llmp.api import require_api

require_api(">=0.5,<0.6")  # first, before any other llmp import (docs/plugins.md, "API versioning")

from collections.abc import Iterator

from llmp import hookimpl
from llmp.api import ToolParserSpec


@hookimpl
def llmp_register_tool_parsers() -> Iterator[ToolParserSpec]:
    yield ToolParserSpec(
        name="pythonic",
        impl="llmp_parsers_tools_code.pythonic:PythonicToolParser",
        description="a Python list of calls with literal keyword arguments, "
        "[get_weather(city='Paris'), ...] (Llama 3.2, Llama 4, ToolACE and others)",
    )
    yield ToolParserSpec(
        name="qwen3_xml",
        impl="llmp_parsers_tools_code.qwen3_xml:Qwen3XMLToolParser",
        description="Qwen3-Coder XML calls, <tool_call><function=NAME><parameter=P>VALUE</parameter>...; "
        "values converted with the request's tool schema",
    )
