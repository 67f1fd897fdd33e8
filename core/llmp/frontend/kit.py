"""What every front-end does between its protocol and the engine: the request checks
(model name, token ids, caps, stop strings, context length), the one way a request
becomes :class:`~llmp.sampling_params.SamplingParams` (:meth:`FrontendKit.sampling_params`),
chat-template rendering that keeps special-token text literal, and tokenization off the
event loop.

A front-end plugin subclasses :class:`FrontendKit` (or holds one) and adds its routes
and its protocol's shapes: a handler maps its protocol's field names into a
:class:`SamplingRequest`. Errors are raised as :class:`llmp.frontend.APIError`;
:func:`llmp.frontend.as_api_error` turns any other failure into one (a
:class:`~llmp.api.RequestValidationError` into a 400 naming its field).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal, get_args

from llmp.api import (
    EngineDeadError,
    InvalidLoRAAdapterError,
    LLMPError,
    LoRAAdapterNotFoundError,
    RequestValidationError,
)
from llmp.beam_search import BeamSearch, BeamSearchParams, BeamSearchSequence, run_beam_search, step_logprobs
from llmp.chat_template import content_text
from llmp.engine.thinking_budget import count_reasoning_tokens
from llmp.frontend.errors import APIError, bad_request
from llmp.frontend.fim import fim_style, fim_token_ids
from llmp.frontend.token_bytes import TokenBytes
from llmp.inputs import Prompt, last_tokens, special_tokens_around
from llmp.lora import LoRARequest
from llmp.model_files.config import generation_defaults
from llmp.options import GENERATION_DEFAULTS, FrontendOptions
from llmp.outputs import CompletionOutput, RequestOutput
from llmp.pooling_params import PoolingParams, check_dimensions
from llmp.sampling_params import (
    ReasoningMarkers,
    SamplingParams,
    SamplingParamsError,
    StructuredOutputsParams,
    resolve_max_tokens,
)
from llmp.scoring import ScoreInputError, is_unicode, truncation_length

MAX_STOP_LENGTH = 1024


# Characters that str.splitlines() takes for line ends and JSON leaves unescaped: a client reading an event stream
# with it (httpx's iter_lines) would cut a data: line where a token's text holds one. Escaped, as JSON allows.
_LINE_ENDS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def json_text(payload: Any) -> str:
    """Compact JSON for a stream event: UTF-8 text as is, but escaped when the payload holds a lone
    surrogate (which a request may carry, e.g. in its ``request_id``) that UTF-8 cannot encode, and
    the three characters besides CR and LF that line readers split on (U+0085, U+2028, U+2029)."""
    text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    try:
        text.encode()
    except UnicodeEncodeError:
        return json.dumps(payload, separators=(",", ":"))
    return text.translate(_LINE_ENDS)


# OpenAI's reasoning_effort values, and those vLLM adds; a chat template reads the one it is given
log = logging.getLogger("llmp.frontend")

ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]
REASONING_EFFORTS = get_args(ReasoningEffort)


@dataclass(kw_only=True)
class SamplingRequest:
    """A request's sampling fields under :class:`SamplingParams`'s names, as a protocol handler maps
    them; ``None`` is unset: the model's generation-config default (``--generation-config auto``)
    for the fields in :data:`GENERATION_DEFAULTS`, else SamplingParams's own default.

    ``max_tokens=None`` is the rest of the context (at most the generation config's
    ``max_new_tokens``). ``names`` maps a field to the request's own name for it
    (``max_tokens`` -> ``max_completion_tokens``), so errors name what was sent.
    Build one from a request body with :meth:`from_body`.
    """

    n: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    typical_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    max_tokens: int | None = None
    min_tokens: int = 0
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    logit_bias: Mapping[str, float] | Mapping[int, float] | None = None  # keys: token ids (JSON: as text)
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    structured_outputs: StructuredOutputsParams | None = None
    thinking_token_budget: int | None = None
    reasoning_markers: ReasoningMarkers | None = None  # FrontendKit.reasoning_markers, for thinking_token_budget
    penalty_window: int | None = None  # the penalties read only the last N tokens (llama.cpp's repeat_last_n)
    names: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_body(cls, body: Any, **overrides: Any) -> SamplingRequest:
        """The sampling fields of a request body: each field the body declares under this record's
        name (a pydantic model's declared fields, never the extra keys a client sent; else any
        attribute), then ``overrides``, which set the fields the protocol names or means otherwise
        (``max_tokens`` from ``max_completion_tokens``, ``logprobs`` from ``top_logprobs``) and
        ``names``. ``structured_outputs`` and ``reasoning_markers`` are never read from the body: they
        are the constraint the handler compiled (from ``response_format``, tools ...) and the markers
        of the server's reasoning parser."""
        declared = getattr(type(body), "model_fields", None)
        has = (lambda name: name in declared) if declared is not None else (lambda name: hasattr(body, name))
        taken = {name: getattr(body, name) for name in _BODY_FIELDS if has(name)}
        return cls(**{**taken, **overrides})


_BODY_FIELDS = tuple(
    f.name for f in fields(SamplingRequest) if f.name not in ("structured_outputs", "reasoning_markers", "names")
)


