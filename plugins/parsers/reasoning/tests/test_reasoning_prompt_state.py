"""prompt_state on prompts rendered by chat templates, and end_token_ids, with markers of one token
(found by id) and of several tokens (found in the decoded prompt)."""

from __future__ import annotations

import pytest
from llmp_parsers_reasoning.deepseek_r1 import DeepSeekR1ReasoningParser
from llmp_parsers_reasoning.mistral import MistralReasoningParser
from llmp_parsers_reasoning.qwen3 import Qwen3ReasoningParser
from reasoning_parsers_support import (
    MAGISTRAL_TEMPLATE,
    QWEN3_TEMPLATE,
    QWEN3_THINKING_TEMPLATE,
    R1_TEMPLATE,
    prompt_ids,
)

QUESTION = [{"role": "user", "content": "What is 6 * 7?"}]
# an earlier assistant turn that holds a closed think block, then a new question
CONVERSATION = [
    {"role": "user", "content": "What is 6 * 7?"},
    {"role": "assistant", "reasoning_content": "6 * 7 = 42.", "content": "42."},
    {"role": "user", "content": "And 6 * 8?"},
]
R1_CONVERSATION = [
    {"role": "user", "content": "What is 6 * 7?"},
    {"role": "assistant", "content": "<think>\n6 * 7 = 42.\n</think>\n\n42."},
    {"role": "user", "content": "And 6 * 8?"},
]


@pytest.mark.parametrize("parser_class", [DeepSeekR1ReasoningParser, Qwen3ReasoningParser, MistralReasoningParser])
def test_end_token_ids_match_the_tokenizer(tokenizer, parser_class) -> None:
    parser = parser_class(tokenizer)
    expected = tokenizer.encode(parser_class.end_marker, add_special_tokens=False)
    assert list(parser.end_token_ids) == expected
    assert tokenizer.decode(list(parser.end_token_ids)) == parser_class.end_marker


def test_end_token_ids_one_or_several_tokens(marker_tokenizer, split_tokenizer) -> None:
    end_id = marker_tokenizer.convert_tokens_to_ids("</think>")
    assert list(Qwen3ReasoningParser(marker_tokenizer).end_token_ids) == [end_id]
    assert len(Qwen3ReasoningParser(split_tokenizer).end_token_ids) > 1
    assert list(MistralReasoningParser(marker_tokenizer).end_token_ids) == [
        marker_tokenizer.convert_tokens_to_ids("[/THINK]")
    ]
    assert len(MistralReasoningParser(split_tokenizer).end_token_ids) > 1


def test_without_tokenizer() -> None:
    parser = Qwen3ReasoningParser(None)
    assert list(parser.end_token_ids) == []
    assert parser.prompt_state([1, 2, 3]) is None


def test_r1_template_opens_the_reasoning(tokenizer) -> None:
    parser = DeepSeekR1ReasoningParser(tokenizer)
    ids = prompt_ids(tokenizer, R1_TEMPLATE, QUESTION)
    assert tokenizer.decode(ids).endswith("<｜Assistant｜><think>\n")
    assert parser.prompt_state(ids) is True
    assert parser.prompt_state(prompt_ids(tokenizer, R1_TEMPLATE, R1_CONVERSATION)) is True


def test_qwen3_templates(tokenizer) -> None:
    parser = Qwen3ReasoningParser(tokenizer)
    # hybrid Qwen3, thinking on: the model writes <think> itself
    assert parser.prompt_state(prompt_ids(tokenizer, QWEN3_TEMPLATE, QUESTION)) is None
    # enable_thinking=False: "<think>\n\n</think>\n\n" closes it in the prompt
    closed = prompt_ids(tokenizer, QWEN3_TEMPLATE, QUESTION, enable_thinking=False)
    assert tokenizer.decode(closed).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert parser.prompt_state(closed) is False
    # Qwen3-2507 thinking: "<think>\n" opens it
    assert parser.prompt_state(prompt_ids(tokenizer, QWEN3_THINKING_TEMPLATE, QUESTION)) is True


def test_an_earlier_turns_closed_think_block_says_nothing_about_this_turn(tokenizer) -> None:
    parser = Qwen3ReasoningParser(tokenizer)
    plain = prompt_ids(tokenizer, QWEN3_TEMPLATE, CONVERSATION)
    assert "<think>\n6 * 7 = 42.\n</think>" in tokenizer.decode(plain)
    assert parser.prompt_state(plain) is None
    assert parser.prompt_state(prompt_ids(tokenizer, QWEN3_TEMPLATE, CONVERSATION, enable_thinking=False)) is False
    assert parser.prompt_state(prompt_ids(tokenizer, QWEN3_THINKING_TEMPLATE, CONVERSATION)) is True


def test_continuing_an_answer_after_the_reasoning(tokenizer) -> None:
    parser = Qwen3ReasoningParser(tokenizer)
    messages = [*QUESTION, {"role": "assistant", "reasoning_content": "Easy.", "content": "The answer is"}]
    ids = prompt_ids(tokenizer, QWEN3_TEMPLATE, messages, continue_final_message=True)
    assert tokenizer.decode(ids).endswith("</think>\n\nThe answer is")
    assert parser.prompt_state(ids) is False
    # continuing inside the reasoning
    ids = tokenizer.encode("<|im_start|>assistant\n<think>\nLet me", add_special_tokens=False)
    assert parser.prompt_state(ids) is True


def test_magistral_template(tokenizer) -> None:
    parser = MistralReasoningParser(tokenizer)
    assert parser.prompt_state(prompt_ids(tokenizer, MAGISTRAL_TEMPLATE, QUESTION)) is None
    assert parser.prompt_state(prompt_ids(tokenizer, MAGISTRAL_TEMPLATE, CONVERSATION)) is None
    assert parser.prompt_state(prompt_ids(tokenizer, MAGISTRAL_TEMPLATE, CONVERSATION, open_thinking=True)) is True


def test_no_markers(tokenizer) -> None:
    ids = tokenizer.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    for parser_class in (DeepSeekR1ReasoningParser, Qwen3ReasoningParser, MistralReasoningParser):
        assert parser_class(tokenizer).prompt_state(ids) is None
    assert Qwen3ReasoningParser(tokenizer).prompt_state([]) is None
