"""What every front-end does between its protocol and the engine: the request checks
(model name, token ids, caps, stop strings, context length), chat-template rendering
that keeps special-token text literal, and tokenization off the event loop.

A front-end plugin subclasses :class:`FrontendKit` (or holds one) and adds its routes
and its protocol's shapes; errors are raised as :class:`llmp.server.errors.APIError`.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from llmp.server.errors import APIError, bad_request

MAX_STOP_LENGTH = 1024


def json_text(payload: Any) -> str:
    """Compact JSON for a stream event: UTF-8 text as is, but escaped when the payload holds a lone
    surrogate (which a request may carry, e.g. in its ``request_id``) that UTF-8 cannot encode."""
    text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    try:
        text.encode()
    except UnicodeEncodeError:
        return json.dumps(payload, separators=(",", ":"))
    return text


class FrontendKit:
    """The engine client, the served names and limits, and the shared checks and conversions."""

    def __init__(self, engine: Any, options: Mapping[str, Any]) -> None:
        self.engine = engine
        self.options = options
        self.model_names: list[str] = list(options["served_model_names"])
        self.model_name = self.model_names[0]
        self.max_model_len: int = options["max_model_len"]
        self.vocab_size: int | None = engine.info.get("vocab_size")
        self.task = options.get("task", "generate")
        self.tokenizer = engine.get_tokenizer()
        self.control_texts = control_texts(self.tokenizer)
        self.defaults = generation_defaults(options.get("model_root"), options.get("generation_config", "auto"))
        self.created = int(time.time())

    # -- checks ---------------------------------------------------------------------

    def check_model(self, name: str | None) -> None:
        if name and name not in self.model_names:
            raise APIError(404, f"The model `{name}` does not exist.", param="model", type="NotFoundError")

    def check_token_ids(self, ids: Sequence[int], param: str) -> None:
        limit = self.vocab_size
        bad = next((t for t in ids if t < 0 or (limit is not None and t >= limit)), None)
        if bad is not None:
            raise bad_request(f"token id {bad} in {param} is out of vocabulary (size {limit})", param)

    def check_caps(self, n: int, logprobs: int | None, prompt_logprobs: int | None) -> None:
        cap = self.options.get("max_n", 128)
        if n > cap:
            raise bad_request(f"n must be at most {cap} (--max-n), got {n}", "n")
        limit = self.options.get("max_logprobs", 20)
        for name, value in (("logprobs", logprobs), ("prompt_logprobs", prompt_logprobs)):
            if value is not None and limit >= 0 and value > limit:
                raise bad_request(f"{name}={value} exceeds the server's limit of {limit} (--max-logprobs)", name)

    def check_stop(self, stop: str | list[str] | None) -> None:
        """Stop strings are searched in every new piece of text: their number and length are bounded."""
        strings = [stop] if isinstance(stop, str) else list(stop or [])
        cap = self.options.get("max_stop_sequences", 64)
        if len(strings) > cap:
            raise bad_request(f"at most {cap} stop strings are allowed (--max-stop-sequences), got {len(strings)}",
                              "stop")
        longest = max(map(len, strings), default=0)
        if longest > MAX_STOP_LENGTH:
            raise bad_request(f"a stop string may be at most {MAX_STOP_LENGTH} characters long, got {longest}", "stop")
        if any(s == "" for s in strings):
            raise bad_request("stop strings must not be empty", "stop")

    def resolve_max_tokens(self, requested: int | None, prompt_len: int) -> int:
        """``max_tokens`` checked against the context; unset, the rest of it."""
        limit = self.max_model_len
        if requested is not None and requested > limit:
            raise bad_request(f"max_tokens={requested} cannot be greater than max_model_len={limit}", "max_tokens")
        wanted = requested if requested is not None else 1
        if prompt_len + wanted > limit:
            raise bad_request(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{prompt_len + wanted} tokens ({prompt_len} in the input, {wanted} for the completion). "
                "Please reduce the length of the input or of max_tokens.", "input_tokens")
        default = self.defaults.get("max_new_tokens")
        if requested is None and default is not None:
            return min(default, limit - prompt_len)
        return requested if requested is not None else limit - prompt_len

    async def conversation_prompt(self, conversation: list[dict[str, Any]], body: Any,
                                  tools: Any = None) -> tuple[str, list[int]]:
        """The rendered conversation (messages as dicts with text ``content``) and its token ids.

        ``body`` supplies the optional request fields ``chat_template``, ``chat_template_kwargs``,
        ``add_generation_prompt``, ``continue_final_message`` and ``add_special_tokens``. Text in a
        message that spells a special token (``<|im_end|>``) stays text: it is tokenized as such,
        never as the control token, so a user cannot forge turns.
        """
        for message in conversation:
            if self._spells_control(str(message.get("role", ""))):
                raise bad_request("a message role spells a special token of the model", "messages")
        text = await self._render(conversation, body, tools)
        add_special = bool(getattr(body, "add_special_tokens", False))
        literal = {i: m["content"] for i, m in enumerate(conversation) if self._spells_control(m["content"])}
        if not literal:
            return text, await self.encode(text, add_special)
        marked = [{**m, "content": marker(i)} if i in literal else m for i, m in enumerate(conversation)]
        rendered = await self._render(marked, body, tools)
        return text, await asyncio.to_thread(self._encode_literal, rendered, literal, add_special)

    def _spells_control(self, content: str) -> bool:
        return any(token in content for token in self.control_texts)

    def _encode_literal(self, rendered: str, literal: dict[int, str], add_special: bool) -> list[int]:
        pieces = _MARKER.split(rendered)  # template text, message index, template text, ...
        if len(pieces) != 2 * len(literal) + 1:
            raise bad_request("a message spells a special token, and the chat template transforms message "
                              "content, so it cannot be kept literal", "messages")
        ids: list[int] = []
        for k, piece in enumerate(pieces):
            if k % 2:
                ids += self.tokenizer.encode(literal[int(piece)], add_special_tokens=False, split_special_tokens=True)
            elif piece:
                ids += self.tokenizer.encode(piece, add_special_tokens=add_special and k == 0)
        return ids

    async def _render(self, conversation: list[dict[str, Any]], body: Any, tools: Any) -> str:
        from llmp.chat_template import render_chat

        template = getattr(body, "chat_template", None)
        if template is not None and not self.options.get("trust_request_chat_template"):
            raise bad_request("Refused request with untrusted chat template: start the server with "
                              "--trust-request-chat-template to allow one", "chat_template")
        kwargs = getattr(body, "chat_template_kwargs", None)
        if kwargs and not self.options.get("trust_request_chat_template"):
            self._check_template_kwargs(kwargs, template)
        if getattr(body, "continue_final_message", False) and getattr(body, "add_generation_prompt", False):
            raise bad_request("continue_final_message and add_generation_prompt cannot both be true; "
                              "set add_generation_prompt to false", "continue_final_message")
        try:
            return await asyncio.to_thread(
                render_chat, self.tokenizer, conversation,
                chat_template=template or self.options.get("chat_template"),
                add_generation_prompt=getattr(body, "add_generation_prompt", True),
                continue_final_message=getattr(body, "continue_final_message", False),
                tools=tools, chat_template_kwargs=getattr(body, "chat_template_kwargs", None),
                model_name=f"the model {self.model_name}",
            )
        except APIError:
            raise
        except Exception as exc:  # template errors (jinja's, sandbox violations) are the request's fault
            raise bad_request(f"the chat template could not be applied: {type(exc).__name__}: {exc}",
                              "messages") from None

    def _check_template_kwargs(self, kwargs: Mapping[str, Any], template: str | None) -> None:
        """Only variables the chat template reads may be set (``enable_thinking``), so a request
        cannot reach transformers' own arguments (``tokenize``) or anything else."""
        from llmp.chat_template import template_variables

        known = template_variables(self.tokenizer, template or self.options.get("chat_template"))
        unknown = sorted(set(kwargs) - known)
        if unknown:
            allowed = ", ".join(sorted(known)) or "none"
            raise bad_request(f"chat_template_kwargs {', '.join(map(repr, unknown))} are not variables of the chat "
                              f"template (it reads: {allowed}); start the server with "
                              "--trust-request-chat-template to pass others", "chat_template_kwargs")

    async def prompt_inputs(self, value: Any, param: str, add_special_tokens: bool) -> list[tuple[str | None, list[int]]]:
        """Text and token ids of each prompt of a ``str | list[str] | list[int] | list[list[int]]`` field."""
        if isinstance(value, str) or (value and all(isinstance(t, int) for t in value)):
            value = [value]
        if not value:
            raise bad_request(f"{param} must not be empty", param)
        prompts = []
        for item in value:
            if isinstance(item, str):
                text, ids = item, await self.encode(item, add_special_tokens)
            else:
                self.check_token_ids(item, param)
                text, ids = None, list(item)
            if not ids or item == "":  # "" is empty even when the tokenizer adds BOS/CLS
                raise bad_request(f"{param} must not hold an empty string or list", param)
            prompts.append((text, ids))
        return prompts

    async def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return await asyncio.to_thread(self.tokenizer.encode, text, add_special_tokens=add_special_tokens)


_MARKER = re.compile("\ue000llmp(\\d+)\ue001")


def marker(index: int) -> str:
    return f"\ue000llmp{index}\ue001"  # private-use characters: no text or template makes them


def control_texts(tokenizer: Any) -> list[str]:
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    texts = {t.content for t in added.values() if getattr(t, "special", False)}
    texts.update(getattr(tokenizer, "all_special_tokens", []) or [])
    return sorted(t for t in texts if t)


GENERATION_DEFAULTS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_new_tokens")


def generation_defaults(model_dir: str | None, source: str) -> dict[str, Any]:
    """Sampling defaults from the model's ``generation_config.json`` (``--generation-config auto``)."""
    if source != "auto" or not model_dir:
        return {}
    try:
        with open(f"{model_dir}/generation_config.json") as f:
            config = json.load(f)
    except (OSError, ValueError):
        return {}
    return {k: config[k] for k in GENERATION_DEFAULTS if isinstance(config.get(k), int | float)}


def engine_request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"
