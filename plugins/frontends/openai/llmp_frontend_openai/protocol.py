"""Request bodies of the OpenAI API, with vLLM's extra fields.

Unknown fields are accepted, as OpenAI clients send vendor keys freely, and
named in a warning in the server's log (vLLM does the same); every declared
field is acted on or refused with a 400. Values are range-checked by
``SamplingParams`` (one place for the rules), not here; here only types and the
int64 range of ``seed``.
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator, model_validator

from llmp.frontend import ReasoningEffort

INT64 = 2**63
log = logging.getLogger("llmp.frontend.openai")


class OpenAIModel(BaseModel):
    model_config = ConfigDict(extra="allow", protected_namespaces=())
    extras_read: ClassVar[bool] = False  # True where the unknown fields are passed on (a message's, to the template)

    @model_validator(mode="after")
    def _warn_of_ignored_fields(self) -> OpenAIModel:
        if self.model_extra and not self.extras_read:
            log.warning(
                "The following fields were present in the request but ignored: %s", ", ".join(sorted(self.model_extra))
            )
        return self


class StreamOptions(OpenAIModel):
    include_usage: bool | None = None
    continuous_usage_stats: bool | None = None


class SamplingFields(OpenAIModel):
    """Sampling fields shared by chat and completions (OpenAI's, then vLLM's extras)."""

    model: str | None = None
    frequency_penalty: float | None = 0.0
    presence_penalty: float | None = 0.0
    logit_bias: dict[str, float] | None = None
    n: StrictInt | None = 1
    seed: StrictInt | None = Field(None, ge=-INT64, le=INT64 - 1)
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    user: str | None = None
    # vLLM's sampling extras
    top_k: StrictInt | None = None
    min_p: float | None = None
    typical_p: float | None = None  # llama.cpp server's: locally typical sampling
    repetition_penalty: float | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: int = 0
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    prompt_logprobs: StrictInt | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None  # banned from the output (as token sequences)
    echo: bool | None = False  # null is false, as vLLM's
    return_token_ids: bool = False
    priority: int = Field(0, ge=-INT64, le=INT64 - 1)
    request_id: str | None = None
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    cache_salt: str | None = None  # keys the prompt's prefix-cache blocks (Prompt.cache_salt)
    # older vLLM's names of structured_outputs' json, regex, choice and grammar (taken as those)
    guided_json: Any = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    # vLLM's fields for what llmp does not do: accepted at their defaults, refused with a 400 when set
    use_beam_search: bool = False
    length_penalty: float = 1.0  # beam search's
    thinking_token_budget: StrictInt | None = None
    repetition_detection: dict[str, Any] | None = None
    kv_transfer_params: dict[str, Any] | None = None
    vllm_xargs: dict[str, Any] | None = None


class ChatMessage(OpenAIModel):
    extras_read = True  # tool_calls, tool_call_id, reasoning_content...: the chat template reads them
    role: str
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None  # an assistant's calls: objects, each naming its function

    @field_validator("tool_calls")
    @classmethod
    def _calls_name_their_function(cls, calls: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        for call in calls or ():
            function = call.get("function")
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                raise ValueError("each call must be an object whose function holds its name")
        return calls


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage]
    logprobs: bool | None = False
    top_logprobs: StrictInt | None = None
    max_tokens: StrictInt | None = None
    max_completion_tokens: StrictInt | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = True
    reasoning_effort: ReasoningEffort | None = None  # a chat-template variable (gpt-oss, Qwen, Granite read it)
    include_reasoning: bool = True
    modalities: list[str] | None = None  # ["text"] only: no audio out
    # OpenAI's fields for what llmp does not do: refused with a 400 when set (frontend.NOT_DONE)
    functions: list[dict[str, Any]] | None = None
    function_call: Any = None
    audio: dict[str, Any] | None = None
    # vLLM's prompt-building extras
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    documents: list[dict[str, str]] | None = None
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    truncate_prompt_tokens: StrictInt | None = Field(None, ge=-1)  # keep the last N prompt tokens; -1 = max_model_len
    return_tokens_as_token_ids: bool | None = None  # logprob tokens as 'token_id:N' (or the server's flag)


class BatchChatCompletionRequest(ChatCompletionRequest):
    """``/v1/chat/completions/batch``: ``messages`` is a list of conversations."""

    messages: list[list[ChatMessage]]  # type: ignore[assignment]


class GenerateRequest(OpenAIModel):
    """vLLM's ``GenerateRequest`` (``/inference/v1/generate``): what the render routes answer."""

    request_id: str | None = None
    token_ids: list[StrictInt]
    sampling_params: dict[str, Any]  # required, as in vLLM ({} takes every default)
    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    cache_salt: str | None = None
    priority: int = Field(0, ge=-INT64, le=INT64 - 1)
    prompt: str | None = None  # the render routes' text of token_ids: a description, token_ids run
    features: Any = None  # multimodal inputs: refused when set
    kv_transfer_params: dict[str, Any] | None = None  # refused when set: llmp has no KV transfer


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: StrictInt | None = None
    max_tokens: StrictInt | None = 16
    suffix: str | None = None
    best_of: StrictInt | None = None
    add_special_tokens: bool = True
    truncate_prompt_tokens: StrictInt | None = Field(None, ge=-1)  # keep the last N prompt tokens; -1 = max_model_len
    return_tokens_as_token_ids: bool | None = None  # logprob tokens as 'token_id:N' (or the server's flag)
    prompt_embeds: Any = None  # refused when set: llmp's models take token ids


