"""The plugin registers its four parsers lazily, and each satisfies the ToolParser contract."""

from __future__ import annotations

import subprocess
import sys

import pytest

from llmp import registry
from llmp.api import ToolCallParse

PARSERS = {
    "hermes": "llmp_parsers_tools.hermes:HermesToolParser",
    "llama3_json": "llmp_parsers_tools.llama:Llama3JsonToolParser",
    "mistral": "llmp_parsers_tools.mistral:MistralToolParser",
    "deepseek_v3": "llmp_parsers_tools.deepseek:DeepSeekV3ToolParser",
}


@pytest.mark.parametrize("name", PARSERS)
def test_registered_and_loadable(name: str) -> None:
    spec = registry.get_component("tool_parser", name)
    assert spec.distribution == "llmp-parsers-tools" and spec.impl == PARSERS[name] and spec.description
    cls = registry.load_component("tool_parser", name)
    module, _, attribute = PARSERS[name].partition(":")
    assert cls.__module__ == module and cls.__name__ == attribute
    assert cls.keep_special_tokens is True
    parser = cls(None)
    result = parser.parse("plain text", final=True, tools=())
    assert isinstance(result, ToolCallParse) and result.content == "plain text" and result.calls == []


def test_registering_imports_no_parser_module() -> None:
    code = (
        "import sys, llmp_parsers_tools as p\n"
        "specs = list(p.llmp_register_tool_parsers())\n"
        "assert [s.name for s in specs] == ['hermes', 'llama3_json', 'mistral', 'deepseek_v3'], specs\n"
        "loaded = [m for m in sys.modules if m.startswith('llmp_parsers_tools.')]\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=60)
