"""Shared by the reasoning-parser tests: tokenizers, chat templates and the whole-vs-streamed check."""

from __future__ import annotations

from typing import Any

from llmp.api import ReasoningParse
from llmp.parsing import MessageStream
from llmp.testing import assert_streams_agree

# Turn delimiters of the templates below, special tokens as in the real tokenizers.
TURN_TOKENS = ["<|im_start|>", "<|im_end|>", "<｜User｜>", "<｜Assistant｜>", "[INST]", "[/INST]"]

# DeepSeek-R1's template, cut down: earlier answers lose their reasoning; the prompt opens <think>.
R1_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] == 'user' %}<｜User｜>{{ m['content'] }}"
    "{% elif m['role'] == 'assistant' %}<｜Assistant｜>{{ m['content'].split('</think>')[-1] }}{{ eos_token }}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<｜Assistant｜><think>\n{% endif %}"
)

# Qwen3's template, cut down: an assistant turn keeps its reasoning_content as a closed think
# block; enable_thinking=False closes an empty one in the prompt.
QWEN3_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] == 'assistant' and m.reasoning_content is defined and m.reasoning_content %}"
    "<think>\n{{ m['reasoning_content'] }}\n</think>\n\n{% endif %}"
    "{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}"
    "{% endif %}"
)

# Qwen3-2507 thinking models: the same, but the prompt opens <think>.
QWEN3_THINKING_TEMPLATE = QWEN3_TEMPLATE.replace(
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}",
    "<think>\n",
)

# Magistral-like: [INST] turns, assistant turns keep their [THINK] block.
MAGISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] == 'user' %}[INST]{{ m['content'] }}[/INST]"
    "{% else %}{% if m.reasoning_content is defined and m.reasoning_content %}"
    "[THINK]{{ m['reasoning_content'] }}[/THINK]{% endif %}"
    "{{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}"
    "{% if open_thinking is defined and open_thinking %}[THINK]{% endif %}"
)


def make_tokenizer(marker_tokens: bool) -> Any:
    """The tiny test tokenizer with the templates' turn delimiters as special tokens; with
    ``marker_tokens`` the markers are one token each (``<think>``/``</think>`` plain added
    tokens as in Qwen3 and DeepSeek-R1, ``[THINK]``/``[/THINK]`` special as in Magistral),
    otherwise each marker is several byte-level BPE tokens."""
    from llmp.testing import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    tokenizer.add_tokens(TURN_TOKENS, special_tokens=True)
    if marker_tokens:
        tokenizer.add_tokens(["<think>", "</think>"], special_tokens=False)
        tokenizer.add_tokens(["[THINK]", "[/THINK]"], special_tokens=True)
    return tokenizer


def prompt_ids(tokenizer: Any, template: str, messages: list[dict[str, Any]], **kwargs: Any) -> list[int]:
    """The prompt's token ids as the server makes them: render the template, then encode the text."""
    from llmp.frontend import render_chat

    continue_final = kwargs.pop("continue_final_message", False)
    text = render_chat(
        tokenizer, messages, chat_template=template, continue_final_message=continue_final, chat_template_kwargs=kwargs
    )
    return tokenizer.encode(text, add_special_tokens=False)


def check(parser: Any, text: str, in_reasoning: bool | None, reasoning: str | None, content: str) -> None:
    """The whole parse is exactly (reasoning, content), and every way of streaming it adds up to it."""
    assert parser.parse(text, final=True, in_reasoning=in_reasoning) == ReasoningParse(reasoning, content)
    if not text:  # assert_streams_agree streams an empty text as no pieces at all, so compares nothing
        message = MessageStream(parser, in_reasoning=in_reasoning)
        message.feed("", final=True)
        assert (message.sent.reasoning, message.sent.content) == (reasoning, content)
        return
    message = assert_streams_agree(text, reasoning_parser=parser, in_reasoning=in_reasoning)
    assert (message.reasoning, message.content) == (reasoning, content)


def stream_chunks(parser: Any, chunks: list[str], in_reasoning: bool | None = None) -> list[tuple[str, str]]:
    """(reasoning, content) deltas of a stream that receives ``chunks`` one after another."""
    stream = MessageStream(parser, in_reasoning=in_reasoning)
    text, deltas = "", []
    for k, chunk in enumerate(chunks):
        text += chunk
        delta = stream.feed(text, final=k == len(chunks) - 1)
        deltas.append((delta.reasoning, delta.content))
    return deltas
