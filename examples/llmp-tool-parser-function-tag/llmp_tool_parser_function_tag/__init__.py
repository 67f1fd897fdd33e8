"""llmp-tool-parser-function-tag: a tool-call parser for llmp, ``llmp serve --tool-call-parser function_tag``.

This module is the plugin's entry point: llmp imports it to collect the registration below,
so it imports nothing but llmp's API; the parser's module is imported when it is selected.
"""

from llmp.api import require_api

require_api(">=0.5,<0.6")  # first, before any other llmp import: an incompatible llmp says so

from collections.abc import Iterator

from llmp import hookimpl
from llmp.api import ToolParserSpec


@hookimpl
def llmp_register_tool_parsers() -> Iterator[ToolParserSpec]:
    yield ToolParserSpec(
        name="function_tag",
        impl="llmp_tool_parser_function_tag.parser:FunctionTagToolParser",
        description="<function=NAME>{arguments}</function> blocks (Llama 3.1 and 3.2 custom tools)",
    )
