"""Rendering a conversation with a chat template: shared by ``LLM.chat`` and the front-ends."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import Any, Literal

Conversation = Sequence[Mapping[str, Any]]
# how a message's content reaches the template (vLLM's --chat-template-content-format): "string" is its
# text, "openai" a list of {"type": "text", "text": ...} parts, "auto" whichever the template iterates
ContentFormat = Literal["auto", "string", "openai"]
TEXT_PART_TYPES = frozenset({"text", "input_text", "output_text"})  # Responses' input/output parts are text too

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
    content_format: ContentFormat = "auto",
    model_name: str = "the model",
) -> str:
    """The prompt text of a conversation.

    A message's ``content`` is text or a list of text parts (OpenAI's ``{"type": "text", "text": ...}``);
    the template gets it in ``content_format`` (:func:`content_format_of` resolves ``"auto"``): text,
    the parts joined with newlines, or a list of text parts. Other parts are a ``ValueError``.
    ``documents`` (retrieval-augmented templates' sources) reach the template as transformers
    passes them. Transformers renders the template in a sandboxed Jinja environment; the
    keyword arguments it reserves for itself cannot be overridden through
    ``chat_template_kwargs`` (``tokenize=True`` would return ids, not text).
    """
    if chat_template is None and not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"{model_name} has no chat template; pass a chat template")
    extra = {k: v for k, v in (chat_template_kwargs or {}).items() if k not in RESERVED_TEMPLATE_KWARGS}
    if content_format not in ("auto", "string", "openai"):
        raise ValueError(f"the chat template's content format must be auto, string or openai, not {content_format!r}")
    if content_format == "auto":
        content_format = content_format_of(tokenizer, chat_template)
    conversation = _developer_as_system(conversation, chat_template or tokenizer.chat_template)
    return tokenizer.apply_chat_template(
        [_with_content(m, content_format) for m in conversation],
        chat_template=chat_template,
        tools=tools,
        documents=documents,
        tokenize=False,
        add_generation_prompt=add_generation_prompt and not continue_final_message,
        continue_final_message=continue_final_message,
        **extra,
    )


def _developer_as_system(conversation: Conversation, template: str | Mapping[str, str]) -> Conversation:
    """OpenAI's ``developer`` messages as ``system`` ones, merged into one first message, for a template
    that never names the developer role (vLLM 0.32's rule); the conversation as it is otherwise."""
    sources = template.values() if isinstance(template, Mapping) else [template]
    if not any(m.get("role") == "developer" for m in conversation) or any(
        '"developer"' in source or "'developer'" in source for source in sources
    ):
        return conversation
    system = [content_text(m.get("content") or "") for m in conversation if m.get("role") in ("system", "developer")]
    rest = [m for m in conversation if m.get("role") not in ("system", "developer")]
    return [{"role": "system", "content": "\n\n".join(text for text in system if text)}, *rest]


def content_format_of(tokenizer: Any, chat_template: str | None = None) -> Literal["string", "openai"]:
    """vLLM's detection of a template's content format: ``"openai"`` when it loops over a message's
    ``content`` (``{% for part in message['content'] %}``, directly or through a variable set from
    it, filters allowed), else ``"string"``."""
    template = chat_template if chat_template is not None else getattr(tokenizer, "chat_template", None)
    sources = list(template.values()) if isinstance(template, Mapping) else [template] if template else []
    return "openai" if any(_loops_over_content(source) for source in sources) else "string"


def content_text(content: Any) -> str:
    """A message's content as the "string" format gives it: its text, or its text parts joined with
    newlines (as vLLM joins them); a part that is not text is a ``ValueError``."""
    if isinstance(content, list):
        return "\n".join(_part_text(part) for part in content)
    return "" if content is None else str(content)


def _with_content(message: Mapping[str, Any], content_format: str) -> dict[str, Any]:
    """The message as the template gets it (as vLLM shapes it): no content (None) is ``""`` or no part."""
    out = dict(message)
    content = message.get("content")
    if content is not None and not isinstance(content, str | list):
        return out
    if content_format == "string" or message.get("role") == "tool":  # vLLM: tool results are text for templates
        out["content"] = content_text(content)
    elif isinstance(content, list):
        out["content"] = [{"type": "text", "text": _part_text(part)} for part in content]
    else:
        out["content"] = [] if content is None else [{"type": "text", "text": content}]
    return out


def _part_text(part: Any) -> str:
    kind = part.get("type") if isinstance(part, Mapping) else None
    if kind not in TEXT_PART_TYPES:
        raise ValueError(f"content parts of type {kind!r} are not supported: this model takes text")
    return str(part.get("text", ""))


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


@lru_cache(maxsize=32)
def _loops_over_content(source: str) -> bool:
    from jinja2 import nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    try:
        tree = ImmutableSandboxedEnvironment().parse(source)
    except Exception:  # a template jinja cannot parse fails when rendered, with its own message
        return False

    def reads_content(node: Any) -> bool:
        while isinstance(node, nodes.Filter | nodes.Test):  # message.content | selectattr(...)
            node = node.node
        if isinstance(node, nodes.Getitem):
            return isinstance(node.arg, nodes.Const) and node.arg.value == "content"
        return isinstance(node, nodes.Getattr) and node.attr == "content"

    def loops_over(scope: Any, holds: Callable[[Any], bool]) -> bool:
        """Whether ``scope`` loops over a value ``holds`` says is content, or over a variable set from one."""
        names = {
            assign.target.name
            for assign in scope.find_all(nodes.Assign)
            if isinstance(assign.target, nodes.Name) and holds(assign.node)
        }
        return any(
            holds(loop.iter) or (isinstance(loop.iter, nodes.Name) and loop.iter.name in names)
            for loop in scope.find_all(nodes.For)
        )

    if loops_over(tree, reads_content):
        return True
    # a macro looping over a parameter, called with a message's content (Qwen3-VL's render_content(content))
    looping = {
        (macro.name, position, parameter.name)
        for macro in tree.find_all(nodes.Macro)
        for position, parameter in enumerate(macro.args)
        if loops_over(macro, lambda node, name=parameter.name: isinstance(node, nodes.Name) and node.name == name)
    }
    for call in tree.find_all(nodes.Call):
        for name, position, parameter in looping:
            if not (isinstance(call.node, nodes.Name) and call.node.name == name):
                continue
            given = [*call.args[position : position + 1], *(k.value for k in call.kwargs if k.key == parameter)]
            if any(reads_content(value) or _set_from_content(tree, value, reads_content) for value in given):
                return True
    return False


def _set_from_content(tree: Any, node: Any, reads_content: Callable[[Any], bool]) -> bool:
    """Whether ``node`` is a variable the template sets from a message's content."""
    from jinja2 import nodes

    return isinstance(node, nodes.Name) and any(
        isinstance(assign.target, nodes.Name) and assign.target.name == node.name and reads_content(assign.node)
        for assign in tree.find_all(nodes.Assign)
    )