class FrontendKit:
    """The engine client, the served names and limits, and the shared checks and conversions."""

    public_paths: tuple[str, ...] = ()  # served without the API key (see llmp.api.Frontend)
    root_priority: int = 0  # who keeps "/" when several front-ends route it (see llmp.api.Frontend)
    fallback_paths: tuple[str, ...] = ()  # routed only when no other front-end routes them (see llmp.api.Frontend)
    any_body_type_paths: tuple[str, ...] = ()  # bodies read as JSON whatever their Content-Type (see llmp.api.Frontend)
    self_admitted_paths: tuple[str, ...] = ()  # admitted by the front-end, not the server (see llmp.api.Frontend)

    def __init__(self, engine: Any, options: FrontendOptions) -> None:
        self.engine = engine
        self.options = options
        self.model_names: list[str] = list(options.served_model_names)
        self.model_aliases = packaged_aliases(self.model_names)
        self.model_name = self.model_names[0]
        self.max_model_len = options.max_model_len
        self.vocab_size: int | None = engine.info.get("vocab_size")
        self.task = options.task  # the primary task: what a request that does not say gets
        self.supported_tasks = options.supported_tasks  # every task the engine takes: the routes to mount
        self.max_score_pairs = options.max_score_pairs
        self.tokenizer = engine.get_tokenizer()
        self.token_bytes = TokenBytes(self.tokenizer)  # a token's raw bytes, for logprobs' "bytes"
        self.control_texts = control_texts(self.tokenizer)
        self.fim = fim_style(self.tokenizer)  # the model's fill-in-the-middle tokens, if it has them
        self.defaults = generation_defaults(
            options.model_root, options.generation_config, options.override_generation_config
        )
        # vLLM's rule: --override-generation-config's max_new_tokens caps every request, set or not
        ceiling = (options.override_generation_config or {}).get("max_new_tokens")
        self.max_tokens_ceiling = None if ceiling is None else int(ceiling)
        self.created = int(time.time())
        self.tool_parser = _load_parser("tool_parser", options.tool_call_parser, self.tokenizer)
        self.reasoning_parser = _load_parser("reasoning_parser", options.reasoning_parser, self.tokenizer)
        self.auto_tools = options.enable_auto_tool_choice and self.tool_parser is not None
        # what an adapter's base_model_name may say: a served name, or the model as the server was given it
        self.base_model_name: str = engine.info.get("model") or self.model_name
        self._lora_resolvers: list[Any] | None = None

    # -- models and LoRA adapters ------------------------------------------------------

    @property
    def lora_requests(self) -> Mapping[str, LoRARequest]:
        """The LoRA adapters served by name (``--lora-modules``, loaded at run time or by a resolver):
        the engine client's table, shared by every front-end. An engine client without one serves none."""
        return getattr(self.engine, "lora_requests", {})

    def is_served(self, name: str | None) -> bool:
        """Whether a request's ``model`` names what this server serves: none (the default), a served
        model name, or a served LoRA adapter."""
        return not name or name in self.model_names or name in self.model_aliases or name in self.lora_requests

    def check_model(self, name: str | None) -> None:
        """The protocol's 404 for a ``model`` that is not served (a front-end overrides it for its own shape)."""
        if not self.is_served(name):
            raise APIError(404, f"The model `{name}` does not exist.", param="model", type="NotFoundError")

    async def lora_for(self, model: str | None) -> LoRARequest | None:
        """The adapter a request's ``model`` names, to pass as ``lora_request``: None for the base
        model (no name, or a served name), the served adapter of that name, else (with
        ``--enable-lora-runtime-updates``) one a resolver plugin finds and loads. An unknown name is
        :meth:`check_model`'s 404; a resolved adapter that does not load is a 400."""
        if not model or model in self.model_names or model in self.model_aliases:
            return None
        lora = self.lora_requests.get(model)
        if lora is not None:
            return lora
        if self.options.enable_lora_runtime_updates:
            from llmp.frontend.lora import load_resolvers, resolve

            if self._lora_resolvers is None:
                self._lora_resolvers = load_resolvers(self.options)
            try:
                return await resolve(self.engine, self._lora_resolvers, self.base_model_name, model)
            except LoRAAdapterNotFoundError:
                pass  # the front-end's own 404 below
            except InvalidLoRAAdapterError as exc:
                raise APIError(400, str(exc), param="model", type="BadRequestError") from None
        self.check_model(model)
        return None

    def response_model(self, lora: LoRARequest | None) -> str:
        """The ``model`` a response echoes: the adapter's name when it ran on one (as vLLM), else the served name."""
        return lora.lora_name if lora is not None else self.model_name

    def is_pinned(self, lora: LoRARequest) -> bool:
        """Whether the adapter is pinned in the engine's CPU cache (``pin`` on load, or :meth:`pin_adapter`)."""
        return lora.lora_int_id in getattr(self.engine, "pinned_loras", ())

    def model_cards(self) -> list[dict[str, Any]]:
        """OpenAI model objects of what is served: the model's names, then each adapter with its
        directory as ``root`` and its base model as ``parent`` (vLLM's ``/v1/models``)."""
        base = self.options.model_root
        cards = [self._card(name, base or name, None, self.max_model_len) for name in self.model_names]
        cards += [
            self._card(lora.lora_name, lora.lora_path, lora.base_model_name or self.model_name, None)
            for lora in self.lora_requests.values()
        ]
        return cards

    def _card(self, name: str, root: str, parent: str | None, max_model_len: int | None) -> dict[str, Any]:
        return {
            "id": name,
            "object": "model",
            "created": self.created,
            "owned_by": "llmp",
            "root": root,
            "parent": parent,
            "max_model_len": max_model_len,
        }

    async def load_adapter(
        self,
        name: str | None,
        path: str | None,
        *,
        base_model_name: str | None = None,
        load_inplace: bool = False,
        pin: bool = False,
    ) -> LoRARequest:
        """Load a LoRA adapter at run time and serve it as model ``name`` (vLLM's
        ``/v1/load_lora_adapter``): read and checked by the engine before this returns.
        ``load_inplace`` replaces an adapter of that name (requests in flight finish on the old one);
        ``pin`` keeps it in the engine's CPU cache for good and its slot evicted last (see
        :meth:`pin_adapter`). Raises :class:`APIError` with vLLM's texts: 400
        for a missing field, a name served already, or an adapter llmp will not serve; 404 when the
        path holds no adapter."""
        from llmp.frontend.lora import adapter_lock, check_base_model

        if not name or not path:
            raise APIError(400, "Both 'lora_name' and 'lora_path' must be provided.", type="InvalidUserInput")
        if name in self.model_names or name in self.model_aliases:
            raise APIError(
                400,
                f"'{name}' is the name of the served model; give the LoRA adapter another name.",
                param="lora_name",
                type="InvalidUserInput",
            )
        async with adapter_lock(self.engine, name):
            old = self.lora_requests.get(name)
            if old is not None and not load_inplace:
                raise APIError(
                    400,
                    f"The lora adapter '{name}' has already been loaded. If you want to load the adapter "
                    "in place, set 'load_inplace' to True.",
                    param="lora_name",
                    type="InvalidUserInput",
                )
            try:
                check_base_model(name, base_model_name, {*self.model_names, self.base_model_name})
            except InvalidLoRAAdapterError as exc:
                raise APIError(400, str(exc), param="base_model_name", type="BadRequestError") from None
            lora = LoRARequest(name, self.engine.next_lora_id(), path, base_model_name)
            try:
                await self.engine.add_lora(lora, pin=pin)
            except LoRAAdapterNotFoundError as exc:
                raise APIError(404, str(exc), param="lora_path", type="NotFoundError") from None
            except EngineDeadError:
                raise
            except (LLMPError, ValueError, TypeError) as exc:  # rank, targets, a corrupt file: the adapter's fault
                raise APIError(400, str(exc), param="lora_path", type="BadRequestError") from None
            if old is not None:
                await self.engine.remove_lora(old.lora_int_id)
        return lora

    async def unload_adapter(self, name: str | None) -> LoRARequest:
        """Stop serving LoRA adapter ``name`` (vLLM's ``/v1/unload_lora_adapter``): new requests
        naming it get a 404, those in flight finish. Raises :class:`APIError`: 400 without a name,
        404 (vLLM's text) for a name not served."""
        from llmp.frontend.lora import adapter_lock

        if not name:
            raise APIError(400, "'lora_name' needs to be provided to unload a LoRA adapter.", type="InvalidUserInput")
        async with adapter_lock(self.engine, name):
            lora = self._served_adapter(name)
            await self.engine.remove_lora(lora.lora_int_id)
        return lora

    async def pin_adapter(self, name: str) -> LoRARequest:
        """Pin served LoRA adapter ``name`` in the engine's CPU cache: never dropped from it, so never
        read from disk again. Its slot is evicted last, not never: only when every slot a step could
        take holds a pinned adapter does the least recently used of them go (it is copied back from
        the CPU cache when next needed). 404 when no adapter of that name is served."""
        lora = self._served_adapter(name)
        await self.engine.pin_lora(lora.lora_int_id)
        return lora

    def _served_adapter(self, name: str) -> LoRARequest:
        lora = self.lora_requests.get(name)
        if lora is None:
            raise APIError(404, f"The lora adapter '{name}' cannot be found.", param="lora_name", type="NotFoundError")
        return lora

    # -- checks ---------------------------------------------------------------------

    def check_token_ids(self, ids: Sequence[int], param: str) -> None:
        limit = self.vocab_size
        bad = next((t for t in ids if t < 0 or (limit is not None and t >= limit)), None)
        if bad is not None:
            raise bad_request(f"token id {bad} in {param} is out of vocabulary (size {limit})", param)

    def check_caps(
        self, n: int, logprobs: int | None, prompt_logprobs: int | None, logprobs_param: str = "logprobs"
    ) -> None:
        cap = self.options.max_n
        if n > cap:
            raise bad_request(f"n must be at most {cap} (--max-n), got {n}", "n")
        limit = self.options.max_logprobs
        for name, value in ((logprobs_param, logprobs), ("prompt_logprobs", prompt_logprobs)):
            shown = value
            if value == -1:  # vLLM's "the whole vocabulary"
                value = self.vocab_size if self.vocab_size is not None else limit + 1
                shown = f"-1 (the whole vocabulary, {value} tokens)" if self.vocab_size is not None else "-1"
            if value is not None and limit >= 0 and value > limit:
                raise bad_request(f"{name}={shown} exceeds the server's limit of {limit} (--max-logprobs)", name)
            if shown != value:  # within a limit that high: the count itself, which the answer is shaped by
                raise bad_request(f"{name}=-1 (the whole vocabulary): give the count, {value}", name)

    def check_stop(self, stop: str | list[str] | None, param: str = "stop") -> None:
        """Stop strings are searched in every new piece of text: their number and length are bounded."""
        strings = [stop] if isinstance(stop, str) else list(stop or [])
        cap = self.options.max_stop_sequences
        if len(strings) > cap:
            raise bad_request(
                f"at most {cap} stop strings are allowed (--max-stop-sequences), got {len(strings)}", param
            )
        longest = max(map(len, strings), default=0)
        if longest > MAX_STOP_LENGTH:
            raise bad_request(f"a stop string may be at most {MAX_STOP_LENGTH} characters long, got {longest}", param)
        if any(s == "" for s in strings):
            raise bad_request("stop strings must not be empty", param)

    # -- tools, reasoning and structured outputs ---------------------------------------

    def check_tools(self, tools: Sequence[Mapping[str, Any]] | None, tool_choice: Any) -> str | None:
        """Validate ``tools`` and ``tool_choice`` (OpenAI shapes); the function ``tool_choice`` names, if any."""
        if tools is not None and not tools:
            raise bad_request("tools must hold at least one tool when given", "tools")
        names = [tool_name(t) for t in tools or ()]
        if any(not name for name in names):
            raise bad_request("every tool must be a function with a name", "tools")
        if tool_choice is None or tool_choice == "none":
            return None
        if not tools:
            raise bad_request("tool_choice needs tools", "tool_choice")
        named = None
        if isinstance(tool_choice, Mapping):
            named = tool_name(tool_choice)
            if not named or named not in names:
                raise bad_request(
                    f"tool_choice names the function {named!r}, which is not among the tools", "tool_choice"
                )
        elif tool_choice not in ("auto", "required"):
            raise bad_request(
                f"tool_choice must be none, auto, required or a named function, got {tool_choice!r}", "tool_choice"
            )
        if tool_choice == "auto" and not self.auto_tools:
            raise bad_request(
                '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set', "tool_choice"
            )
        if self.tool_parser is None:
            kind = "named" if named else tool_choice
            raise bad_request(
                f"tool_choice={kind!r} requires --tool-call-parser to be set (and --enable-auto-tool-choice "
                "for 'auto')",
                "tool_choice",
            )
        return named

    def output_plan(
        self,
        prompt_ids: Sequence[int],
        tools: Sequence[Mapping[str, Any]] | None,
        tool_choice: Any,
        *,
        parallel_tool_calls: bool = True,
        include_reasoning: bool = True,
        parse_reasoning: bool = True,
        constraint: StructuredOutputsParams | None = None,
    ) -> tuple[OutputPlan, StructuredOutputsParams | None]:
        """How the completions of a chat request become messages, and the constraint its sampling takes.

        ``tool_choice`` required or named is enforced by constrained decoding (the arguments always
        parse and fit the function's schema); ``constraint`` is the request's own structured output.
        Both apply to the answer after the reasoning, when a reasoning parser is set.
        ``include_reasoning=False`` splits the reasoning off and drops it; ``parse_reasoning=False``
        uses no reasoning parser: the whole text is the answer (Ollama's ``think: false``).
        """
        named = self.check_tools(tools, tool_choice)
        plan = OutputPlan(include_reasoning=include_reasoning, tools=list(tools or ()))
        plan.max_tool_calls = None if parallel_tool_calls else 1
        if self.reasoning_parser is not None and parse_reasoning:
            state = self.reasoning_parser.prompt_state(list(prompt_ids))
            if state is not False:
                plan.reasoning_parser, plan.in_reasoning = self.reasoning_parser, state
        forced = None
        if named is not None or tool_choice == "required":  # each forced tool's schema, as the request names it
            _check_parameters(tools, named)
        if named is not None:
            from llmp.parsing import NamedToolCallParser

            plan.tool_parser, plan.named = NamedToolCallParser(named), True
            tool = next(t for t in tools if tool_name(t) == named)
            forced = StructuredOutputsParams(json=forced_parameters(tool), disable_any_whitespace=True)
        elif tool_choice == "required":
            from llmp.parsing import RequiredToolCallsParser

            plan.tool_parser = RequiredToolCallsParser()
            forced = StructuredOutputsParams(
                json=required_calls_schema(tools, parallel_tool_calls), disable_any_whitespace=True
            )
        elif tools and (tool_choice == "auto" or (tool_choice is None and self.auto_tools)):
            plan.tool_parser = self.tool_parser
        if forced is not None and constraint is not None:
            raise bad_request(
                "a structured output (response_format or structured_outputs) cannot be combined with "
                f"tool_choice={'named' if named else tool_choice!r}",
                "tool_choice",
            )
        constraint = forced or constraint
        if constraint is not None and plan.reasoning_parser is not None:
            constraint.after_token_ids = list(self.reasoning_parser.end_token_ids) or None
        return plan, constraint

    def structured_outputs(
        self, response_format: Mapping[str, Any] | None, structured_outputs: Mapping[str, Any] | None
    ) -> StructuredOutputsParams | None:
        """The constraint of OpenAI's ``response_format`` or vLLM's ``structured_outputs`` (at most one)."""
        kind = (response_format or {}).get("type", "text")
        if kind != "text" and structured_outputs:
            raise bad_request("give either response_format or structured_outputs, not both", "structured_outputs")
        if structured_outputs:
            unknown = sorted(set(structured_outputs) - STRUCTURED_OUTPUT_FIELDS)
            if unknown:
                raise bad_request(f"unknown structured_outputs field(s): {', '.join(unknown)}", "structured_outputs")
            fields = {
                k: v for k, v in structured_outputs.items() if k in STRUCTURED_OUTPUT_FIELDS - {"after_token_ids"}
            }
            try:
                return StructuredOutputsParams(**fields)
            except SamplingParamsError as exc:
                raise bad_request(str(exc), exc.field) from None
        if kind == "text":
            return None
        if kind == "json_object":
            return StructuredOutputsParams(json_object=True)
        if kind == "json_schema":
            json_schema = response_format.get("json_schema")
            if not isinstance(json_schema, Mapping):
                raise bad_request("response_format json_schema must be an object holding the schema", "response_format")
            schema = json_schema.get("schema")
            if schema is None:
                raise bad_request("response_format json_schema needs json_schema.schema", "response_format")
            if not isinstance(schema, dict):
                raise bad_request("response_format json_schema.schema must be a JSON object", "response_format")
            return StructuredOutputsParams(json=schema)
        if kind == "structural_tag":
            return StructuredOutputsParams(structural_tag=json.dumps(dict(response_format)))
        raise bad_request(
            f"response_format type must be text, json_object, json_schema or structural_tag, got {kind!r}",
            "response_format",
        )

    async def check_constraint(self, constraint: StructuredOutputsParams | None, param: str) -> None:
        """Have the engine compile a request's constraint before the response starts: an invalid
        schema, regex or grammar is a 400 here, also for a stream (its headers are not sent yet)."""
        check = getattr(self.engine, "check_structured_outputs", None)
        if constraint is None or check is None:
            return
        try:
            await check(constraint)
        except ValueError as exc:
            message = str(exc)
            if not param.endswith("structured_outputs"):  # name what the client sent (format, response_format)
                message = message.replace(f"invalid structured_outputs.{constraint.kind}:", f"invalid {param}:", 1)
            raise bad_request(message, param) from None

    def reasoning_markers(self, prompt_ids: Sequence[int], param: str = "thinking_token_budget") -> ReasoningMarkers:
        """The markers a ``thinking_token_budget`` counts with: the ``--reasoning-parser``'s start and end
        tokens, and whether the prompt opened the reasoning (its ``prompt_state``). A 400 naming ``param``
        without a reasoning parser, whose markers the budget needs."""
        parser = self.reasoning_parser
        if parser is None:
            raise bad_request(f"{param} needs a reasoning model served with --reasoning-parser", param)
        inside = starts_inside(parser, parser.prompt_state(list(prompt_ids)))
        try:
            return ReasoningMarkers(
                end_token_ids=list(parser.end_token_ids),
                start_token_ids=list(getattr(parser, "start_token_ids", ())),
                starts_inside=inside,
            )
        except SamplingParamsError:  # a parser without a start marker, on a prompt that did not open the reasoning
            raise bad_request(
                f"{param}: the reasoning parser {self.options.reasoning_parser!r} has no start marker to count from, "
                "and the prompt did not open the reasoning",
                param,
            ) from None

    def skip_special_tokens(self, plan: OutputPlan, requested: bool = True) -> bool:
        """Parsers whose markers are special tokens read the text with them."""
        parsers = (plan.tool_parser, plan.reasoning_parser)
        return requested and not any(getattr(p, "keep_special_tokens", False) for p in parsers if p is not None)

    # -- pooling ---------------------------------------------------------------------------

    def pooling_params(self, param: str = "dimensions", **fields: Any) -> PoolingParams:
        """A request's ``PoolingParams`` (task ``embed`` unless ``fields`` name one); a 400 naming
        ``param`` (the protocol's name of ``dimensions``) when the model does not support Matryoshka
        embeddings of that size (vLLM's rule), before the engine sees them, and for any other value
        ``PoolingParams`` refuses."""
        try:
            params = PoolingParams(**{"task": "embed", **fields})
            if params.dimensions is not None and params.task in (None, "embed", "token_embed"):
                info = self.engine.info
                check_dimensions(params.dimensions, info.get("matryoshka"), info.get("embedding_size"))
            return params
        except ValueError as exc:
            raise bad_request(str(exc).replace("dimensions", param, 1), param) from None

    # -- beam search ---------------------------------------------------------------------

    async def beam_search(
        self,
        prompt_ids: Sequence[int],
        params: BeamSearchParams,
        *,
        lora: LoRARequest | None = None,
        priority: int = 0,
        skip_special_tokens: bool = True,
        cache_salt: str | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """vLLM's ``use_beam_search``: the best ``params.beam_width`` beams of a prompt as one
        finished :class:`RequestOutput` (a completion per beam, best first), for a handler to answer
        as it answers a generation. Each step runs every live beam as a one-token engine request."""
        search = BeamSearch(
            [list(prompt_ids)],
            params,
            eos_token_ids=self.engine.info.get("eos_token_ids") or (),
            max_model_len=self.max_model_len,
            loras=[lora],
            cache_salts=[cache_salt],
        )

        async def one(beam: BeamSearchSequence, step: SamplingParams) -> Any:
            outputs = self.engine.generate(
                Prompt(token_ids=beam.tokens, cache_salt=cache_salt),
                step,
                engine_request_id("beam"),
                lora_request=lora,
                priority=priority,
            )
            final = None
            async with contextlib.aclosing(outputs):
                async for final in outputs:
                    pass
            return step_logprobs(final)

        async def step(beams: list[BeamSearchSequence], params: SamplingParams) -> list[Any]:
            tasks = [asyncio.ensure_future(one(beam, params)) for beam in beams]
            try:
                return list(await asyncio.gather(*tasks))
            finally:
                for task in tasks:
                    task.cancel()

        await run_beam_search(search, step)
        [result] = search.outputs(self.tokenizer, skip_special_tokens)
        prompt_len = len(prompt_ids)
        yield RequestOutput(
            request_id=engine_request_id("beam"),
            prompt=None,
            prompt_token_ids=list(prompt_ids),
            outputs=[
                CompletionOutput(
                    index=i,
                    text=beam.text or "",
                    token_ids=beam.tokens[prompt_len:],
                    cumulative_logprob=beam.cum_logprob,
                    finish_reason=beam.finish_reason,
                    stop_reason=beam.stop_reason,
                )
                for i, beam in enumerate(result.sequences)
            ],
            finished=True,
        )

    # -- sampling ------------------------------------------------------------------------

    def sampling_params(self, request: SamplingRequest, prompt_len: int) -> SamplingParams:
        """The engine's sampling parameters of a request whose prompt is ``prompt_len`` tokens long:
        the server's caps, stop-string and token-id checks, the generation-config defaults, and
        ``max_tokens`` resolved against the context. Every invalid value is a 400 naming the field
        as the request spells it."""
        names = request.names
        n = 1 if request.n is None else request.n
        self.check_caps(n, request.logprobs, request.prompt_logprobs, logprobs_param=names.get("logprobs", "logprobs"))
        self.check_stop(request.stop, names.get("stop", "stop"))
        logit_bias = None
        if request.logit_bias:
            try:
                logit_bias = {int(k): v for k, v in request.logit_bias.items()}
            except (TypeError, ValueError):
                raise bad_request("logit_bias keys must be token ids", names.get("logit_bias", "logit_bias")) from None
            self.check_token_ids(list(logit_bias), names.get("logit_bias", "logit_bias"))
        self.check_token_ids(request.allowed_token_ids or [], names.get("allowed_token_ids", "allowed_token_ids"))
        # every field under SamplingParams's name; unset (None): the model's generation config for
        # those it sets, else SamplingParams's default
        values = {f.name: getattr(request, f.name) for f in fields(request) if f.name != "names"}
        for name in GENERATION_DEFAULTS:
            if name in values and values[name] is None:
                values[name] = self.defaults.get(name)
        values["logit_bias"] = logit_bias
        try:
            max_tokens = resolve_max_tokens(request.max_tokens, prompt_len, self.max_model_len)
            if request.max_tokens is None and self.defaults.get("max_new_tokens") is not None:
                max_tokens = min(self.defaults["max_new_tokens"], max_tokens)
            if self.max_tokens_ceiling is not None:
                max_tokens = min(self.max_tokens_ceiling, max_tokens)
            values["max_tokens"] = max_tokens
            params = SamplingParams(**{name: value for name, value in values.items() if value is not None})
        except RequestValidationError as exc:
            raise field_error(exc, names) from None
        return params

    async def conversation_prompt(
        self,
        conversation: list[dict[str, Any]],
        body: Any,
        tools: Any = None,
        variables: Mapping[str, Any] | None = None,
    ) -> Prompt:
        """The engine's prompt of a conversation (messages as dicts whose ``content`` is text or a list
        of OpenAI text parts): the rendered text and its token ids.

        ``body`` supplies the optional request fields ``chat_template``, ``chat_template_kwargs``,
        ``reasoning_effort`` (a template variable, as in vLLM), ``documents``, ``add_generation_prompt``,
        ``continue_final_message`` and ``add_special_tokens``. ``variables`` are template variables the
        handler derives from its protocol's fields (Anthropic's ``thinking`` is ``enable_thinking``);
        the request's own ``chat_template_kwargs`` override them. Text in a
        message that spells a special token (``<|im_end|>``) stays text: it is tokenized as such,
        never as the control token, so a user cannot forge turns.
        """
        for message in conversation:
            if self._spells_control(str(message.get("role", ""))):
                raise bad_request("a message role spells a special token of the model", "messages")
        try:
            for message in conversation:
                content_text(message.get("content"))  # parts other than text: refused before rendering
        except ValueError as exc:
            raise bad_request(str(exc), "messages") from None
        text = await self._render(conversation, body, tools, variables)
        add_special = bool(getattr(body, "add_special_tokens", False))
        literal: dict[int, str] = {}

        def kept(value: Any) -> Any:  # a text spelling a special token: a marker, where its tokens go back
            if not isinstance(value, str) or not self._spells_control(value):
                return value
            literal[len(literal)] = value
            return marker(len(literal) - 1)

        marked = [_with_texts(message, kept) for message in conversation]
        if not literal:
            return Prompt(text, await self.encode(text, add_special))
        rendered = await self._render(marked, body, tools, variables)
        return Prompt(text, await asyncio.to_thread(self._encode_literal, rendered, literal, add_special))

    async def fim_prompt(self, prefix: str, suffix: str, param: str = "suffix") -> Prompt:
        """Fill in the middle: the prompt asking for the text between ``prefix`` and ``suffix``, in the
        model's own tokens (:mod:`llmp.frontend.fim`), after what its tokenizer puts first (a BOS).
        Text that spells a special token stays text. A 400 naming ``param`` when the model has none."""
        style = self.fim
        if style is None:
            raise bad_request(
                f"{param}: this model has no fill-in-the-middle tokens (<|fim_prefix|>, <fim_prefix>, "
                "<｜fim▁begin｜> or [PREFIX] ...): serve a code model made for insertion",  # noqa: RUF001
                param,
            )
        if not (is_unicode(prefix) and is_unicode(suffix)):  # JSON may carry a lone surrogate
            raise bad_request("the prompt or the suffix holds text that is not valid Unicode", param)
        tokenizer = self.tokenizer

        def build() -> list[int]:
            def text_ids(text: str) -> list[int]:
                return tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)

            head, _ = special_tokens_around(tokenizer.encode("a", add_special_tokens=True), text_ids("a"))
            return [*head, *fim_token_ids(tokenizer, style, text_ids(prefix), text_ids(suffix))]

        return Prompt(token_ids=await asyncio.to_thread(build))

    def _spells_control(self, content: str) -> bool:
        return any(token in content for token in self.control_texts)

    def _encode_literal(self, rendered: str, literal: dict[int, str], add_special: bool) -> list[int]:
        pieces = _MARKER.split(rendered)  # template text, message index, template text, ...
        if len(pieces) != 2 * len(literal) + 1:
            raise bad_request(
                "a message spells a special token, and the chat template transforms message "
                "content, so it cannot be kept literal",
                "messages",
            )
        ids: list[int] = []
        for k, piece in enumerate(pieces):
            if k % 2:
                ids += self.tokenizer.encode(literal[int(piece)], add_special_tokens=False, split_special_tokens=True)
            elif piece:
                ids += self.tokenizer.encode(piece, add_special_tokens=add_special and k == 0)
        return ids

    async def _render(
        self, conversation: list[dict[str, Any]], body: Any, tools: Any, derived: Mapping[str, Any] | None = None
    ) -> str:
        from llmp.chat_template import read_variables, render_chat

        template = getattr(body, "chat_template", None)
        if template is not None and not self.options.trust_request_chat_template:
            raise bad_request(
                "Refused request with untrusted chat template: start the server with "
                "--trust-request-chat-template to allow one",
                "chat_template",
            )
        kwargs = getattr(body, "chat_template_kwargs", None)
        if kwargs and not self.options.trust_request_chat_template:
            self._check_template_kwargs(kwargs, template)
        variables = {
            **(self.options.default_chat_template_kwargs or {}),  # the server's, under the request's own
            **(derived or {}),
            **(kwargs or {}),
            **reasoning_variables(getattr(body, "reasoning_effort", None), kwargs),
        }
        if getattr(body, "continue_final_message", False) and getattr(body, "add_generation_prompt", False):
            raise bad_request(
                "continue_final_message and add_generation_prompt cannot both be true; "
                "set add_generation_prompt to false",
                "continue_final_message",
            )
        if tools and "tools" not in read_variables(self.tokenizer, template or self.options.chat_template):
            log.warning(
                "tools were given, but the chat template does not show the model any tools (it reads no `tools`): "
                "the model cannot know them (a forced tool_choice still gives valid calls); serve with a "
                "--chat-template that renders them"
            )
        try:
            return await asyncio.to_thread(
                render_chat,
                self.tokenizer,
                conversation,
                chat_template=template or self.options.chat_template,
                add_generation_prompt=getattr(body, "add_generation_prompt", True),
                continue_final_message=getattr(body, "continue_final_message", False),
                tools=tools,
                documents=getattr(body, "documents", None),
                chat_template_kwargs=variables,
                content_format=self.options.chat_template_content_format,
                model_name=f"the model {self.model_name}",
            )
        except APIError:
            raise
        except Exception as exc:  # template errors (jinja's, sandbox violations) are the request's fault
            raise bad_request(
                f"the chat template could not be applied: {type(exc).__name__}: {exc}", "messages"
            ) from None

    def _check_template_kwargs(self, kwargs: Mapping[str, Any], template: str | None) -> None:
        """Only variables the chat template reads may be set (``enable_thinking``), so a request
        cannot reach transformers' own arguments (``tokenize``) or anything else."""
        from llmp.chat_template import template_variables

        known = template_variables(self.tokenizer, template or self.options.chat_template)
        unknown = sorted(set(kwargs) - known)
        if unknown:
            allowed = ", ".join(sorted(known)) or "none"
            raise bad_request(
                f"chat_template_kwargs {', '.join(map(repr, unknown))} are not variables of the chat "
                f"template (it reads: {allowed}); start the server with "
                "--trust-request-chat-template to pass others",
                "chat_template_kwargs",
            )

    def truncation_limit(self, truncate_prompt_tokens: int | None) -> int | None:
        """The tokens a prompt keeps under vLLM's ``truncate_prompt_tokens`` (None: all; -1: the context
        length); 0, below -1 or above the context length is a 400."""
        try:
            return truncation_length(truncate_prompt_tokens, self.max_model_len)
        except ScoreInputError as exc:
            raise bad_request(exc.message, exc.param) from None

    def engine_prompt(
        self, prompt: Prompt, *, truncate_prompt_tokens: int | None = None, cache_salt: str | None = None
    ) -> Prompt:
        """A generation prompt as the engine runs it: cut to its last ``truncate_prompt_tokens`` tokens
        (:meth:`last_tokens`; it then runs as token ids, its text no longer matching) and salted with
        ``cache_salt`` (``Prompt.cache_salt``; an empty salt is a 400)."""
        if cache_salt == "":
            raise bad_request("cache_salt must be a non-empty string if provided", "cache_salt")
        keep = self.truncation_limit(truncate_prompt_tokens)
        if keep is not None and len(prompt.token_ids) > keep:
            prompt = Prompt(token_ids=self.last_tokens(prompt, keep))
        return replace(prompt, cache_salt=cache_salt)

    def last_tokens(self, prompt: Prompt, keep: int) -> list[int]:
        """A prompt's token ids cut to ``keep`` as vLLM cuts them: a text's start is cut and the special
        tokens its tokenizer put around it (``[CLS] ... [SEP]``, a BOS) stay; ids given as ids keep
        their last ``keep`` (:func:`llmp.inputs.last_tokens`)."""
        ids = prompt.token_ids or []
        cut_text = prompt.text is not None and len(ids) > keep
        return last_tokens(
            ids, keep, self.tokenizer.encode(prompt.text, add_special_tokens=False) if cut_text else None
        )

    async def prompt_inputs(self, value: Any, param: str, add_special_tokens: bool) -> list[Prompt]:
        """The engine's prompt of each item of a ``str | list[str] | list[int] | list[list[int]]``
        field: its token ids, and its text when it was given as text."""
        if isinstance(value, str) or (value and all(isinstance(t, int) for t in value)):
            value = [value]
        if not value:
            raise bad_request(f"{param} must not be empty", param)
        prompts = []
        for item in value:
            if isinstance(item, str):
                if not is_unicode(item):  # JSON may carry a lone surrogate ("\ud800"), which no tokenizer takes
                    raise bad_request(f"{param} holds text that is not valid Unicode (a lone surrogate)", param)
                text, ids = item, await self.encode(item, add_special_tokens)
            else:
                self.check_token_ids(item, param)
                text, ids = None, list(item)
            if not ids or item == "":  # "" is empty even when the tokenizer adds BOS/CLS
                raise bad_request(f"{param} must not hold an empty string or list", param)
            prompts.append(Prompt(text, ids))
        return prompts

    async def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return await asyncio.to_thread(self.tokenizer.encode, text, add_special_tokens=add_special_tokens)


