"""Qwen3: ``<think>`` reasoning ``</think>`` answer.

* Qwen3 (hybrid) models write ``<think>`` themselves: the completion is reasoning only if it
  begins with ``<think>`` (after optional whitespace); otherwise it is all answer, verbatim.
  While streaming, a beginning too short to tell (only whitespace, or a start of ``<think>``
  such as ``<th``) is held back: nothing is reported until it is decided.
* Qwen3-2507 thinking templates end the prompt with ``<think>\\n``: ``prompt_state`` says
  ``True`` and the completion is reasoning until ``</think>`` (all of it without one).
* ``enable_thinking=False`` puts ``<think>\\n\\n</think>\\n\\n`` in the prompt: ``prompt_state``
  says ``False`` and the server takes the completion as answer without parsing it.

Unlike vLLM's ``qwen3`` parser (which assumes reasoning whenever the request does not turn
thinking off, because its Qwen3.5 templates open ``<think>`` in the prompt), a completion
without ``<think>`` on a prompt that did not open one is answer here; it does not treat a
``<tool_call>`` inside the reasoning as its end.
"""

from __future__ import annotations

from llmp_parsers_reasoning.base import ThinkingReasoningParser


class Qwen3ReasoningParser(ThinkingReasoningParser):
    start_marker = "<think>"
    end_marker = "</think>"
    opening = "leading"