class TokenizeRequest(OpenAIModel):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    tools: list[dict[str, Any]] | None = None
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_strs: bool = False


class DetokenizeRequest(OpenAIModel):
    model: str | None = None
    tokens: list[int]


class Reasoning(OpenAIModel):
    effort: ReasoningEffort | None = None  # a chat-template variable, as chat's reasoning_effort
    summary: str | None = None  # the reasoning is returned whole (reasoning_text), never summarised


class ResponsesRequest(SamplingFields):
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    conversation: Any = None  # OpenAI's Conversations API: refused (frontend.NOT_DONE)
    max_output_tokens: StrictInt | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = True
    max_tool_calls: StrictInt | None = None  # the function calls past it are dropped
    text: dict[str, Any] | None = None
    reasoning: Reasoning | None = None
    store: bool = True
    background: bool = False
    previous_response_id: str | None = None
    include: list[str] | None = None
    top_logprobs: StrictInt | None = None
    metadata: dict[str, str] | None = None
    # llmp has one tier: any is taken, and the response says "default" (the tier it ran on), as OpenAI reports it
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = "auto"
    # "auto": the oldest items of the conversation are dropped until it fits the context
    truncation: Literal["auto", "disabled"] | None = "disabled"

    @property
    def reasoning_effort(self) -> str | None:
        """``reasoning.effort``, which the chat template reads as chat's ``reasoning_effort``."""
        return self.reasoning.effort if self.reasoning is not None else None


# -- pooling: /score, /rerank, /classify, /pooling (vLLM's shapes) ---------------------

ScoreTexts = str | list[str]


class PoolingFields(OpenAIModel):
    """Fields every pooling request shares."""

    model: str | None = None
    user: str | None = None
    truncate_prompt_tokens: StrictInt | None = Field(None, ge=-1)  # keep the last N tokens; -1 = max_model_len
    priority: int = Field(0, ge=-INT64, le=INT64 - 1)
    request_id: str | None = None
    use_activation: bool | None = None  # False: raw logits
    activation: bool | None = None  # vLLM 0.10's name of use_activation
    softmax: bool | None = None  # vLLM 0.10's name of use_activation (classification)
    truncation_side: str | None = None  # vLLM's; truncate_prompt_tokens keeps a prompt's end, so "left" only

    @field_validator("truncation_side")
    @classmethod
    def _left_only(cls, side: str | None) -> str | None:
        if side not in (None, "left"):
            raise ValueError(f"{side!r} is not supported: truncate_prompt_tokens keeps the prompt's end (left)")
        return side

    def activation_param(self) -> str | None:
        """The name the request set ``use_activation`` by (vLLM's, or an older one), if any."""
        return next((n for n in ("use_activation", "activation", "softmax") if getattr(self, n) is not None), None)

    def activation_setting(self) -> bool | None:
        """``use_activation``, or the older name the request used."""
        param = self.activation_param()
        return None if param is None else getattr(self, param)


class ScoringFields(PoolingFields):
    """What ``/score`` and ``/rerank`` share (vLLM's): each query and each document cut to its first
    N tokens before they are paired; 0 or null, not cut."""

    max_tokens_per_query: StrictInt | None = Field(None, ge=0)
    max_tokens_per_doc: StrictInt | None = Field(None, ge=0)
    # an LLM reranker's score template variables; instruction is one (vLLM's), under the mapping's own
    instruction: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    def template_variables(self) -> tuple[dict[str, Any], str | None]:
        """The score template's variables, and the field that set them (for a 400), if any."""
        variables = {**({"instruction": self.instruction} if self.instruction is not None else {})}
        variables.update(self.chat_template_kwargs or {})
        field = "chat_template_kwargs" if self.chat_template_kwargs else "instruction" if variables else None
        return variables, field


