"""The offline Python API: ``LLM(model).generate(prompts, params)`` and ``.chat(messages)``; for pooling
models ``.embed``, ``.classify``, ``.score``, ``.reward`` and the general ``.encode``, as vLLM."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from llmp.beam_search import BeamSearchOutput, BeamSearchParams
from llmp.chat_template import ContentFormat, Conversation
from llmp.inputs import Prompt, PromptType, as_prompt
from llmp.lora import LoRARequest
from llmp.options import EngineConfig, sampling_defaults
from llmp.outputs import (
    ClassificationRequestOutput,
    EmbeddingRequestOutput,
    PoolingOutput,
    PoolingRequestOutput,
    RequestOutput,
    ScoringOutput,
    ScoringRequestOutput,
)
from llmp.pooling_params import PoolingParams, PoolingTask
from llmp.progress import bars_enabled, configure_logging
from llmp.sampling_params import SamplingParams

# one adapter for every prompt, or one (or None: the base model) per prompt, as vLLM
LoRARequests = LoRARequest | Sequence[LoRARequest | None] | None


class LLM:
    """An engine in this process, for batches of prompts.

    ``LLM()`` serves the default model (``llmp.options.DEFAULT_MODEL``). Any keyword of
    :class:`llmp.options.EngineConfig` is accepted, e.g. ``dtype``,
    ``max_model_len``, ``enable_prefix_caching``, ``max_num_seqs``, ``kernels``; with
    ``enable_lora=True`` (``max_loras``, ``max_lora_rank``, ``max_cpu_loras``) requests run with
    the LoRA adapter their ``lora_request`` names.

    Start-up is reported on stderr as in vLLM (see :mod:`llmp.progress`): INFO lines for
    each phase, a bar while weights load (on a terminal), a summary line; ``LLMP_LOG_LEVEL=warning``
    quiets it. The periodic statistics line is off here, as in vLLM's ``LLM``: turn it on by
    passing ``disable_log_stats`` as false.
    """

    def __init__(
        self,
        model: str | None = None,
        *,
        generation_config: str = "auto",
        override_generation_config: Mapping[str, Any] | None = None,
        **engine_options: Any,
    ) -> None:
        if generation_config not in ("auto", "vllm", "none") and not Path(generation_config).is_dir():
            raise ValueError(
                f"generation_config must be 'auto' (the model's generation_config.json), 'vllm' or 'none' "
                f"(no defaults), or a directory holding a generation_config.json; got {generation_config!r}"
            )
        error = None if override_generation_config is None else sampling_defaults(override_generation_config)
        if error is not None:
            raise ValueError(f"override_generation_config {error}")
        self.generation_config = generation_config
        self.override_generation_config = dict(override_generation_config or {})
        engine_options.setdefault("disable_log_stats", True)  # offline, the generate bar tells the progress
        config = EngineConfig(model=model, **engine_options)
        configure_logging()
        from llmp.engine.process_settings import apply_engine_process_settings

        apply_engine_process_settings()
        from llmp.engine.llm_engine import LLMEngine  # loads torch: after the settings
        from llmp.model_files.resolve import resolve_model

        self.engine = LLMEngine(config, resolve_model(config))
        self._ids = itertools.count()

    @property
    def llm_engine(self) -> Any:
        """The engine (:class:`~llmp.engine.llm_engine.LLMEngine`), under vLLM's name for it; also ``engine``."""
        return self.engine

    def get_tokenizer(self) -> Any:
        """transformers' tokenizer of the model, as vLLM's (the engine's own reads tokenizer.json without
        transformers where it can: llmp.model_files.tokenizer)."""
        from llmp.model_files.tokenizer import transformers_tokenizer

        return transformers_tokenizer(self.engine.tokenizer)

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: bool | Callable[..., Any] = True,
        lora_request: LoRARequests = None,
        priority: int | Sequence[int] | None = None,
    ) -> list[RequestOutput]:
        """Generate for every prompt (text, ``{"prompt_token_ids": [...]}`` or a
        :class:`~llmp.inputs.Prompt`); outputs in input order. ``lora_request``: the
        :class:`~llmp.LoRARequest` every prompt runs with, or one (or None) per prompt. ``priority``: one
        for every prompt or one per prompt (``--scheduling-policy priority``). ``use_tqdm``: a bar, or a
        ``tqdm``-like class to make it with (as vLLM)."""
        prompts = _prompt_list(prompts)
        if isinstance(priority, int) and not isinstance(priority, bool):
            priority = [priority] * len(prompts)
        if sampling_params is None:  # vLLM's: the model's generation_config.json defaults
            sampling_params = self.get_default_sampling_params()
        params = _params_per_prompt(sampling_params, len(prompts), SamplingParams)
        loras = _loras_per_prompt(lora_request, len(prompts))
        if isinstance(priority, str | bytes) or (priority is not None and not isinstance(priority, Sequence)):
            raise TypeError(f"priority must be a sequence of integers, one per prompt, got {priority!r}")
        if priority is not None and len(priority) != len(prompts):
            raise ValueError(f"priority has {len(priority)} entries for {len(prompts)} prompts")
        ids = []
        try:
            for i, (prompt, p, lora) in enumerate(zip(prompts, params, loras, strict=True)):
                request_id = str(next(self._ids))
                self.engine.add_request(
                    request_id, prompt, p, priority=priority[i] if priority else 0, lora_request=lora
                )
                ids.append(request_id)
        except Exception:
            self.engine.abort_request(ids)
            raise
        return self._run(ids, use_tqdm)

    def get_default_sampling_params(self) -> SamplingParams:
        """vLLM's: ``SamplingParams`` with the model's ``generation_config.json`` values (temperature,
        top_p, top_k, min_p, repetition_penalty; max_new_tokens as max_tokens), what :meth:`generate`
        and :meth:`chat` use when given none; ``SamplingParams()`` for a model without them, or when
        the ``LLM`` was made with ``generation_config="vllm"`` (or ``"none"``); with a directory, its
        ``generation_config.json``; ``override_generation_config``'s values over any of these (vLLM's)."""
        from llmp.model_files.config import generation_defaults

        source = self.generation_config
        model_dir = (
            None if source in ("vllm", "none") else str(self.engine.model.model_dir if source == "auto" else source)
        )
        defaults = generation_defaults(model_dir, "auto", self.override_generation_config)
        if "max_new_tokens" in defaults:
            defaults["max_tokens"] = defaults.pop("max_new_tokens")
        return SamplingParams(**defaults)

    def encode(
        self,
        prompts: PromptType | Sequence[PromptType],
        pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
        *,
        use_tqdm: bool = True,
        lora_request: LoRARequests = None,
        pooling_task: PoolingTask | None = None,
        truncate_prompt_tokens: int | None = None,
        tokenization_kwargs: Mapping[str, Any] | None = None,
    ) -> list[PoolingRequestOutput]:
        """The raw pooled output of every prompt, in input order (vLLM's general pooling call).

        ``pooling_task`` (``embed``, ``classify``, ``token_embed``, ``token_classify`` ...) sets
        the task of every request; None leaves each ``pooling_params.task``, and None there means
        the model's primary pooling task. ``outputs`` is a :class:`~llmp.outputs.PoolingOutput`:
        ``outputs.data`` is a vector, or one row per token for the token tasks. ``lora_request``:
        as in :meth:`generate`. ``truncate_prompt_tokens`` (vLLM's; -1: the context length) keeps each
        prompt's last N tokens, over what ``pooling_params`` say. ``tokenization_kwargs`` (vLLM 0.32's):
        ``truncate_prompt_tokens``, ``truncation`` (True: cut to ``max_length``, else the context),
        ``truncation_side`` ``"left"`` and ``add_special_tokens``; another key is a ValueError.
        """
        outputs = self._pool(
            prompts, pooling_params, pooling_task, use_tqdm, lora_request, truncate_prompt_tokens, tokenization_kwargs
        )
        return [o if isinstance(o.outputs, PoolingOutput) else replace(o, outputs=_raw(o.outputs)) for o in outputs]

    def embed(
        self,
        prompts: PromptType | Sequence[PromptType],
        pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
        *,
        use_tqdm: bool = True,
        lora_request: LoRARequests = None,
        truncate_prompt_tokens: int | None = None,
        tokenization_kwargs: Mapping[str, Any] | None = None,
    ) -> list[EmbeddingRequestOutput]:
        """One embedding per prompt (embedding models only), in input order:
        ``outputs.embedding`` is a list of floats. ``lora_request``, ``truncate_prompt_tokens`` and
        ``tokenization_kwargs``: as in :meth:`generate` and :meth:`encode`."""
        return self._pool(
            prompts, pooling_params, "embed", use_tqdm, lora_request, truncate_prompt_tokens, tokenization_kwargs
        )

    def classify(
        self,
        prompts: PromptType | Sequence[PromptType],
        *,
        pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
        use_tqdm: bool = True,
        lora_request: LoRARequests = None,
        truncate_prompt_tokens: int | None = None,
        tokenization_kwargs: Mapping[str, Any] | None = None,
    ) -> list[ClassificationRequestOutput]:
        """The class probabilities of every prompt (sequence classifiers), in input order:
        ``outputs.probs`` in label order (``config.id2label``); raw logits with
        ``PoolingParams(use_activation=False)``. ``lora_request``, ``truncate_prompt_tokens`` and
        ``tokenization_kwargs``: as in :meth:`generate` and :meth:`encode`."""
        return self._pool(
            prompts, pooling_params, "classify", use_tqdm, lora_request, truncate_prompt_tokens, tokenization_kwargs
        )

    def reward(
        self,
        prompts: PromptType | Sequence[PromptType],
        /,
        *,
        pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
        use_tqdm: bool = True,
        lora_request: LoRARequests = None,
        truncate_prompt_tokens: int | None = None,
        tokenization_kwargs: Mapping[str, Any] | None = None,
    ) -> list[PoolingRequestOutput]:
        """The per-token rewards of every prompt (task ``token_classify``): ``outputs.data`` holds
        one row of class scores per token, or per step token with ``PoolingParams(step_tag_id=...)``."""
        return self.encode(
            prompts,
            pooling_params,
            use_tqdm=use_tqdm,
            lora_request=lora_request,
            pooling_task="token_classify",
            truncate_prompt_tokens=truncate_prompt_tokens,
            tokenization_kwargs=tokenization_kwargs,
        )

    def score(
        self,
        data_1: str | Sequence[str],
        data_2: str | Sequence[str],
        /,
        *,
        truncate_prompt_tokens: int | None = None,
        use_tqdm: bool = True,
        pooling_params: PoolingParams | None = None,
        chat_template: str | None = None,
        lora_request: LoRARequest | None = None,
        tokenization_kwargs: Mapping[str, Any] | None = None,
    ) -> list[ScoringRequestOutput]:
        """The relevance score of every text pair, in pair order: ``outputs.score``.

        Pairs are 1-1, 1-N (the one ``data_1`` text against each of ``data_2``) or N-N. A
        cross-encoder (or an LLM reranker) reads each pair as one input; an embedding model
        scores the cosine of the two texts' embeddings, each distinct text embedded once.
        ``truncate_prompt_tokens`` cuts an over-long pair (-1: to ``max_model_len``); without it
        an over-long pair is an error. ``chat_template`` renders each pair as the messages
        ``query`` and ``document`` (LLM rerankers only, as vLLM). ``lora_request``: the adapter
        every pair is scored with.
        """
        from llmp import scoring

        if lora_request is not None and not isinstance(lora_request, LoRARequest):
            raise TypeError(f"lora_request must be a LoRARequest, got {type(lora_request).__name__}")
        options = self.engine.info.options
        self._check_score_support(options)
        params = pooling_params or PoolingParams()
        bi_encoder = options["score_mode"] == "bi-encoder"
        task = "embed" if bi_encoder else "score"
        if not bi_encoder and params.task == "classify":  # vLLM 0.32's name of a cross-encoder's scoring task
            params = replace(params, task=None)
        if params.task not in (None, task):
            raise ValueError(f"You cannot overwrite pooling_params.task={params.task!r} with {task!r}")
        if chat_template is not None and (bi_encoder or options["use_sep_token"]):
            raise ValueError(
                "chat_template applies only to LLM rerankers (a causal LM scoring a query and a document); "
                f"the model {self.engine.info.model} reads text pairs with its tokenizer's separator"
            )
        if truncate_prompt_tokens is None:
            truncate_prompt_tokens = params.truncate_prompt_tokens
        truncate_prompt_tokens, add_special_tokens = _tokenization(tokenization_kwargs, truncate_prompt_tokens)
        if add_special_tokens is not None:
            raise ValueError("tokenization_kwargs add_special_tokens: a pair is read with its tokenizer's own tokens")
        replace(params, truncate_prompt_tokens=truncate_prompt_tokens)  # PoolingParams checks the value
        # each prompt is cut to length and checked here, before any request is queued: the engine cuts nothing
        params = replace(params, task=task, truncate_prompt_tokens=None)
        queries, documents = scoring.validate_score_input(data_1, data_2)
        limits = {"truncate_prompt_tokens": truncate_prompt_tokens, "max_model_len": options["max_model_len"]}
        if bi_encoder:
            return self._bi_encoder_scores(queries, documents, params, limits, use_tqdm, lora_request)
        prompts = scoring.cross_encoder_prompts(
            self.engine.tokenizer,
            queries,
            documents,
            use_sep_token=options["use_sep_token"],
            chat_template=chat_template,
            **limits,
        )
        return self._pool(prompts, params, "score", use_tqdm, lora_request)

    def _check_score_support(self, options: Mapping[str, Any]) -> None:
        """vLLM's refusals, before any request is queued."""
        if "score" in options["supported_tasks"]:
            return
        if "classify" in options["supported_tasks"] and options.get("num_labels") != 1:
            raise ValueError("Scoring API is only enabled for num_labels == 1.")
        raise ValueError(
            "Score API is not supported by this model. "
            "Try converting the model using `--convert embed` or `--convert classify`."
        )

    def _bi_encoder_scores(
        self,
        queries: list[str],
        documents: list[str],
        params: PoolingParams,
        limits: dict[str, Any],
        use_tqdm: bool,
        lora_request: LoRARequest | None,
    ) -> list[ScoringRequestOutput]:
        """The cosine of each pair's embeddings (an embedding model), every distinct text embedded once."""
        from llmp import scoring

        prompts: dict[str, Prompt] = {}
        for name, texts in (("data_1", queries), ("data_2", documents)):
            for index, text in enumerate(texts):
                if text not in prompts:
                    what = f"{name}[{index}]"
                    prompts[text] = scoring.text_prompt(self.engine.tokenizer, text, what=what, param=name, **limits)
        pooled = self._pool(list(prompts.values()), params, "embed", use_tqdm, lora_request)
        embedded = dict(zip(prompts, pooled, strict=True))
        scores = scoring.cosine_scores(
            [embedded[q].outputs.embedding for q in queries], [embedded[d].outputs.embedding for d in documents]
        )
        pad = self.engine.tokenizer.pad_token_id or 0  # vLLM counts a pair as query + pad + document
        outputs = []
        for query, document, value in zip(queries, documents, scores, strict=True):
            first, second = embedded[query], embedded[document]
            outputs.append(
                PoolingRequestOutput(
                    request_id=f"{first.request_id}_{second.request_id}",
                    prompt=None,
                    prompt_token_ids=first.prompt_token_ids + [pad] + second.prompt_token_ids,
                    outputs=ScoringOutput(value),
                    num_cached_tokens=first.num_cached_tokens + second.num_cached_tokens,
                )
            )
        return outputs

    def _pool(
        self,
        prompts: PromptType | Sequence[PromptType],
        pooling_params: PoolingParams | Sequence[PoolingParams] | None,
        task: PoolingTask | None,
        use_tqdm: bool,
        lora_request: LoRARequests = None,
        truncate_prompt_tokens: int | None = None,
        tokenization_kwargs: Mapping[str, Any] | None = None,
    ) -> list[PoolingRequestOutput]:
        """Queue one pooling request per prompt (every prompt and parameter checked first), then run them."""
        prompts = _prompt_list(prompts)
        truncate_prompt_tokens, add_special_tokens = _tokenization(tokenization_kwargs, truncate_prompt_tokens)
        if add_special_tokens is not None:  # texts only: token ids are taken as given
            prompts = [
                p if p.token_ids is not None else replace(p, add_special_tokens=add_special_tokens) for p in prompts
            ]
        params = [self._task_params(p, task) for p in _params_per_prompt(pooling_params, len(prompts))]
        if truncate_prompt_tokens is not None:  # PoolingParams checks the value
            params = [replace(p, truncate_prompt_tokens=truncate_prompt_tokens) for p in params]
        loras = _loras_per_prompt(lora_request, len(prompts))
        for p in {p.task for p in params} - {None}:
            self._check_pooling_task(p)
        ids = []
        try:
            for prompt, p, lora in zip(prompts, params, loras, strict=True):
                request_id = str(next(self._ids))
                self.engine.add_request(request_id, prompt, pooling_params=p, lora_request=lora)
                ids.append(request_id)
        except Exception:
            self.engine.abort_request(ids)
            raise
        return self._run(ids, use_tqdm)

    @staticmethod
    def _task_params(params: PoolingParams, task: PoolingTask | None) -> PoolingParams:
        if task is None or params.task == task:
            return params
        if params.task is not None:
            raise ValueError(f"You cannot overwrite pooling_params.task={params.task!r} with pooling_task={task!r}")
        return replace(params, task=task)  # a copy: the caller's params stay as given

    def _check_pooling_task(self, task: str) -> None:
        """vLLM's refusals of a task the model cannot do (embed keeps the engine's own message)."""
        if task in ("classify", "token_classify") and task not in self.engine.info.options["supported_tasks"]:
            raise ValueError(
                "Classification API is not supported by this model. "
                "Try converting the model using `--convert classify`."
            )
        if task == "score":
            self._check_score_support(self.engine.info.options)

    def beam_search(
        self,
        prompts: PromptType | Sequence[PromptType],
        params: BeamSearchParams,
        *,
        lora_request: LoRARequests = None,
        use_tqdm: bool = False,
        concurrency_limit: int | None = None,
    ) -> list[BeamSearchOutput]:
        """vLLM's beam search (:mod:`llmp.beam_search`): each prompt's best ``params.beam_width``
        beams, best first; ``sequences[i].tokens`` holds the prompt and the generated tokens,
        ``text`` the generated text. ``lora_request``: as in :meth:`generate`. ``concurrency_limit``
        (vLLM's): search at most that many prompts at a time, the next ones when those are done."""
        from llmp.beam_search import BeamSearch, step_logprobs

        if not isinstance(params, BeamSearchParams):
            raise TypeError(f"params must be a BeamSearchParams, got {type(params).__name__}")
        prompts = _prompt_list(prompts)
        loras = _loras_per_prompt(lora_request, len(prompts))
        if concurrency_limit is not None:
            if isinstance(concurrency_limit, bool) or not isinstance(concurrency_limit, int) or concurrency_limit < 1:
                raise ValueError(f"concurrency_limit must be a positive integer, got {concurrency_limit!r}")
            if len(prompts) > concurrency_limit:
                return [
                    output
                    for start in range(0, len(prompts), concurrency_limit)
                    for output in self.beam_search(
                        prompts[start : start + concurrency_limit],
                        params,
                        lora_request=loras[start : start + concurrency_limit],
                        use_tqdm=use_tqdm,
                    )
                ]
        engine = self.engine
        search = BeamSearch(
            [engine.tokenize_prompt(prompt) for prompt in prompts],
            params,
            eos_token_ids=engine.eos_token_ids,
            max_model_len=engine.max_model_len,
            loras=loras,
            cache_salts=[prompt.cache_salt for prompt in prompts],
        )
        while beams := search.live():
            outputs = self.generate(
                [Prompt(token_ids=beam.tokens, cache_salt=beam.cache_salt) for beam in beams],
                search.step_params,
                use_tqdm=use_tqdm,
                lora_request=[beam.lora_request for beam in beams],
            )
            search.advance([step_logprobs(output) for output in outputs])
        return search.outputs(engine.tokenizer)

    def chat(
        self,
        messages: Conversation | Sequence[Conversation],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: bool | Callable[..., Any] = True,
        lora_request: LoRARequests = None,
        priority: int | Sequence[int] | None = None,
        chat_template: str | None = None,
        chat_template_content_format: ContentFormat = "auto",
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> list[RequestOutput]:
        """Render each conversation with the model's chat template, then generate (``lora_request``:
        one adapter for every conversation, or one per conversation). A message's content is text or
        OpenAI's list of text parts; ``chat_template_content_format`` is as in :func:`render_chat`."""
        if continue_final_message and add_generation_prompt:  # as transformers' apply_chat_template (and vLLM)
            raise ValueError(
                "continue_final_message and add_generation_prompt are not compatible: pass "
                "add_generation_prompt=False to continue the final message"
            )
        conversations = [messages] if messages and isinstance(messages[0], Mapping) else list(messages)
        prompts = [
            Prompt(text=text, add_special_tokens=False)  # the template already holds the special tokens
            for text in (
                self.render_chat(
                    c,
                    chat_template,
                    add_generation_prompt,
                    continue_final_message,
                    tools,
                    chat_template_kwargs,
                    content_format=chat_template_content_format,
                )
                for c in conversations
            )
        ]
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm, lora_request=lora_request, priority=priority)

    def render_chat(
        self,
        conversation: Conversation,
        chat_template: str | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        *,
        content_format: ContentFormat = "auto",
    ) -> str:
        """The prompt text of a conversation (transformers' renderer: a sandboxed Jinja environment;
        ``content_format``: how message content reaches the template, :func:`llmp.chat_template.render_chat`)."""
        from llmp.chat_template import render_chat

        return render_chat(
            self.engine.tokenizer,
            conversation,
            chat_template=chat_template,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            tools=tools,
            chat_template_kwargs=chat_template_kwargs,
            content_format=content_format,
            model_name=f"the model {self.engine.info.model}",
        )

    # -- LoRA adapters --------------------------------------------------------------

    def add_lora(self, lora_request: LoRARequest) -> bool:
        """Read and check an adapter now rather than at its first request (``LoRAAdapterNotFoundError``,
        ``InvalidLoRAAdapterError``); it stays in the CPU cache while there is room."""
        return self.engine.add_lora(lora_request)

    def remove_lora(self, lora_int_id: int) -> bool:
        """Forget an adapter (its requests in flight finish with it); False when it is not known."""
        return self.engine.remove_lora(lora_int_id)

    def list_loras(self) -> list[int]:
        """The ``lora_int_id`` of every adapter the engine holds."""
        return self.engine.list_loras()

    def pin_lora(self, lora_int_id: int) -> bool:
        """Keep an adapter in the CPU cache for good; False when it is not known."""
        return self.engine.pin_lora(lora_int_id)

    # -- sleep, prefix cache, profiles, worker calls (vLLM's) --------------------

    def sleep(self, level: int = 1) -> None:
        """Free the compute device until :meth:`wake_up`: level 1 moves the weights to host memory
        (on the CPU they stay) and frees the KV cache, level 2 discards the weights too (reloaded from
        the model files on wake). Meanwhile a request raises ``llmp.api.EngineSleepingError``."""
        self.engine.sleep(level)

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Bring back ``tags`` among ``"weights"`` and ``"kv_cache"`` (None: both); requests run
        again once both are back."""
        self.engine.wake_up(tags)

    def is_sleeping(self) -> bool:
        return self.engine.is_sleeping()

    def reset_prefix_cache(self) -> bool:
        """Forget the cached prompt blocks (between benchmark runs, say); whether it did."""
        return self.engine.reset_prefix_cache()

    def start_profile(self) -> None:
        """Start the torch profiler (``LLM(..., profiler_dir=DIR)``; a ``ValueError`` without it)."""
        self.engine.start_profile()

    def stop_profile(self) -> list[str]:
        """Stop the profiler; the Chrome-trace JSON files written (one per worker), for Perfetto."""
        return self.engine.stop_profile()

    def collective_rpc(
        self,
        method: str | Callable[..., Any],
        timeout: float | None = None,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> list[Any]:
        """Call ``method`` on every worker (a public method of :class:`llmp.executor.Worker`, or a
        function taking the worker first); the results, one per rank."""
        return self.engine.collective_rpc(method, timeout, args, kwargs)

    def _run(self, request_ids: list[str], use_tqdm: bool | Callable[..., Any]) -> list[RequestOutput]:
        finished: dict[str, RequestOutput] = {}
        progress: _Progress | _CallersBar | None = None
        if callable(use_tqdm):  # vLLM's: the caller's tqdm-like class makes the bar
            progress = _CallersBar(use_tqdm, len(request_ids))
        elif use_tqdm and len(request_ids) > 1 and bars_enabled():
            progress = _Progress(len(request_ids))
        try:
            while len(finished) < len(request_ids) and self.engine.has_unfinished_requests():
                for output in self.engine.step():
                    if output.finished:
                        finished[output.request_id] = output
                        if progress:
                            generated = output.outputs if isinstance(output, RequestOutput) else ()
                            progress.advance(sum(len(o.token_ids) for o in generated))
        except BaseException:
            self.engine.abort_request([r for r in request_ids if r not in finished])
            raise
        finally:
            if progress:
                progress.close()
        return [finished[r] for r in request_ids]

    def shutdown(self) -> None:
        self.engine.shutdown()

    def __del__(self) -> None:
        engine = self.__dict__.get("engine")
        try:
            if engine is not None:
                engine.shutdown()
        except Exception:  # interpreter teardown: hook modules may already be gone
            pass


def _params_per_prompt(params: Any, count: int, kind: type = PoolingParams) -> list[Any]:
    """One parameter record per prompt: the default, one for all, or a sequence of ``count``."""
    if params is None:
        return [kind()] * count
    if isinstance(params, kind):
        return [params] * count
    name = "sampling" if kind is SamplingParams else "pooling"
    if isinstance(params, Mapping) or not isinstance(params, Sequence):
        raise TypeError(f"{name}_params must be a {kind.__name__} or a list of them, got {type(params).__name__}")
    params = list(params)
    if len(params) != count:
        raise ValueError(f"got {len(params)} {name} params for {count} prompts")
    wrong = next((p for p in params if not isinstance(p, kind)), None)
    if wrong is not None:
        shown = type(wrong).__name__
        raise TypeError(f"{name}_params must be a {kind.__name__} or a list of them, got a {shown} in the list")
    return params


def _loras_per_prompt(lora_request: LoRARequests, count: int) -> list[LoRARequest | None]:
    """One adapter (or None) per prompt: the same for all, or a sequence of ``count``."""
    if lora_request is None or isinstance(lora_request, LoRARequest):
        return [lora_request] * count
    if isinstance(lora_request, str | bytes | Mapping) or not isinstance(lora_request, Sequence):
        raise TypeError(f"lora_request must be a LoRARequest or a list of them, got {type(lora_request).__name__}")
    loras = list(lora_request)
    if len(loras) != count:
        raise ValueError(f"got {len(loras)} LoRA requests for {count} prompts")
    bad = next((lora for lora in loras if lora is not None and not isinstance(lora, LoRARequest)), None)
    if bad is not None:
        raise TypeError(f"lora_request must hold LoRARequest or None items, got {type(bad).__name__}")
    return loras


def _raw(outputs: Any) -> PoolingOutput:
    """A typed output as vLLM's raw pooled output (a tensor in ``data``): a score is a vector of one."""
    data = outputs.data
    return PoolingOutput([data] if isinstance(data, float) else data)