STRUCTURED_OUTPUT_FIELDS = {
    "json",
    "regex",
    "choice",
    "grammar",
    "json_object",
    "structural_tag",
    "disable_any_whitespace",
    "after_token_ids",
}


@dataclass
class OutputPlan:
    """Which parsers turn a chat completion into reasoning, content and tool calls."""

    reasoning_parser: Any = None
    in_reasoning: bool | None = None
    include_reasoning: bool = True
    tool_parser: Any = None
    tools: list[Mapping[str, Any]] | None = None
    named: bool = False  # a named tool_choice: the call ends with finish_reason "stop", as in OpenAI
    max_tool_calls: int | None = None  # the calls past it are dropped (1 when parallel_tool_calls is false)

    def message_stream(self) -> Any:
        from llmp.parsing import MessageStream

        return MessageStream(
            self.reasoning_parser,
            self.tool_parser,
            in_reasoning=self.in_reasoning,
            tools=self.tools or (),
            max_tool_calls=self.max_tool_calls,
        )

    def finish_reason(self, reason: str | None, called: Any) -> str | None:
        """``tool_calls`` for a completion that stopped on its own after calling tools. ``called``: whether
        it did, or its :class:`~llmp.parsing.MessageStream` after the final feed, whose calls count only
        when whole: a stop string (or the end) cutting a call short leaves the reason ``stop``, as vLLM
        returns a call it cannot parse as content."""
        if not isinstance(called, bool):
            called = bool(called.sent.tool_calls) and called.calls_whole
        return "tool_calls" if reason == "stop" and called and not self.named else reason

    def reasoning_tokens(self, output_token_ids: Sequence[int]) -> int | None:
        """How many of an output's tokens are reasoning (between the parser's markers, which are not
        counted; from the first token when the prompt opened the reasoning), as vLLM counts them: None
        without a reasoning parser."""
        parser = self.reasoning_parser
        if parser is None:
            return None
        start = list(getattr(parser, "start_token_ids", ()))
        inside = starts_inside(parser, self.in_reasoning)
        return count_reasoning_tokens(list(output_token_ids), start, list(parser.end_token_ids), inside)


