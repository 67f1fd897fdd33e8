"""DeepSeek-R1: ``<think>`` reasoning ``</think>`` answer.

R1's chat template ends the prompt with ``<think>\\n``, so a completion normally has no start
marker: it is reasoning until ``</think>``, and a completion with no ``</think>`` at all (cut off
by ``max_tokens``) is all reasoning. A ``<think>`` the model writes at the very beginning (after
optional whitespace) is skipped. This is the parser's reading even when the prompt says nothing
(``in_reasoning=None``), as vLLM's ``deepseek_r1`` parser does; only a prompt that closed the
reasoning (``prompt_state`` ``False``) makes the completion all answer.
"""

from __future__ import annotations

from llmp_parsers_reasoning.base import ThinkingReasoningParser


class DeepSeekR1ReasoningParser(ThinkingReasoningParser):
    start_marker = "<think>"
    end_marker = "</think>"
    opening = "assumed"
