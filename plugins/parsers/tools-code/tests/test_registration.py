"""The distribution registers both parsers through its entry point, and they meet the contract's shape."""

from __future__ import annotations

import pytest
from llmp_parsers_tools_code.pythonic import PythonicToolParser
from llmp_parsers_tools_code.qwen3_xml import Qwen3XMLToolParser

from llmp import registry
from llmp.api import ToolCallParse


@pytest.mark.parametrize(("name", "cls"), [("pythonic", PythonicToolParser), ("qwen3_xml", Qwen3XMLToolParser)])
def test_load_component(name: str, cls: type) -> None:
    assert registry.load_component("tool_parser", name) is cls
    spec = registry.get_component("tool_parser", name)
    assert spec.distribution == "llmp-parsers-tools-code" and spec.description
    parser = cls(None)
    assert parser.keep_special_tokens is False
    assert isinstance(parser.parse("hello", final=True), ToolCallParse)
