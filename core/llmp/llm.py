"""The offline Python API: ``LLM(model).generate(prompts, params)`` and ``.chat(messages)``."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from llmp.inputs import Prompt, PromptType, as_prompt
from llmp.options import EngineConfig
from llmp.outputs import PoolingRequestOutput, RequestOutput
from llmp.pooling_params import PoolingParams
from llmp.progress import bars_enabled, configure_logging
from llmp.sampling_params import SamplingParams

Conversation = Sequence[Mapping[str, Any]]


class LLM:
    """An engine in this process, for batches of prompts.

    ``LLM()`` serves the default model (``llmp.options.DEFAULT_MODEL``). Any keyword of
    :class:`llmp.options.EngineConfig` is accepted, e.g. ``dtype``,
    ``max_model_len``, ``enable_prefix_caching``, ``max_num_seqs``, ``kernels``.

    Start-up is reported on stderr as in vLLM (see :mod:`llmp.progress`): INFO lines for
    each phase, a bar while weights load (on a terminal), a summary line; ``LLMP_LOG_LEVEL=warning``
    quiets it. The periodic statistics line is off here, as in vLLM's ``LLM``: turn it on by
    passing ``disable_log_stats`` as false.
    """

    def __init__(self, model: str | None = None, **engine_options: Any) -> None:
        engine_options.setdefault("disable_log_stats", True)  # offline, the generate bar tells the progress
        config = EngineConfig(model=model, **engine_options)
        configure_logging()
        from llmp.engine.process_settings import apply_engine_process_settings

        apply_engine_process_settings()
        from llmp.engine.llm_engine import LLMEngine  # loads torch: after the settings
        from llmp.model_files.resolve import resolve_model

        self.engine = LLMEngine(config, resolve_model(config))
        self._ids = itertools.count()

    def get_tokenizer(self) -> Any:
        return self.engine.tokenizer

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: bool = True,
        priority: Sequence[int] | None = None,
    ) -> list[RequestOutput]:
        """Generate for every prompt (text, ``{"prompt_token_ids": [...]}`` or a
        :class:`~llmp.inputs.Prompt`); outputs in input order."""
        prompts = _prompt_list(prompts)
        params = self._params_per_prompt(sampling_params, len(prompts))
        if isinstance(priority, str | bytes) or (priority is not None and not isinstance(priority, Sequence)):
            raise TypeError(f"priority must be a sequence of integers, one per prompt, got {priority!r}")
        if priority is not None and len(priority) != len(prompts):
            raise ValueError(f"priority has {len(priority)} entries for {len(prompts)} prompts")
        ids = []
        try:
            for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
                request_id = str(next(self._ids))
                self.engine.add_request(request_id, prompt, p, priority=priority[i] if priority else 0)
                ids.append(request_id)
        except Exception:
            self.engine.abort_request(ids)
            raise
        return self._run(ids, use_tqdm)

    def embed(
        self,
        prompts: PromptType | Sequence[PromptType],
        pooling_params: PoolingParams | None = None,
        *,
        use_tqdm: bool = True,
    ) -> list[PoolingRequestOutput]:
        """One embedding per prompt (embedding models only), in input order:
        ``outputs.embedding`` is a list of floats."""
        prompts = _prompt_list(prompts)
        ids = []
        try:
            for prompt in prompts:
                request_id = str(next(self._ids))
                self.engine.add_request(request_id, prompt, pooling_params=pooling_params or PoolingParams())
                ids.append(request_id)
        except Exception:
            self.engine.abort_request(ids)
            raise
        return self._run(ids, use_tqdm)

    encode = embed  # vLLM's name for the general pooling call

    def chat(
        self,
        messages: Conversation | Sequence[Conversation],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: bool = True,
        chat_template: str | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> list[RequestOutput]:
        """Render each conversation with the model's chat template, then generate."""
        conversations = [messages] if messages and isinstance(messages[0], Mapping) else list(messages)
        prompts = [
            Prompt(text=text, add_special_tokens=False)  # the template already holds the special tokens
            for text in (
                self.render_chat(
                    c, chat_template, add_generation_prompt, continue_final_message, tools, chat_template_kwargs
                )
                for c in conversations
            )
        ]
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    def render_chat(
        self,
        conversation: Conversation,
        chat_template: str | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        """The prompt text of a conversation (transformers' renderer: a sandboxed Jinja environment)."""
        from llmp.chat_template import render_chat

        return render_chat(
            self.engine.tokenizer,
            conversation,
            chat_template=chat_template,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            tools=tools,
            chat_template_kwargs=chat_template_kwargs,
            model_name=f"the model {self.engine.info.model}",
        )

    def _params_per_prompt(self, params: Any, count: int) -> list[SamplingParams]:
        if params is None:
            return [SamplingParams()] * count
        if isinstance(params, SamplingParams):
            return [params] * count
        params = list(params)
        if len(params) != count:
            raise ValueError(f"got {len(params)} sampling params for {count} prompts")
        return params

    def _run(self, request_ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        finished: dict[str, RequestOutput] = {}
        progress = _Progress(len(request_ids)) if use_tqdm and len(request_ids) > 1 and bars_enabled() else None
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


def _prompt_list(prompts: PromptType | Sequence[PromptType]) -> list[Prompt]:
    """Every prompt as a :class:`Prompt`: a bad one is a TypeError before any is queued."""
    if isinstance(prompts, str | Mapping | Prompt):
        prompts = [prompts]
    return [as_prompt(prompt) for prompt in prompts]


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
