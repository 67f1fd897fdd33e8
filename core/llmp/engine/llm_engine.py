"""The synchronous engine: add requests, call ``step()``, collect outputs.

``step()`` is schedule -> execute -> update -> process outputs. Everything
the step touches is resolved at construction: no plugin lookups per step.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmp import plugins, registry
from llmp.api import EngineInfo, EngineSleepingError, FinishedRequestStats, ResolvedModel, SchedulerStats
from llmp.engine.core_share import CoreShareGovernor
from llmp.engine.device import kv_cache_blocks, resolve_device
from llmp.engine.model_runner import prepare_inputs
from llmp.engine.output_processor import OutputProcessor, RequestState
from llmp.engine.process_settings import release_freed_memory
from llmp.engine.request import Request, RequestStatus
from llmp.engine.sampler import SamplingBatch, bad_words_token_ids
from llmp.engine.scheduler import SchedulerConfig, check_priority
from llmp.engine.stat_loggers import StatLoggers
from llmp.engine.step_stats import IterationTokens, step_prompt_tokens
from llmp.engine.thinking_budget import ThinkingBudget
from llmp.engine.worker import WorkerCallError
from llmp.inputs import Prompt, PromptType, as_prompt, last_tokens
from llmp.lora import LORA_DISABLED, LoRARequest
from llmp.model_files.gguf import weights_quantization
from llmp.model_files.resolve import resolve_kv_cache_dtype
from llmp.modeling.decoder import as_pooling_model
from llmp.modeling.pooling import (
    POOLERS,
    TOKEN_POOLING_TASKS,
    classify_activation,
    default_pooler,
    finish_embedding,
    num_labels,
    score_activation,
)
from llmp.options import EngineConfig
from llmp.outputs import (
    ClassificationOutput,
    EmbeddingOutput,
    PoolingOutput,
    PoolingRequestOutput,
    RequestOutput,
    ScoringOutput,
)
from llmp.pooling_params import POOLING_TASKS, PoolingParams, check_dimensions, matryoshka_dimensions
from llmp.progress import engine_summary, human_bytes, isa_path
from llmp.sampling_params import SamplingParams, StructuredOutputsParams, resolve_max_tokens

if TYPE_CHECKING:
    from llmp.engine.lora import LoRAManager

log = logging.getLogger("llmp.engine")
# the pooling task of a request that names none, by the model's primary task
PRIMARY_POOLING_TASK = {"embed": "embed", "classify": "classify", "reward": "token_classify"}
DEFAULT_CPU_KV_CACHE_BYTES = 4 << 30  # the KV cache's memory on the CPU when kv_cache_memory_bytes is 0 (not given)
SLEEP_TAGS = ("weights", "kv_cache")  # what sleep() takes away and wake_up(tags) brings back, as vLLM's tags
# worker methods the engine drives itself: a collective_rpc call to one would leave it out of step with them
ENGINE_DRIVEN_WORKER_METHODS = frozenset(
    {"execute_model", "allocate_kv_cache", "profile_memory", "sleep", "wake_up", "start_profile", "stop_profile"}
)


class LLMEngine:
    """The engine of one model. ``model`` is resolved by the caller
    (``llmp.model_files.resolve.resolve_model(config)``), once."""

    def __init__(self, config: EngineConfig, model: ResolvedModel) -> None:
        import torch

        from llmp.model_files.tokenizer import load_tokenizer

        started = time.perf_counter()
        # resolved once, here in the engine's process; the executor and every worker get the result
        config = dataclasses.replace(config, device=resolve_device(config.device, model.dtype))
        self.config = config
        self.model = model
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        self.core_share = self._core_share_governor()
        self.pm = plugins.load_plugins()
        self.tokenizer = load_tokenizer(model.tokenizer)
        self.task = model.task  # the primary task
        self.supported_tasks = model.supported_tasks
        executor_cls = registry.load_component("executor", config.executor)
        self.lora = self._lora_manager()  # before the executor: a model LoRA cannot run on fails fast
        log.info("loading %s (%s, %s) on %s", model.name, model.architectures[0], model.dtype, config.device)
        self.executor = executor_cls(config, model)
        num_blocks = self._num_kv_blocks()
        self.max_model_len = self._max_model_len(num_blocks)
        if per_block := self.executor.bytes_per_block():  # an encoder has no cache to build
            log.info(
                "building the KV cache: %d blocks of %d tokens, %d tokens (%s)",
                num_blocks,
                config.block_size,
                num_blocks * config.block_size,
                human_bytes(num_blocks * per_block),
            )
        self.executor.allocate_kv_cache(num_blocks)
        # only "last"-pooled requests of a model with a KV cache (a causal LM) keep prefix caching and chunks
        self.has_kv_cache = per_block > 0
        self._setup_pooling()
        self.kv_manager = registry.load_component("kv_manager", config.kv_manager)(
            num_blocks, config.block_size, config.enable_prefix_caching
        )
        scheduler_config = SchedulerConfig.from_engine_config(config, self.max_model_len)
        if not config.enable_chunked_prefill and config.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                f"without chunked prefill, max_num_batched_tokens ({config.max_num_batched_tokens}) "
                f"must be >= max_model_len ({self.max_model_len})"
            )
        self.scheduler = registry.load_component("scheduler", config.scheduler)(scheduler_config, self.kv_manager)
        if self.lora is not None:
            self._check_lora_support()
        self.eos_token_ids = self._eos_token_ids()
        # end tokens beside the tokenizer's own (generation_config.json's extra ones) stop as stop tokens do,
        # naming themselves as stop_reason (vLLM's update_from_generation_config)
        primary = getattr(self.tokenizer, "eos_token_id", None)
        self.extra_eos_token_ids = self.eos_token_ids - {primary} if isinstance(primary, int) else frozenset()
        self.vocab_size = model.config.vocab_size
        self.outputs = OutputProcessor(self.tokenizer)
        self._grammars: Any = None  # structured_output.GrammarCompiler, made on the first constrained request
        self.pooling: dict[str, tuple[str | None, Request]] = {}  # pooling requests in flight
        self.num_steps = 0
        self.sleeping_tags: set[str] = set()  # what sleep() took and wake_up() has not brought back
        self.sleep_level = 0
        self.profiling = False
        self.iteration_tokens = IterationTokens()  # tokens per step, for /metrics
        release_freed_memory()  # the weights' loading buffers
        self.startup_seconds = time.perf_counter() - started
        self.info = EngineInfo(
            model=model.name,
            executor=config.executor,
            kernels=self.executor.kernels_name,
            scheduler=config.scheduler,
            kv_manager=config.kv_manager,
            device=config.device,
            options={
                "max_model_len": self.max_model_len,
                "num_kv_blocks": num_blocks,
                "block_size": config.block_size,
                "dtype": model.dtype,
                "kv_cache_dtype": _checked_kv_cache_dtype(config.kv_cache_dtype, model.dtype),
                # the workers' kernel set's own account; torch's for an executor that does not pass it on
                "isa": getattr(self.executor, "kernels_isa_path", None) or isa_path(config.device, model.dtype),
                "quantization": weights_quantization(model.model_dir),
                "tensor_parallel_size": config.tensor_parallel_size,
                "task": self.task,
                "vocab_size": self.vocab_size,
                "eos_token_ids": sorted(self.eos_token_ids),
                **self._pooling_options(),
            },
        )
        self.stat_loggers = StatLoggers(self.info, log_stats=not config.disable_log_stats)
        self.pm.hook.llmp_engine_started(info=self.info)
        self._stopped = False
        log.info(
            "engine ready in %.1f s: %s",
            self.startup_seconds,
            engine_summary({**self.info.options, "model": self.info.model, "kernels": self.info.kernels}),
        )

    # -- set-up ------------------------------------------------------------

    def _lora_manager(self) -> LoRAManager | None:
        if not self.config.enable_lora:
            return None
        from llmp.engine.lora import LoRAManager, adapter_loader

        return LoRAManager(self.config, adapter_loader(self.config, self.model))

    def _check_lora_support(self) -> None:
        """A scheduler plugin must cap the adapters per step, a KV manager key blocks by adapter."""
        if not callable(getattr(self.scheduler, "lora_counts", None)):
            raise ValueError(
                f"the scheduler {self.config.scheduler!r} does not support LoRA (no lora_counts(), no "
                "max_loras cap): use the default scheduler with --enable-lora"
            )
        if not getattr(self.kv_manager, "supports_lora", False):
            raise ValueError(
                f"the KV-cache manager {self.config.kv_manager!r} does not key cached blocks by LoRA adapter "
                "(supports_lora): use the default KV-cache manager with --enable-lora"
            )

    def _num_kv_blocks(self) -> int:
        if self.config.num_kv_blocks is not None:
            return self.config.num_kv_blocks
        context = self.config.max_model_len or self.model.context_len
        enough = -(-context * self.config.max_num_seqs // self.config.block_size)  # every sequence at full length
        per_block = self.executor.bytes_per_block()
        if per_block == 0:  # a model without a KV cache (an encoder): blocks only count tokens
            return enough
        memory = self.config.kv_cache_memory_bytes
        if not memory and self.config.device.startswith("cuda"):
            return int(min(self._gpu_kv_blocks(per_block), enough))
        memory = memory or DEFAULT_CPU_KV_CACHE_BYTES
        blocks = memory // per_block
        if blocks < 1:
            raise ValueError(
                f"the KV-cache memory ({memory} bytes) holds no block of "
                f"{self.config.block_size} tokens ({per_block} bytes): raise kv_cache_memory_bytes "
                "(--kv-cache-memory-gib)"
            )
        return int(min(blocks, enough))

    def _gpu_kv_blocks(self, per_block: int) -> int:
        """What --gpu-memory-utilization leaves for the KV cache once every rank ran a profiling
        forward pass at the largest batch (the smallest rank's share: every rank holds as many blocks)."""
        profiles = self.executor.collective_rpc("profile_memory")
        blocks = min(
            kv_cache_blocks(p["total"], p["used"], p["activations"], self.config.gpu_memory_utilization, per_block)
            for p in profiles
        )
        first = profiles[0]
        log.info(
            "memory profile: %s of %s in use after loading, %s of activations at %d tokens; the KV cache gets "
            "the rest of --gpu-memory-utilization %g",
            human_bytes(first["used"]),
            human_bytes(first["total"]),
            human_bytes(first["activations"]),
            self.config.max_num_batched_tokens,
            self.config.gpu_memory_utilization,
        )
        return blocks

    def _max_model_len(self, num_blocks: int) -> int:
        model_len = self.model.context_len
        pool = num_blocks * self.config.block_size
        if self.config.max_model_len is not None:  # within the model's context: checked when it was resolved
            if self.config.max_model_len > pool:
                raise ValueError(
                    f"max_model_len {self.config.max_model_len} does not fit the KV cache ({num_blocks} blocks of "
                    f"{self.config.block_size} = {pool} tokens); raise the KV cache size or lower max_model_len"
                )
            return self.config.max_model_len
        return min(model_len, pool)

    def _setup_pooling(self) -> None:
        """What the pooling tasks need per request, resolved once: the default task, the model class's
        poolers and normalisation, and the activations of the classification tasks."""
        tasks = set(self.supported_tasks) & set(POOLING_TASKS)
        primary = PRIMARY_POOLING_TASK.get(self.task)
        self.default_pooling_task = primary or ("classify" if "classify" in tasks else "embed")
        self._model_cls = as_pooling_model(self.model.spec.load(), self.task) if tasks else None
        pooling = self.model.pooling
        if self.task == "embed" and pooling is not None:
            self.default_normalize = pooling.normalize
        else:
            self.default_normalize = bool(getattr(self._model_cls, "default_normalize", False))
        # an architecture with a fixed head (Qwen2ForRewardModel: 1) has it whatever id2label the config carries
        labels = getattr(self._model_cls, "num_labels", None)
        labels = labels if isinstance(labels, int) else num_labels(self.model.config)
        self.num_labels = labels if tasks & {"classify", "token_classify"} else None
        self._activations: dict[str, Any] = {}
        if tasks & {"classify", "token_classify"}:
            self._activations["classify"] = self._activations["token_classify"] = classify_activation(self.model.config)
        if "score" in tasks and self.model.score_mode == "cross-encoder":
            self._activations["score"] = score_activation(self.model.config)

    def _pooling_options(self) -> dict[str, Any]:
        """The ``EngineInfo.options`` a front-end needs for the pooling tasks."""
        config = self.model.config
        id2label = getattr(config, "id2label", None) if self.num_labels is not None else None
        labels = {str(int(k)): v for k, v in id2label.items()} if id2label else None
        if labels is not None and len(labels) != self.num_labels:  # e.g. a converted LLM reranker's default labels
            labels = None
        # a cross-encoder tokenizes (query, document) as a text pair; an LLM reranker concatenates them
        use_sep = getattr(config, "use_sep_token", None)
        if use_sep is None:
            use_sep = self.model.score_mode == "cross-encoder" and not getattr(config, "classifier_from_token", None)
        return {
            "supported_tasks": list(self.supported_tasks),
            "score_mode": self.model.score_mode,
            "num_labels": self.num_labels,
            "id2label": labels,
            "use_sep_token": bool(use_sep),
            "embedding_size": getattr(config, "hidden_size", None),  # the most an embedding's dimensions may keep
            "matryoshka": matryoshka_dimensions(config),  # None: dimensions refused; []: any 1..embedding_size
        }

    def _pooler_of(self, task: str, params: PoolingParams) -> str:
        """The pooler of a request (the task table of the pooling tasks): the resolved one for the
        primary task, ``all``/``step`` for the token tasks, else the model class's default."""
        if task in TOKEN_POOLING_TASKS:
            return "step" if params.step_tag_id is not None else "all"
        sequence_task = "classify" if task == "score" else task
        if self.model.pooling is not None and sequence_task == PRIMARY_POOLING_TASK.get(self.task):
            return self.model.pooling.pooling_type
        return default_pooler(self._model_cls, sequence_task)

    def _eos_token_ids(self) -> frozenset[int]:
        # the union of the config's, the tokenizer's and generation_config.json's end tokens
        sources = [getattr(self.model.config, "eos_token_id", None), getattr(self.tokenizer, "eos_token_id", None)]
        try:
            sources.append(
                json.loads((self.model.model_dir / "generation_config.json").read_text()).get("eos_token_id")
            )
        except (OSError, ValueError, AttributeError):  # none, unreadable, or not an object
            pass
        ids: set[int] = set()
        for value in sources:
            ids.update([value] if isinstance(value, int) else [v for v in value or () if isinstance(v, int)])
        return frozenset(ids)

    # -- requests ----------------------------------------------------------

    def tokenize_prompt(self, prompt: Prompt) -> list[int]:
        """The prompt's token ids: as given, else its text tokenized."""
        if prompt.token_ids is not None:
            return prompt.token_ids
        return self.tokenizer.encode(prompt.text, add_special_tokens=prompt.add_special_tokens)

    def add_request(
        self,
        request_id: str,
        prompt: PromptType,
        params: SamplingParams | None = None,
        priority: int = 0,
        delta: bool = False,
        pooling_params: PoolingParams | None = None,
        lora_request: LoRARequest | None = None,
    ) -> None:
        """Queue a request. ``delta=True``: its outputs carry only what is new since the last one.
        With ``pooling_params`` it is a pooling request of ``pooling_params.task`` (None: the model's
        primary pooling task), which must be one of the model's ``supported_tasks``; so is a request
        without either on a model that cannot generate. ``lora_request``: it runs with that LoRA
        adapter (``enable_lora``), read from disk now if the engine does not hold it."""
        self._check_awake()
        prompt = as_prompt(prompt)
        if request_id in self.outputs.states or request_id in self.pooling:
            raise ValueError(f"request id {request_id!r} is already in use")
        check_priority(priority, self.config.scheduling_policy)
        self._check_lora_request(lora_request)
        self._check_cache_salt(prompt)
        if pooling_params is not None or "generate" not in self.supported_tasks:
            self._add_pooling_request(request_id, prompt, params, priority, pooling_params, lora_request)
            return
        if params is not None:
            params.validate()  # again: the caller may have changed a field since it was built
        params = self._with_extra_eos(params or SamplingParams())
        if -1 in (params.logprobs, params.prompt_logprobs):  # vLLM's "the whole vocabulary"
            params = copy.copy(params)
            params.logprobs = self.vocab_size if params.logprobs == -1 else params.logprobs
            params.prompt_logprobs = self.vocab_size if params.prompt_logprobs == -1 else params.prompt_logprobs
        token_ids = self.tokenize_prompt(prompt)
        self._validate_prompt(token_ids, params)
        # the rest of the context (the one max_tokens=None rule; a prompt leaving no room is a SamplingParamsError).
        # An explicit max_tokens past it is no error offline: the request ends at the context ("length"), as in vLLM.
        room = resolve_max_tokens(None, len(token_ids), self.max_model_len)
        max_tokens = params.max_tokens if params.max_tokens is not None else room
        compiled = self._compile_grammar(params.structured_outputs)
        bad_words = bad_words_token_ids(params.bad_words, self.tokenizer, self.vocab_size) if params.bad_words else []
        lora_id = self._acquire_lora(lora_request)
        state = RequestState(request_id, prompt.text, token_ids, params, delta=delta)
        requests = []
        for index in range(params.n):
            child_params = params
            if params.n > 1 and params.seed is not None:
                child_params = copy.copy(params)
                child_params.seed = params.seed + index
            engine_id = request_id if params.n == 1 else f"{index}_{request_id}"
            request = Request(
                engine_id,
                token_ids,
                child_params,
                eos_token_ids=self.eos_token_ids,
                priority=priority,
                max_tokens=max_tokens,
                bad_words_token_ids=bad_words,
                lora_request=lora_request,
                lora_id=lora_id,
                cache_salt=prompt.cache_salt,
            )
            if compiled is not None:
                request.grammar = self._grammars.state(compiled, params.structured_outputs.after_token_ids)
            if params.thinking_token_budget is not None:
                request.thinking = ThinkingBudget(params.thinking_token_budget, params.reasoning_markers)
            requests.append(request)
        self.outputs.add_request(state, requests)
        for request in requests:
            self.scheduler.add_request(request)

    def check_structured_outputs(self, constraint: StructuredOutputsParams) -> None:
        """Compile a constraint (``ValueError`` if invalid); the compiled grammar is cached for its request."""
        self._compile_grammar(constraint)

    def _compile_grammar(self, constraint: StructuredOutputsParams | None) -> Any:
        if constraint is None:
            return None
        if self._grammars is None:
            from llmp.engine.structured_output import GrammarCompiler

            self._grammars = GrammarCompiler(self.tokenizer, self.vocab_size, self.eos_token_ids)
        return self._grammars.compile(constraint)

    def _add_pooling_request(
        self,
        request_id: str,
        prompt: Prompt,
        params: SamplingParams | None,
        priority: int,
        pooling_params: PoolingParams | None,
        lora_request: LoRARequest | None,
    ) -> None:
        name, supported = self.model.name, ", ".join(self.supported_tasks)
        if params is not None:
            if "generate" not in self.supported_tasks:
                raise ValueError(f"the model {name} cannot generate text; it supports {supported}")
            raise ValueError("a request takes sampling params or pooling params, not both")
        pooling_params = pooling_params or PoolingParams()
        task = pooling_params.task or self.default_pooling_task
        if task not in self.supported_tasks:
            raise ValueError(f"the model {name} cannot do task {task!r}; it supports {supported}")
        if task == "score" and self.model.score_mode != "cross-encoder":
            raise ValueError(
                f"the model {name} scores text pairs by the cosine of their embeddings: "
                "embed both texts (task 'embed') to score them"
            )
        pooling_params = _embed_activation(task, pooling_params)
        self._check_pooling_params(task, pooling_params)
        pooling_params = self._with_model_defaults(task, pooling_params)
        token_ids = self.tokenize_prompt(prompt)
        token_type_ids = prompt.token_type_ids if prompt.token_ids is not None else None
        keep = pooling_params.truncate_prompt_tokens
        if keep is not None:
            if keep > self.max_model_len:
                raise ValueError(f"truncate_prompt_tokens ({keep}) must be <= max_model_len ({self.max_model_len})")
            keep = self.max_model_len if keep == -1 else keep
            text_ids = None  # a text's own ids: its special tokens stay when it is cut, as vLLM's tokenizer keeps them
            if prompt.token_ids is None and prompt.add_special_tokens and len(token_ids) > keep:
                text_ids = self.tokenizer.encode(prompt.text, add_special_tokens=False)
            token_ids = last_tokens(token_ids, keep, text_ids)
            token_type_ids = token_type_ids[-keep:] if token_type_ids is not None else None
        self._validate_prompt(token_ids, SamplingParams())
        self._validate_token_types(token_type_ids)
        pooler = self._pooler_of(task, pooling_params)
        if pooler not in POOLERS:
            raise ValueError(f"the model {name} pools with {pooler!r}, which no plugin registered")
        whole_prompt = not (pooler == "last" and self.has_kv_cache)
        limit = self.max_model_len
        if whole_prompt:  # computed in one step
            limit = min(limit, self.config.max_num_batched_tokens)
        if len(token_ids) > limit:
            raise ValueError(f"the input is {len(token_ids)} tokens long; this model takes at most {limit}")
        lora_id = self._acquire_lora(lora_request)
        request = Request(
            request_id,
            token_ids,
            SamplingParams(max_tokens=1),
            priority=priority,
            max_tokens=1,
            pooling_params=pooling_params,
            pooling_task=task,
            pooler=pooler,
            whole_prompt=whole_prompt,
            token_type_ids=list(token_type_ids) if token_type_ids is not None else None,
            lora_request=lora_request,
            lora_id=lora_id,
            cache_salt=prompt.cache_salt,
        )
        self.pooling[request_id] = (prompt.text, request)
        self.scheduler.add_request(request)

    def _check_cache_salt(self, prompt: Prompt) -> None:
        """A salted prompt needs a KV manager that keys cached blocks by salt (or no prefix caching)."""
        if prompt.cache_salt is None or not self.config.enable_prefix_caching:
            return
        if not getattr(self.kv_manager, "supports_cache_salt", False):
            raise ValueError(
                f"the KV-cache manager {self.config.kv_manager!r} does not key cached blocks by cache salt "
                "(supports_cache_salt): use the default KV-cache manager, or no prefix caching, for cache_salt"
            )

    def _check_lora_request(self, lora_request: LoRARequest | None) -> None:
        if lora_request is None:
            return
        if not isinstance(lora_request, LoRARequest):
            raise TypeError(f"lora_request must be a llmp.LoRARequest, got {type(lora_request).__name__}")
        if self.lora is None:
            raise ValueError(LORA_DISABLED)

    def _acquire_lora(self, lora_request: LoRARequest | None) -> int:
        """The request's ``lora_id`` (0: the base model); the adapter's files are read here, if at all."""
        return 0 if lora_request is None else self.lora.acquire(lora_request)

    # -- sleep, prefix cache, profiles, worker calls --------------------------

    def sleep(self, level: int = 1) -> None:
        """Free the compute device: level 1 moves the weights to host memory (on the CPU they stay
        where they are) and frees the KV cache; level 2 discards the weights too (:meth:`wake_up`
        loads them again from the model files). The prefix cache is reset. Until woken, a new request
        raises ``EngineSleepingError``. Requests in flight are a ``ValueError``: abort them or let
        them finish first. Asleep already: nothing changes, as in vLLM."""
        if level not in (1, 2):
            raise ValueError(f"sleep level must be 1 or 2, got {level!r}")
        if self.sleeping_tags:
            log.warning("the engine is already asleep (level %d)", self.sleep_level)
            return
        busy = self.unfinished_request_ids()
        if busy:
            raise ValueError(f"{len(busy)} requests are in flight: abort them or let them finish before sleep")
        if not self._reset_prefix_cache(for_sleep=True):
            raise RuntimeError("the KV-cache manager kept its prefix cache with no request running")
        started = time.perf_counter()
        self._worker_call("sleep", level)
        self.sleeping_tags, self.sleep_level = set(SLEEP_TAGS), level
        log.info("asleep (level %d) after %.2f s", level, time.perf_counter() - started)

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Bring back what :meth:`sleep` took: ``tags`` among ``"weights"`` and ``"kv_cache"`` (None:
        both; vLLM's partial wake, e.g. the weights first to update them, then the cache). The engine
        takes requests again once both are back. Awake already: nothing changes."""
        if isinstance(tags, str) or (tags is not None and not isinstance(tags, Sequence)):
            raise TypeError(f"tags must be a list of tags ({', '.join(SLEEP_TAGS)}), got {tags!r}")
        unknown = [tag for tag in tags or () if tag not in SLEEP_TAGS]
        if unknown:
            raise ValueError(f"unknown wake-up tag {unknown[0]!r}: the tags are {', '.join(SLEEP_TAGS)}")
        wanted = self.sleeping_tags & set(SLEEP_TAGS if tags is None else tags)
        if not wanted:
            return
        started = time.perf_counter()
        self._worker_call("wake_up", sorted(wanted))
        if "weights" in wanted and self.sleep_level == 2 and self.lora is not None:
            self.lora.forget_slots()  # the reloaded model's adapter slots are empty
        self.sleeping_tags -= wanted
        log.info("woke up %s after %.2f s", " and ".join(sorted(wanted)), time.perf_counter() - started)

    def is_sleeping(self) -> bool:
        """Whether the engine is asleep: from :meth:`sleep` until every tag is woken up."""
        return bool(self.sleeping_tags)

    def _check_awake(self) -> None:
        if self.sleeping_tags:
            raise EngineSleepingError(
                f"the engine is sleeping (level {self.sleep_level}): wake it up first "
                "(POST /wake_up on the server, wake_up() in Python)"
            )

    def unfinished_request_ids(self) -> list[str]:
        """The ids (as given to :meth:`add_request`) of every request not finished yet."""
        return [*self.outputs.states, *self.pooling]

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix block, so later requests compute their prompts afresh. False
        (nothing forgotten) while requests hold blocks, as vLLM: reset when they are done."""
        return self._reset_prefix_cache()

    def _reset_prefix_cache(self, for_sleep: bool = False) -> bool:
        reset = getattr(self.kv_manager, "reset_prefix_cache", None)
        if reset is None:
            if for_sleep and not self.config.enable_prefix_caching:
                return True
            raise ValueError(
                f"the KV-cache manager {self.config.kv_manager!r} cannot reset its prefix cache (reset_prefix_cache)"
            )
        return bool(reset())

    def start_profile(self) -> None:
        """Start the torch profiler on every worker (the engine's own work too, with ``uniproc``);
        :meth:`stop_profile` writes the traces under ``profiler_dir``."""
        if not self.config.profiler_dir:
            raise ValueError("profiling needs a trace directory: start the engine with profiler_dir (--profiler-dir)")
        if self.profiling:
            raise ValueError("a profile is already running: stop it first (stop_profile, POST /stop_profile)")
        self._worker_call("start_profile", str(Path(self.config.profiler_dir).expanduser().resolve()))
        self.profiling = True

    def stop_profile(self) -> list[str]:
        """Stop the profiler; the trace files written, one per worker: Chrome-trace JSON (Perfetto,
        ``chrome://tracing``)."""
        if not self.profiling:
            raise ValueError("no profile is running: start one first (start_profile, POST /start_profile)")
        self.profiling = False
        return self._worker_call("stop_profile")

    def collective_rpc(
        self,
        method: str | Callable[..., Any],
        timeout: float | None = None,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> list[Any]:
        """Call ``method`` on every worker (:class:`llmp.executor.Worker`): a public method's name,
        or a function called as ``method(worker, *args, **kwargs)``; the results, one per rank.
        ``timeout`` (seconds) bounds the wait (``TimeoutError``). The methods the engine drives
        itself (``execute_model``, ``sleep``, ``start_profile`` ...) are refused: use the engine's own."""
        if isinstance(method, str) and method in ENGINE_DRIVEN_WORKER_METHODS:
            raise ValueError(
                f"the engine drives the workers' {method!r} itself: call the engine's own method "
                "(sleep, wake_up, start_profile, stop_profile), not collective_rpc"
            )
        if not (isinstance(method, str) or callable(method)):
            raise TypeError(f"method must be a worker method's name or a function, got {type(method).__name__}")
        if isinstance(args, str | bytes) or not isinstance(args, Sequence):
            raise TypeError(f"args must be a list of positional arguments, got {type(args).__name__}")
        if kwargs is not None and not isinstance(kwargs, dict):
            raise TypeError(f"kwargs must be a dict of keyword arguments, got {type(kwargs).__name__}")
        if timeout is not None and not timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        return self._executor_rpc()(method, timeout, tuple(args), dict(kwargs or {}))

    WORKER_CALL_NAMES = {
        "wake_up": "wake-up",
        "start_profile": "starting the profile",
        "stop_profile": "stopping the profile",
    }

    def _worker_call(self, method: str, *args: Any) -> list[Any]:
        """One of the engine-driven worker methods on every rank (waits as long as loading may take).
        A rank's failure is named after the operation (``wake-up failed on rank 0: ...``), not the RPC."""
        try:
            return self._executor_rpc()(method, max(self.config.worker_timeout_s, 600.0), args, {})
        except WorkerCallError as exc:
            what = self.WORKER_CALL_NAMES.get(method, method)
            message = f"{what} failed on rank {exc.rank}: {exc.detail}"
            raise WorkerCallError(message, method=method, rank=exc.rank, detail=exc.detail) from None

    def _executor_rpc(self) -> Callable[..., list[Any]]:
        rpc = getattr(self.executor, "collective_rpc", None)
        if rpc is None:
            raise NotImplementedError(
                f"the executor {self.config.executor!r} has no collective_rpc (see llmp.api.Executor): "
                "it cannot sleep, profile or call worker methods"
            )
        return rpc

    # -- LoRA adapters -------------------------------------------------------

    def add_lora(self, lora_request: LoRARequest, *, pin: bool = False, replace: bool = False) -> bool:
        """Read and check an adapter now rather than at its first request (and serve again an id
        removed). ``pin`` keeps it in the CPU cache for good (see :meth:`pin_lora`); ``replace``
        serves new files under a known id (requests in flight finish with the old ones). False when
        the id was already there (and not replaced). Raises ``LoRAAdapterNotFoundError`` or
        ``InvalidLoRAAdapterError`` (also for a known id given with another name or path)."""
        self._check_lora_request(lora_request)
        if lora_request is None:
            raise TypeError("add_lora needs a llmp.LoRARequest")
        known = lora_request.lora_int_id in self.lora.list_ids()
        self.lora.register(lora_request, pin=pin, replace=replace)
        return replace or not known

    def remove_lora(self, lora_int_id: int) -> bool:
        """Stop serving the adapter; requests in flight finish with it, new ones naming its id get
        ``LoRAAdapterNotFoundError`` until it is added again. False when it is unknown."""
        return self.lora is not None and self.lora.remove(lora_int_id)

    def list_loras(self) -> list[int]:
        """The ``lora_int_id`` of every adapter the engine serves."""
        return [] if self.lora is None else self.lora.list_ids()

    def pin_lora(self, lora_int_id: int) -> bool:
        """Never drop the adapter from the CPU cache, and evict its slot last (only when every slot a
        step could take holds a pinned adapter: a slot is never reserved). False when it is unknown."""
        return self.lora is not None and self.lora.pin(lora_int_id)

    def _with_model_defaults(self, task: str, params: PoolingParams) -> PoolingParams:
        """``params`` with the model class's defaults where the request leaves them unset (vLLM's
        per-architecture pooler config): ``default_step_tag_id`` for the token tasks (a process
        reward model's step tag), ``default_use_activation`` for the classification tasks."""
        updates: dict[str, Any] = {}
        step_tag_id = getattr(self._model_cls, "default_step_tag_id", None)
        if task in TOKEN_POOLING_TASKS and params.step_tag_id is None and step_tag_id is not None:
            updates["step_tag_id"] = step_tag_id
        use_activation = getattr(self._model_cls, "default_use_activation", None)
        if task in ("classify", "score", "token_classify") and params.use_activation is None:
            if use_activation is not None:
                updates["use_activation"] = use_activation
        return dataclasses.replace(params, **updates) if updates else params

    def _check_pooling_params(self, task: str, params: PoolingParams) -> None:
        """vLLM's rule: a parameter set for a task it does not apply to is an error."""
        applies = {
            "normalize": ("embed", "token_embed"),
            "dimensions": ("embed", "token_embed"),
            "use_activation": ("classify", "score", "token_classify"),
            "step_tag_id": ("token_embed", "token_classify"),
            "returned_token_ids": ("token_classify",),
        }
        for field, tasks in applies.items():
            if getattr(params, field) is not None and task not in tasks:
                raise ValueError(f"task {task!r} does not take {field} (it applies to {', '.join(tasks)})")
        if params.dimensions is not None:
            config = self.model.config
            check_dimensions(params.dimensions, matryoshka_dimensions(config), config.hidden_size)
        bad = next((t for t in params.returned_token_ids or () if not 0 <= t < (self.num_labels or 0)), None)
        if bad is not None:
            raise ValueError(f"returned_token_ids holds {bad}, outside the model's {self.num_labels} labels")

    def _with_extra_eos(self, params: SamplingParams) -> SamplingParams:
        """``params`` with the model's extra end tokens among its stop tokens, and without its own end
        token (vLLM checks that first: it stops with no stop_reason), unless ``ignore_eos``; a copy
        when changed, so the caller's stays as given."""
        if params.ignore_eos:
            return params
        extra = self.extra_eos_token_ids.difference(params.stop_token_ids)
        own = (self.eos_token_ids - self.extra_eos_token_ids).intersection(params.stop_token_ids)
        if not extra and not own:
            return params
        params = copy.copy(params)
        params.stop_token_ids = [*(t for t in params.stop_token_ids if t not in own), *sorted(extra)]
        return params

    def _validate_token_types(self, token_type_ids: Sequence[int] | None) -> None:
        """Token types the model has embeddings for: a tokenizer that disagrees with its config (an
        XLM-R checkpoint with one type under a BERT tokenizer's pairs) is refused here, not in the model."""
        types = getattr(self.model.config, "type_vocab_size", None)
        if token_type_ids is None or not isinstance(types, int):
            return
        bad = next((t for t in token_type_ids if not 0 <= t < types), None)
        if bad is not None:
            raise ValueError(
                f"token type id {bad} is out of range [0, {types}): the model's tokenizer gives text pairs "
                f"token types its config (type_vocab_size {types}) has no embeddings for"
            )

    def get_tokenizer(self) -> Any:
        """transformers' tokenizer of the model, as vLLM's ``LLMEngine.get_tokenizer`` (``tokenizer`` is the
        engine's own, which reads tokenizer.json without transformers where it can)."""
        from llmp.model_files.tokenizer import transformers_tokenizer

        return transformers_tokenizer(self.tokenizer)

    def _validate_prompt(self, token_ids: list[int], params: SamplingParams) -> None:
        if not token_ids:
            raise ValueError("the prompt is empty: it must hold at least one token")
        bad = next((t for t in token_ids if not isinstance(t, int) or not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise ValueError(f"prompt token id {bad!r} is out of range [0, {self.vocab_size})")
        markers = params.reasoning_markers
        for name, ids in (
            ("logit_bias", params.logit_bias or {}),
            ("allowed_token_ids", params.allowed_token_ids or []),
            ("stop_token_ids", [t for t in params.stop_token_ids if t not in self.eos_token_ids]),
            ("reasoning_markers", [*markers.start_token_ids, *markers.end_token_ids] if markers else []),
        ):
            bad = next((t for t in ids if t >= self.vocab_size), None)
            if bad is not None:
                raise ValueError(f"{name} token id {bad} is out of range [0, {self.vocab_size})")

    def abort_request(self, request_ids: str | Sequence[str]) -> list[RequestOutput]:
        """Abort requests (by the id given to :meth:`add_request`); returns their final outputs."""
        finished = []
        aborted = False
        for request_id in [request_ids] if isinstance(request_ids, str) else request_ids:
            if request_id in self.pooling:
                text, request = self.pooling.pop(request_id)
                self.scheduler.abort_requests([request_id])
                aborted = True
                if self.stat_loggers:
                    self._record_finished_pooling(request)
                continue
            state = self.outputs.state_of(request_id)
            if state is None:
                continue
            aborted = True
            for seq in state.sequences:
                self.scheduler.abort_requests([seq.request.request_id])
                self.outputs.finish(seq, RequestStatus.FINISHED_ABORTED.value)
            output = self.outputs.make_output(state, state.delta)
            if self.stat_loggers:  # aborted requests are counted too, with finish_reason "abort"
                self._record_finished(output, state)
            finished.append(output)
        if aborted and self.lora is not None:
            self.lora.update_counts(*self.scheduler.lora_counts())
        if aborted and self.stat_loggers:
            # no step may follow (an idle engine): the loggers get the counts without the aborted requests now
            self.stat_loggers.record_step(self._scheduler_stats())
        return finished

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def _core_share_governor(self) -> CoreShareGovernor | None:
        """Fewer threads while other processes take cores (``llmp.engine.core_share``): for a CPU engine whose
        model runs in this thread (``uniproc``) on every core, as no ``--num-threads`` asked."""
        import torch

        config = self.config
        if config.device != "cpu" or config.executor != "uniproc" or config.num_threads:
            return None
        threads = torch.get_num_threads()
        return CoreShareGovernor.for_this_process(threads, torch.set_num_threads) if threads > 1 else None

    # -- one step ----------------------------------------------------------

    def step(self) -> list[RequestOutput | PoolingRequestOutput]:
        """Run one step; return an output for every request that changed (generation requests
        and the pooling requests the step finished, batched in the same forward pass)."""
        scheduled = self.scheduler.schedule()
        if scheduled.is_empty:
            return []
        scheduled_at = time.time()
        for item in scheduled.scheduled:
            item.request.record_scheduled(scheduled_at)
        inputs = prepare_inputs(scheduled, self.config.block_size)
        if inputs.sample_index:
            requests = [scheduled.scheduled[i].request for i in inputs.sample_index]
            inputs.sampling = SamplingBatch.of(requests, self.vocab_size)
        if self.lora is not None:
            inputs.lora = self.lora.step_inputs(scheduled)
        if self.core_share is not None:
            self.core_share.before_step()
        result = self.executor.execute_model(inputs)
        if self.core_share is not None:
            self.core_share.after_step()
        self.num_steps += 1
        sampled_at = time.time()
        if not self.stat_loggers.muted:  # the server's warm-up is not part of the workload
            num_sampled = sum(token is not None for token in result.sampled)
            self.iteration_tokens.observe(step_prompt_tokens(scheduled) + num_sampled)
        self.scheduler.update_from_output(scheduled, result.sampled)
        pooled = self._finish_pooling(scheduled, inputs.pool_items, result.pooled)
        changed: dict[str, RequestState] = {}
        now = time.monotonic()
        for request_id, entries in result.prompt_logprobs.items():
            self.outputs.add_prompt_logprobs(request_id, entries)
        for item, token, logprobs in zip(scheduled.scheduled, result.sampled, result.logprobs, strict=True):
            if token is None:
                continue
            request = item.request
            seq = self.outputs.sequence_of(request.request_id)
            if seq is None:
                continue
            state = seq.parent
            state.first_token_time = state.first_token_time or now
            request.record_token(sampled_at)
            # as in vLLM, the EOS or stop token that ends a sequence is not part of its text
            ended_by_token = (
                request.status == RequestStatus.FINISHED_STOPPED
                and request.stop_reason is None
                or request.stop_reason == token
            ) and not request.params.include_stop_str_in_output
            stop = self.outputs.append(seq, token, logprobs, detokenize=not ended_by_token)
            if stop is not None and not request.is_finished:
                self.scheduler.finish(request, RequestStatus.FINISHED_STOPPED, stop_reason=stop[0])
            elif stop is not None and request.status == RequestStatus.FINISHED_LENGTH:
                # the stop string ended on the last token allowed: it is what ended the text (vLLM says stop too)
                request.status, request.stop_reason = RequestStatus.FINISHED_STOPPED, stop[0]
            if request.thinking is not None:
                request.thinking.accept(request.output_token_ids)
            if request.grammar is not None and request.grammar.accept(token, request.output_token_ids):
                self.scheduler.finish(request, RequestStatus.FINISHED_STOPPED)  # no-op if already finished
            if request.is_finished:
                self.outputs.finish(seq, request.status.value, request.stop_reason)
            changed[state.request_id] = state
        if self.lora is not None:  # after every finish of the step: a removed adapter may go now
            self.lora.update_counts(*self.scheduler.lora_counts())
        outputs = [self.outputs.make_output(state, state.delta) for state in changed.values()]
        if self.stat_loggers:
            self._log_stats(scheduled, result.sampled, outputs, changed)
            for item in inputs.pool_items:  # a pooling request finishes in the step that pools it
                self._record_finished_pooling(scheduled.scheduled[item.index].request)
        return [*outputs, *pooled]

    def _finish_pooling(self, scheduled: Any, items: list[Any], pooled: list[Any]) -> list[PoolingRequestOutput]:
        outputs = []
        for item, data in zip(items, pooled, strict=True):
            request = scheduled.scheduled[item.index].request
            text, _ = self.pooling.pop(request.request_id)
            self.scheduler.finish(request, RequestStatus.FINISHED_STOPPED)
            outputs.append(
                PoolingRequestOutput(
                    request.request_id,
                    text,
                    request.prompt_token_ids,
                    self._pooling_output(request, data),
                    num_cached_tokens=max(request.num_cached_tokens, 0),
                )
            )
        return outputs

    def _pooling_output(self, request: Request, data: Any) -> Any:
        """The typed output of a pooled float32 tensor (the task table: activation, normalisation,
        dimensions, returned columns)."""
        params, task = request.pooling_params, request.pooling_task
        if task in ("embed", "token_embed"):
            normalize = self.default_normalize if params.normalize is None else params.normalize
            values = finish_embedding(data, normalize, params.dimensions)
            return EmbeddingOutput(values) if task == "embed" else PoolingOutput(values)
        if task == "token_classify" and params.returned_token_ids:
            data = data[:, params.returned_token_ids]  # before the activation, as vLLM's step pooler
        if params.use_activation is not False:
            data = self._activations[task](data)
        if task == "classify":
            return ClassificationOutput(data.tolist())
        if task == "score":
            return ScoringOutput(float(data[0]))
        return PoolingOutput(data.tolist())

    def _scheduler_stats(self, scheduled: Any = None, num_sampled: int = 0) -> SchedulerStats:
        prompt_tokens = step_prompt_tokens(scheduled) if scheduled is not None else 0
        return SchedulerStats(
            num_prompt_tokens=prompt_tokens,
            num_generation_tokens=num_sampled,
            num_running=self.scheduler.num_running,
            num_waiting=self.scheduler.num_waiting,
            kv_cache_usage=self.kv_manager.usage,
            prefix_cache_queries=self.kv_manager.prefix_cache_queries,
            prefix_cache_hits=self.kv_manager.prefix_cache_hits,
            num_preemptions=self.scheduler.num_preemptions,
        )

    def _log_stats(
        self, scheduled: Any, sampled: list[Any], outputs: list[RequestOutput], states: dict[str, RequestState]
    ) -> None:
        num_sampled = sum(token is not None for token in sampled)
        self.stat_loggers.record_step(self._scheduler_stats(scheduled, num_sampled))
        for output in outputs:
            if output.finished:
                self._record_finished(output, states[output.request_id])

    def _record_finished(self, output: RequestOutput, state: RequestState) -> None:
        """The figures of a finished (or aborted) generation request, to the stat loggers."""
        now = time.monotonic()
        first = state.sequences[0].request
        self.stat_loggers.record_finished(
            FinishedRequestStats(
                request_id=output.request_id,
                finish_reason=output.outputs[0].finish_reason,
                num_prompt_tokens=len(output.prompt_token_ids),
                num_generation_tokens=sum(len(o.token_ids) for o in output.outputs),
                num_cached_tokens=output.num_cached_tokens,
                queued_seconds=(first.first_scheduled_time or now) - state.arrival_time,
                time_to_first_token_seconds=(state.first_token_time - state.arrival_time)
                if state.first_token_time
                else None,
                end_to_end_seconds=now - state.arrival_time,
            )
        )

    def _record_finished_pooling(self, request: Request) -> None:
        """The figures of a finished (or aborted) pooling request, to the stat loggers."""
        now = time.monotonic()
        self.stat_loggers.record_finished(
            FinishedRequestStats(
                request_id=request.request_id,
                finish_reason=request.status.finish_reason,
                num_prompt_tokens=request.num_prompt_tokens,
                num_generation_tokens=0,
                num_cached_tokens=max(request.num_cached_tokens, 0),
                queued_seconds=(request.first_scheduled_time or now) - request.arrival_time,
                time_to_first_token_seconds=None,
                end_to_end_seconds=now - request.arrival_time,
            )
        )

    def shutdown(self) -> None:
        if not self._stopped:
            self._stopped = True
            self.executor.shutdown()
            self.pm.hook.llmp_engine_stopped(info=self.info)


def _checked_kv_cache_dtype(requested: str, dtype: str) -> str:
    """The KV cache's dtype, with a warning where it costs memory for nothing or can overflow."""
    kv_dtype = resolve_kv_cache_dtype(requested, dtype)
    if kv_dtype == "float32" and dtype != "float32":
        log.warning(
            "--kv-cache-dtype float32 with %s weights takes twice the memory a token for no precision: the keys "
            "and values are %s projections (the default, auto, caches them in %s)",
            dtype,
            dtype,
            dtype,
        )
    elif kv_dtype == "float16" and dtype == "bfloat16":
        log.warning(
            "--kv-cache-dtype float16 with bfloat16 weights: keys and values beyond float16's range (65504) become "
            "inf; bfloat16 (the default, auto) keeps the range in the same memory"
        )
    return kv_dtype


def _embed_activation(task: str, params: PoolingParams) -> PoolingParams:
    """vLLM 0.32's ``use_activation`` of an embedding task is its normalisation (its PoolingParams has no
    ``normalize``): read as ``normalize``; both given and disagreeing is an error."""
    if task not in ("embed", "token_embed") or params.use_activation is None:
        return params
    if params.normalize is not None and params.normalize != params.use_activation:
        raise ValueError("use_activation and normalize disagree: for an embedding both mean normalising the vector")
    return dataclasses.replace(params, normalize=params.use_activation, use_activation=None)