def _tokenization(
    kwargs: Mapping[str, Any] | None, truncate_prompt_tokens: int | None
) -> tuple[int | None, bool | None]:
    """vLLM 0.32's ``tokenization_kwargs`` of the pooling calls, as llmp applies them: the prompts'
    ``truncate_prompt_tokens`` and ``add_special_tokens`` (None: unchanged). ``truncation`` True or
    ``"longest_first"`` cuts to ``max_length`` (else the context), False or ``"do_not_truncate"`` not
    at all; ``truncation_side`` may be ``"left"`` (llmp keeps a prompt's last tokens); any other key
    is a ValueError, where vLLM warns and ignores it."""
    if not kwargs:
        return truncate_prompt_tokens, None
    left = dict(kwargs)
    truncate = left.pop("truncate_prompt_tokens", truncate_prompt_tokens)
    max_length, truncation = left.pop("max_length", None), left.pop("truncation", None)
    if truncation in (True, "longest_first"):
        truncate = -1 if max_length is None else max_length
    elif truncation in (False, "do_not_truncate"):
        truncate = None
    elif truncation is not None:
        raise ValueError(f"tokenization_kwargs truncation must be True, 'longest_first' or False, got {truncation!r}")
    elif max_length is not None:
        raise ValueError("tokenization_kwargs max_length applies with truncation=True")
    side = left.pop("truncation_side", None)
    if side not in (None, "left"):
        raise ValueError(
            f"tokenization_kwargs truncation_side must be 'left' (llmp keeps the last tokens), got {side!r}"
        )
    add_special_tokens = left.pop("add_special_tokens", None)
    if left:
        raise ValueError(
            f"tokenization_kwargs {', '.join(sorted(left))}: not taken (llmp takes truncate_prompt_tokens, "
            "truncation, max_length, truncation_side and add_special_tokens)"
        )
    return truncate, add_special_tokens