def starts_inside(parser: Any, prompt_state: bool | None) -> bool:
    """Whether a completion starts inside the reasoning: the prompt opened it, or the parser assumes
    it open (deepseek_r1's), as its parse of an empty prefix says."""
    return parser.parse("", final=False, in_reasoning=prompt_state).reasoning is not None


def tool_name(tool: Mapping[str, Any]) -> str | None:
    function = tool.get("function") if isinstance(tool, Mapping) else None
    name = function.get("name") if isinstance(function, Mapping) else None
    return name if isinstance(name, str) and name else None


def tool_parameters(tool: Mapping[str, Any]) -> dict[str, Any]:
    schema = (tool.get("function") or {}).get("parameters")
    return schema if isinstance(schema, dict) and schema else {"type": "object", "properties": {}}


def _check_parameters(tools: Sequence[Mapping[str, Any]], named: str | None) -> None:
    """A forced tool's parameters must be a valid JSON schema: a 400 naming ``tools[i].function.parameters``."""
    from llmp.engine.structured_output import checked_schema, without_unenforced

    for index, tool in enumerate(tools):
        if named is not None and tool_name(tool) != named:
            continue
        try:  # what cannot be enforced is left out of the constraint (forced_parameters), not refused
            checked_schema(without_unenforced(tool_parameters(tool)))
        except ValueError as exc:
            param = f"tools[{index}].function.parameters"
            raise bad_request(f"{param}: {exc}", param) from None


