"""Rendering a conversation with a chat template: shared by ``LLM.chat`` and the front-ends."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

Conversation = Sequence[Mapping[str, Any]]

# keys transformers' apply_chat_template takes itself: a request's template kwargs must not override them
RESERVED_TEMPLATE_KWARGS = frozenset(
    {
        "conversation",
        "messages",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
)


def render_chat(
    tokenizer: Any,
    conversation: Conversation,
    *,
    chat_template: str | None = None,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    tools: list[dict[str, Any]] | None = None,
    documents: list[dict[str, Any]] | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    model_name: str = "the model",
) -> str:
    """The prompt text of a conversation.

    ``documents`` (retrieval-augmented templates' sources) reach the template as transformers
    passes them. Transformers renders the template in a sandboxed Jinja environment; the
    keyword arguments it reserves for itself cannot be overridden through
    ``chat_template_kwargs`` (``tokenize=True`` would return ids, not text).
    """
    if chat_template is None and not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"{model_name} has no chat template; pass a chat template")
    extra = {k: v for k, v in (chat_template_kwargs or {}).items() if k not in RESERVED_TEMPLATE_KWARGS}
    return tokenizer.apply_chat_template(
        [dict(m) for m in conversation],
        chat_template=chat_template,
        tools=tools,
        documents=documents,
        tokenize=False,
        add_generation_prompt=add_generation_prompt and not continue_final_message,
        continue_final_message=continue_final_message,
        **extra,
    )


def template_variables(tokenizer: Any, chat_template: str | None = None) -> frozenset[str]:
    """The variables a chat template reads from its context (``enable_thinking`` ...), less the reserved ones:
    the ``chat_template_kwargs`` a request may set."""
    return read_variables(tokenizer, chat_template) - RESERVED_TEMPLATE_KWARGS


def read_variables(tokenizer: Any, chat_template: str | None = None) -> frozenset[str]:
    """Every variable a chat template (``chat_template``, else the tokenizer's, any of its named
    templates) reads from its context, the reserved ones (``messages``, ``tools`` ...) included:
    ``"tools" in read_variables(...)`` tells whether tool definitions reach the model."""
    template = chat_template if chat_template is not None else getattr(tokenizer, "chat_template", None)
    sources = list(template.values()) if isinstance(template, Mapping) else [template] if template else []
    return frozenset().union(*(_variables(source) for source in sources))


@lru_cache(maxsize=32)
def _variables(source: str) -> frozenset[str]:
    from jinja2 import meta
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    try:
        return frozenset(meta.find_undeclared_variables(ImmutableSandboxedEnvironment().parse(source)))
    except Exception:  # a template jinja cannot parse fails when rendered, with its own message
        return frozenset()
