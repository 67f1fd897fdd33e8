"""Magistral (Mistral's reasoning models): ``[THINK]`` reasoning ``[/THINK]`` answer.

Magistral writes ``[THINK]`` itself, so a completion without ``[THINK]`` is all answer. As in
vLLM's ``mistral`` parser, text before ``[THINK]`` (which a well-trained model does not write)
is answer and is joined with the answer after ``[/THINK]``, a ``[THINK]`` with no ``[/THINK]``
makes the rest reasoning, and a ``[/THINK]`` before any ``[THINK]`` is dropped from the answer.
(vLLM keeps such a stray ``[/THINK]`` when a ``[THINK]`` follows later; a stream cannot know
that in advance, so it is always dropped here.) While streaming, an answer tail that could be
the start of ``[THINK]`` or ``[/THINK]`` is held back.

``[THINK]`` and ``[/THINK]`` are special (control) tokens of Magistral's tokenizer, hence
``keep_special_tokens``: the text must be detokenized with special tokens kept.
A prompt that ends inside ``[THINK]`` (``prompt_state`` ``True``) makes the completion
reasoning until ``[/THINK]``.
"""

from __future__ import annotations

from llmp_parsers_reasoning.base import ThinkingReasoningParser


class MistralReasoningParser(ThinkingReasoningParser):
    start_marker = "[THINK]"
    end_marker = "[/THINK]"
    opening = "anywhere"
    drop_stray_end = True
    keep_special_tokens = True