def forced_parameters(tool: Mapping[str, Any]) -> dict[str, Any]:
    """The schema a forced call's arguments are held to: the tool's parameters less what structured
    outputs cannot enforce (``uniqueItems``, ``not`` ...), left out with a warning naming it."""
    from llmp.engine.structured_output import unenforced_keywords, without_unenforced

    parameters = tool_parameters(tool)
    unenforced = unenforced_keywords(parameters)
    if not unenforced:
        return parameters
    shown = ", ".join(f"{keyword} (at {where or 'the top'})" for where, keyword in unenforced)
    log.warning("tool %r: a forced call's arguments are not held to %s", tool_name(tool), shown)
    return without_unenforced(parameters)


def required_calls_schema(tools: Sequence[Mapping[str, Any]], parallel: bool) -> dict[str, Any]:
    """A JSON array of calls, each one of the tools with arguments fitting its schema (as vLLM forces it;
    :func:`forced_parameters`). Each tool's ``$defs`` (``definitions``) move to the root, where its
    ``#/$defs/...`` references point once its parameters are nested (vLLM's ``get_tool_schema_defs``)."""
    calls, defs = [], {}
    for tool in tools:
        parameters = dict(forced_parameters(tool))
        for key in ("$defs", "definitions"):
            for name, definition in (parameters.pop(key, None) or {}).items():
                if defs.setdefault(key, {}).setdefault(name, definition) != definition:
                    raise bad_request(f"tools define {key}/{name} differently: give them distinct names", "tools")
        calls.append(
            {
                "type": "object",
                "properties": {"name": {"type": "string", "enum": [tool_name(tool)]}, "parameters": parameters},
                "required": ["name", "parameters"],
            }
        )
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": calls}, **defs}
    if not parallel:
        schema["maxItems"] = 1
    return schema


