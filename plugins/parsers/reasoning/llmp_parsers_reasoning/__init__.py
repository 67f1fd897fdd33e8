"""Reasoning parsers: ``llmp serve --reasoning-parser deepseek_r1|qwen3|mistral``.

Registering imports nothing but ``llmp.api``; a parser's module is imported when it is selected.
"""

from llmp.api import require_api

require_api(">=0.5,<0.6")  # first, before any other llmp import (docs/plugins.md, "API versioning")

from collections.abc import Iterator

from llmp import hookimpl
from llmp.api import ReasoningParserSpec


@hookimpl
def llmp_register_reasoning_parsers() -> Iterator[ReasoningParserSpec]:
    yield ReasoningParserSpec(
        name="deepseek_r1",
        impl="llmp_parsers_reasoning.deepseek_r1:DeepSeekR1ReasoningParser",
        description="DeepSeek-R1: <think>...</think>; the completion is reasoning until </think> "
        "(the template opens <think> in the prompt)",
    )
    yield ReasoningParserSpec(
        name="qwen3",
        impl="llmp_parsers_reasoning.qwen3:Qwen3ReasoningParser",
        description="Qwen3: <think>...</think>, opened by the model or (2507 thinking templates) the prompt; "
        "enable_thinking=False prompts are all answer",
    )
    yield ReasoningParserSpec(
        name="mistral",
        impl="llmp_parsers_reasoning.mistral:MistralReasoningParser",
        description="Magistral: [THINK]...[/THINK]; without [THINK] the completion is all answer",
    )