class ScoreRequest(ScoringFields):
    """``/score``: the pairs as ``text_1``/``text_2``, ``queries``/``documents`` (or ``items``), or
    ``data_1``/``data_2``; each a text or a list of texts (1:1, 1:N or N:N)."""

    text_1: ScoreTexts | None = None
    text_2: ScoreTexts | None = None
    queries: ScoreTexts | None = None
    documents: ScoreTexts | None = None
    items: ScoreTexts | None = None
    data_1: ScoreTexts | None = None
    data_2: ScoreTexts | None = None


class RerankRequest(ScoringFields):
    """``/rerank``, ``/v1/rerank`` (Jina, Cohere v1) and ``/v2/rerank`` (Cohere v2)."""

    query: str
    documents: str | list[str | dict[str, Any]]  # one document may come bare (vLLM's)
    top_n: StrictInt | None = 0  # 0 or less (or null): every document
    return_documents: bool | None = True
    rank_fields: list[str] | None = None  # the fields of object documents to rank on, joined by newlines
    max_chunks_per_doc: Any = None  # Cohere v1's chunking of long documents: refused unless null
    relevant_spans: bool | None = None  # Cohere's spans of each document: refused when true


class CohereContent(OpenAIModel):
    type: str
    text: str | None = None
    image_url: Any = None


class CohereInput(OpenAIModel):
    content: list[CohereContent]


class CohereEmbedRequest(OpenAIModel):
    """Cohere's ``/v2/embed`` and ``/v1/embed`` (their fields as Cohere's API has them, and ``priority``)."""

    model: str | None = None
    texts: list[str] | None = None
    images: list[str] | None = None
    inputs: list[CohereInput] | None = None
    input_type: str | None = None
    embedding_types: list[str] | None = None
    truncate: Literal["NONE", "START", "END"] = "END"
    max_tokens: StrictInt | None = Field(None, ge=1)
    output_dimension: StrictInt | None = None
    priority: int = Field(0, ge=-INT64, le=INT64 - 1)


class ClassificationRequest(PoolingFields):
    """``/classify``: ``input`` (texts or token ids) or ``messages`` (one chat, rendered by the chat template)."""

    input: str | list[str] | list[int] | list[list[int]] | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None  # default: True for input, False for messages (the template has them)
    add_generation_prompt: bool = False
    continue_final_message: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class EmbeddingRequest(ClassificationRequest):
    """``/v1/embeddings``: vLLM's ``EmbeddingCompletionRequest`` (``input``) and ``EmbeddingChatRequest``
    (``messages``). ``use_activation`` is vLLM's newer name of ``normalize`` here; ``embed_dtype`` and
    ``endianness`` shape the bytes of ``encoding_format: base64``."""

    dimensions: StrictInt | None = None
    normalize: bool | None = None
    encoding_format: Literal["float", "base64"] = "float"
    embed_dtype: Literal["float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2"] = "float32"
    endianness: Literal["native", "big", "little"] = "native"


class PoolingRequest(EmbeddingRequest):
    """``/pooling``: the raw pooled output of ``task`` (default: the model's primary pooling task)."""

    task: Literal["embed", "classify", "token_embed", "token_classify"] | None = None


class LoadLoRAAdapterRequest(OpenAIModel):
    """vLLM's ``POST /v1/load_lora_adapter`` body (and ``POST /v1/loras``, which adds ``pin``).
    Missing names are vLLM's 400 ("Both 'lora_name' and 'lora_path' must be provided."), not a
    validation error."""

    lora_name: str = ""
    lora_path: str = ""
    base_model_name: str | None = None  # the served model it was trained on (checked when given)
    load_inplace: bool = False  # replace an adapter of this name (a new load: no stale cache hits)
    pin: bool = False  # /v1/loras only: never evicted from the CPU cache


class UnloadLoRAAdapterRequest(OpenAIModel):
    """vLLM's ``POST /v1/unload_lora_adapter`` body; ``lora_int_id`` is accepted and unused (names
    identify adapters, as vLLM's handler does)."""

    lora_name: str = ""
    lora_int_id: int | None = None