def _prompt_list(prompts: PromptType | Sequence[PromptType]) -> list[Prompt]:
    """Every prompt as a :class:`Prompt`: a bad one is a TypeError before any is queued."""
    if isinstance(prompts, str | Mapping | Prompt):
        prompts = [prompts]
    return [as_prompt(prompt) for prompt in prompts]


class _CallersBar:
    """A bar made by the caller's ``use_tqdm`` (a ``tqdm``-like class, as vLLM takes it)."""

    def __init__(self, make: Callable[..., Any], total: int) -> None:
        self.bar = make(total=total, desc="Processed prompts", dynamic_ncols=True)
        self.tokens, self.started = 0, time.monotonic()

    def advance(self, tokens: int) -> None:
        self.tokens += tokens
        rate = self.tokens / max(time.monotonic() - self.started, 1e-9)
        self.bar.set_postfix_str(f"output: {rate:.1f} toks/s", refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


class _Progress:
    """A rich progress bar on stderr: prompts done and output tokens per second."""

    def __init__(self, total: int) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(
            TextColumn("Processed prompts"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[rate]}"),
            transient=False,
            console=Console(stderr=True, force_terminal=True),  # bars_enabled() said a bar is wanted
        )
        self.task = self.progress.add_task("generate", total=total, rate="")
        self.tokens = 0
        self.progress.start()

    def advance(self, tokens: int) -> None:
        self.tokens += tokens
        elapsed = self.progress.tasks[0].elapsed or 1e-9
        self.progress.update(self.task, advance=1, rate=f"output {self.tokens / elapsed:.1f} tok/s")

    def close(self) -> None:
        self.progress.stop()