def packaged_aliases(served_names: Sequence[str]) -> dict[str, str]:
    """The other names of a served packaged model (its Hub id and Ollama tags, each also with
    ``:latest``, as Ollama lists them: ``smollm2:135m``) -> the served name: a request may give any
    of them, as Ollama's OpenAI API takes the names its ``/api/tags`` lists."""
    from llmp.model_files.packaged import packaged_model

    aliases: dict[str, str] = {}
    for served in served_names:
        packaged = packaged_model(served)
        for name in (packaged.hub_id, *packaged.aliases) if packaged else ():
            tagged = name if ":" in name.rsplit("/", 1)[-1] else f"{name}:latest"
            for form in (name, tagged):
                if form not in served_names:
                    aliases.setdefault(form, served)
    return aliases


def _load_parser(kind: str, name: str | None, tokenizer: Any) -> Any:
    if not name:
        return None
    from llmp import registry

    return registry.load_component(kind, name)(tokenizer)


_MARKER = re.compile("\ue000llmp(\\d+)\ue001")


def _with_texts(message: dict[str, Any], change: Callable[[Any], Any]) -> dict[str, Any]:
    """The message with ``change`` applied to its content's text, or to each text part's."""
    content = message.get("content")
    if isinstance(content, list):
        return {**message, "content": [{**part, "text": change(part.get("text", ""))} for part in content]}
    return {**message, "content": change(content)}


def marker(index: int) -> str:
    return f"\ue000llmp{index}\ue001"  # private-use characters: no text or template makes them


def control_texts(tokenizer: Any) -> list[str]:
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    texts = {t.content for t in added.values() if getattr(t, "special", False)}
    texts.update(getattr(tokenizer, "all_special_tokens", []) or [])
    return sorted(t for t in texts if t)


def field_error(exc: RequestValidationError, names: Mapping[str, str]) -> APIError:
    """The 400 of an invalid field, named (in ``param`` and the message) as the request spells it."""
    param = names.get(exc.field, exc.field)
    return bad_request(exc.message_for(param), param)


def reasoning_variables(effort: str | None, kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
    """The chat-template variables of a request's ``reasoning_effort`` (as vLLM sets them): the value
    itself, and ``enable_thinking`` (off for ``none``) unless ``chat_template_kwargs`` sets it."""
    if effort is None:
        return {}
    variables: dict[str, Any] = {"reasoning_effort": effort}
    if "enable_thinking" not in (kwargs or {}):
        variables["enable_thinking"] = effort != "none"
    return variables


def engine_request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"
