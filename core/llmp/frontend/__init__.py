"""The front-end kit: what a front-end plugin (:class:`llmp.api.Frontend`) builds on.

- :class:`FrontendKit`: the engine client, the served names and limits, and the shared
  request handling: checks (model name, token ids, caps, stop strings), prompts as
  :class:`llmp.Prompt` records (``prompt_inputs``, ``conversation_prompt``: chat templates
  rendered with special-token text kept literal), the one way a request becomes
  ``SamplingParams`` (``sampling_params`` from a :class:`SamplingRequest`), tools, reasoning
  and structured outputs (``output_plan``, :class:`OutputPlan`).
- Models and LoRA adapters: ``FrontendKit.lora_for`` (the adapter a request's ``model`` names:
  pass it as ``lora_request``), ``response_model``, ``model_cards`` (``/v1/models``),
  ``load_adapter``/``unload_adapter``/``pin_adapter`` (run-time loads with vLLM's texts);
  :func:`load_lora_modules` (``--lora-modules`` of a command running its own engine),
  :class:`FilesystemResolver` and :func:`load_resolvers` (``llmp_register_lora_resolvers``).
- Errors: raise :class:`APIError` (``bad_request`` for a 400); :func:`as_api_error` turns any
  other failure into one (a :class:`llmp.api.RequestValidationError` into a 400 naming its field).
  :func:`error_body` is the OpenAI error object; :func:`validation_message` sums up pydantic's errors.
- HTTP handlers: :func:`until_disconnected` (cancel work when the client leaves),
  :func:`request_id_of` (the response's ``X-Request-Id``), :func:`handling` (engine requests
  logged and traced as made for a request the front-end handles itself), :func:`engine_request_id`,
  :func:`json_text` (a stream event's JSON).
- A front-end run by its own command (``llmp mcp``): :func:`read_chat_template`,
  :func:`served_model_names` and :func:`frontend_options` build its
  :class:`~llmp.options.FrontendOptions` as ``llmp serve`` does; :func:`render_chat`
  renders a conversation with the model's chat template; :func:`template_variables` and
  :func:`read_variables` tell which variables it reads (``"tools" in read_variables(...)``:
  tool definitions reach the model).
- A front-end's data and long work: :func:`cache_dir` (llmp's cache, ``LLMP_CACHE_DIR``),
  :func:`progress_bar` (a bar on stderr, as llmp draws its own).
- Model names: :func:`packaged_model` (the packaged model a name or alias such as
  ``smollm2:135m`` selects) and :func:`installed_packaged_models`, for front-ends that accept
  the names people type (Ollama's tags).
- Truncation: :func:`special_tokens_around` (the special tokens a tokenizer put around a text's
  own ids; ``FrontendKit.last_tokens`` cuts a prompt as vLLM does).
- Scoring (:mod:`llmp.scoring`, shared with ``LLM.score``): :func:`validate_score_input`,
  :class:`ScoreInputError`, :func:`cross_encoder_prompts`, :func:`text_prompt`,
  :func:`truncation_length`, :func:`cosine_scores`, :func:`rerank_order`.

Importing this package loads no torch and no web framework.
"""

from __future__ import annotations

from llmp.chat_template import read_variables, render_chat, template_variables
from llmp.frontend.errors import APIError, as_api_error, bad_request, error_body, validation_message
from llmp.frontend.http import handling, request_id_of, until_disconnected
from llmp.frontend.kit import (
    REASONING_EFFORTS,
    FrontendKit,
    OutputPlan,
    ReasoningEffort,
    SamplingRequest,
    engine_request_id,
    json_text,
)
from llmp.frontend.lora import FilesystemResolver, load_lora_modules, load_resolvers
from llmp.frontend.startup import frontend_options, read_chat_template, served_model_names
from llmp.frontend.token_bytes import TokenBytes
from llmp.inputs import special_tokens_around
from llmp.model_files import cache_dir
from llmp.model_files.gguf import gguf_file_type, gguf_parameter_count, gguf_source
from llmp.model_files.packaged import PackagedModel, installed_packaged_models, packaged_model
from llmp.progress import progress_bar
from llmp.scoring import (
    ScoreInputError,
    cosine_scores,
    cross_encoder_prompts,
    rerank_order,
    text_prompt,
    truncation_length,
    validate_score_input,
)

__all__ = [
    "REASONING_EFFORTS",
    "APIError",
    "FilesystemResolver",
    "FrontendKit",
    "OutputPlan",
    "PackagedModel",
    "ReasoningEffort",
    "SamplingRequest",
    "ScoreInputError",
    "TokenBytes",
    "as_api_error",
    "bad_request",
    "cache_dir",
    "cosine_scores",
    "cross_encoder_prompts",
    "engine_request_id",
    "error_body",
    "frontend_options",
    "gguf_file_type",
    "gguf_parameter_count",
    "gguf_source",
    "handling",
    "installed_packaged_models",
    "json_text",
    "load_lora_modules",
    "load_resolvers",
    "packaged_model",
    "progress_bar",
    "read_variables",
    "read_chat_template",
    "render_chat",
    "request_id_of",
    "rerank_order",
    "served_model_names",
    "special_tokens_around",
    "template_variables",
    "text_prompt",
    "truncation_length",
    "until_disconnected",
    "validate_score_input",
    "validation_message",
]
