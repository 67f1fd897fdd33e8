"""``POST /v1/completions``: prompts in (text or token ids, one or many), ``n`` completions each."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request

from llmp import Prompt
from llmp.frontend import bad_request, engine_request_id
from llmp_frontend_openai import protocol as p
from llmp_frontend_openai.logprobs import completion_logprobs, prompt_logprobs
from llmp_frontend_openai.wire import DONE, sse, sse_error, stream_usage, usage

if TYPE_CHECKING:
    from llmp_frontend_openai.frontend import OpenAIFrontend


def add_routes(router: APIRouter, fe: OpenAIFrontend) -> None:
    async def create_completion(body: p.CompletionRequest, request: Request) -> Any:
        return await Completion(fe, body, request).run()

    router.add_api_route(
        "/v1/completions", create_completion, methods=["POST"], summary="Create a completion (OpenAI legacy API)"
    )


class Completion:
    def __init__(self, fe: OpenAIFrontend, body: p.CompletionRequest, request: Request) -> None:
        self.fe, self.body, self.request = fe, body, request
        self.id = fe.new_id(request, "cmpl", body)
        self.created = int(time.time())
        self.as_ids = fe.options.return_tokens_as_token_ids or bool(body.return_tokens_as_token_ids)

    async def run(self) -> Any:
        fe, body = self.fe, self.body
        await self.prepare()
        if hasattr(fe.engine, "check_capacity"):  # all prompts run, or none: refuse now, not halfway
            beams = len(self.prompts) * self.n if self.beam is not None else 0
            if beams:
                fe.engine.check_capacity(beams, "n", "beams (n for each prompt)")
            else:
                fe.engine.check_capacity(len(self.prompts), "prompt")
        if self.beam is not None:
            skip = self.params[0].skip_special_tokens
            self.streams = [
                fe.beam_search(
                    p.token_ids,
                    self.beam,
                    lora=self.lora,
                    priority=body.priority,
                    skip_special_tokens=skip,
                    cache_salt=p.cache_salt,
                )
                for p in self.prompts
            ]
            return await fe.respond(self.request, bool(body.stream), self.stream if body.stream else self.whole)
        self.streams = [
            fe.engine.generate(
                prompt,
                params,
                engine_request_id("cmpl"),
                lora_request=self.lora,
                priority=body.priority,
                delta=bool(body.stream),
            )
            for prompt, params in zip(self.prompts, self.params, strict=True)
        ]
        return await fe.respond(self.request, bool(body.stream), self.stream if body.stream else self.whole)

    async def prepare(self) -> None:
        """Everything before the engine (shared with ``/v1/completions/render``): the model and field
        checks, each prompt's tokens (``self.prompts``) and its sampling parameters (``self.params``)."""
        fe, body = self.fe, self.body
        self.lora = await fe.lora_for(body.model)
        self.model = fe.response_model(self.lora)
        fe.check_unsupported(body)
        if body.best_of not in (None, 1):
            raise bad_request("best_of is not supported; use n", "best_of")
        if body.suffix:
            prompts = await self._insertions()
        else:
            prompts = await fe.prompt_inputs(body.prompt, "prompt", body.add_special_tokens)
        self.prompts = fe.engine_prompts(prompts, body, body.truncate_prompt_tokens)
        # with echo and logprobs, the prompt's own logprobs are part of the answer
        echo_logprobs = body.echo and body.logprobs is not None
        # vLLM's echo with max_tokens 0: the prompt alone (and its logprobs), to score it; one token runs
        self.echo_only = bool(body.echo) and body.max_tokens == 0
        if self.echo_only and body.stream:
            raise bad_request("max_tokens 0 (the prompt alone, with echo) needs stream false", "max_tokens")
        constraint = fe.structured_outputs_of(body)
        await fe.check_constraint(constraint, "structured_outputs" if body.structured_outputs else "response_format")
        width = fe.beam_search_width(body)
        self.params = []
        for prompt in self.prompts:
            params = fe.sampling_params(
                body if width is None else body.model_copy(update={"n": 1}),
                prompt.token_ids,
                max_tokens=1 if self.echo_only else body.max_tokens,
                logprobs=body.logprobs,
                structured_outputs=constraint,
            )
            if echo_logprobs and params.prompt_logprobs is None:
                params.prompt_logprobs = body.logprobs
            self.params.append(params)
        self.n = self.params[0].n if width is None else width
        self.beam = None if width is None else fe.beam_search_params(width, body, self.params[0], constraint)

    async def _insertions(self) -> list[Prompt]:
        """Fill in the middle: each prompt is the text before the insertion (an empty one too: the
        cursor at the start of a file), ``suffix`` the text after it."""
        body = self.body
        if body.echo:
            raise bad_request("echo does not apply to an insertion (suffix)", "echo")
        if body.truncate_prompt_tokens is not None:  # a cut start would lose the insertion's first token
            raise bad_request(
                "truncate_prompt_tokens does not apply to an insertion (suffix)", "truncate_prompt_tokens"
            )
        texts = [body.prompt] if isinstance(body.prompt, str) else body.prompt
        if not texts:
            raise bad_request("prompt must not be empty", "prompt")
        if not all(isinstance(text, str) for text in texts):
            raise bad_request("suffix needs the prompt as text (or a list of texts), not token ids", "suffix")
        return [await self.fe.fim_prompt(text, body.suffix) for text in texts]

    # -- whole -------------------------------------------------------------------

    async def whole(self) -> dict[str, Any]:
        finals = await _gather([_last(s) for s in self.streams])
        choices, completion_tokens = [], 0
        for prompt_index, final in enumerate(finals):
            for seq in final.outputs:
                if self.echo_only:  # the token generated to run the prompt is not part of the answer
                    choices.append(self._choice(prompt_index, final, seq, "", [], [], echo=True))
                    continue
                completion_tokens += len(seq.token_ids)
                choices.append(
                    self._choice(prompt_index, final, seq, seq.text, seq.token_ids, seq.logprobs, echo=self.body.echo)
                )
        prompt_tokens = sum(len(prompt.token_ids) for prompt in self.prompts)
        response = {
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": usage(prompt_tokens, completion_tokens, self._cached(finals)),
            "system_fingerprint": None,
        }
        return response

    def _cached(self, outputs: Any) -> int | None:
        """The prompts' tokens read from the prefix cache, with ``--enable-prompt-tokens-details``."""
        return sum(o.num_cached_tokens for o in outputs) if self.fe.options.enable_prompt_tokens_details else None

    def _choice(
        self,
        prompt_index: int,
        final: Any,
        seq: Any,
        text: str,
        token_ids: list[int],
        logprobs: list | None,
        echo: bool,
        text_offset: int = 0,
    ) -> dict[str, Any]:
        prompt_text, prompt_ids = self.prompt_text(prompt_index) if echo else ("", [])
        choice: dict[str, Any] = {
            "index": prompt_index * self.n + seq.index,
            "text": prompt_text + text,
            "logprobs": None,
            "finish_reason": "length" if self.echo_only else seq.finish_reason,
            "stop_reason": None if self.echo_only else seq.stop_reason,
        }
        if self.body.logprobs is not None and logprobs is not None:
            entries = list(final.prompt_logprobs or [None] * len(prompt_ids))[: len(prompt_ids)] if echo else []
            choice["logprobs"] = completion_logprobs(
                [*prompt_ids, *token_ids],
                [*entries, *logprobs],
                self.body.logprobs,
                self.as_ids,
                self._decode_one,
                text_offset,
            )
        if self.body.return_token_ids:
            choice["prompt_token_ids"] = self.prompts[prompt_index].token_ids
            choice["token_ids"] = token_ids
        if self.body.prompt_logprobs is not None:
            choice["prompt_logprobs"] = prompt_logprobs(final.prompt_logprobs)
        return choice

    def _decode_one(self, token_id: int) -> str:
        return self.fe.tokenizer.decode([token_id])

    def prompt_text(self, prompt_index: int) -> tuple[str, list[int]]:
        """A prompt's text (as given, or its token ids decoded) and its token ids."""
        prompt = self.prompts[prompt_index]
        ids = prompt.token_ids
        return (prompt.text if prompt.text is not None else self.fe.tokenizer.decode(ids)), ids

    # -- streamed ----------------------------------------------------------------

    async def stream(self) -> AsyncIterator[str]:
        include_usage, continuous = stream_usage(self.body.stream_options, self.fe.options.enable_force_include_usage)
        prompt_tokens = sum(len(prompt.token_ids) for prompt in self.prompts)
        generated = 0
        latest: dict[int, Any] = {}  # each prompt's latest output, for its cached tokens
        echoed: set[tuple[int, int]] = set()
        sent: dict[tuple[int, int], int] = {}  # where each choice's next text_offset starts
        done: set[tuple[int, int]] = set()
        per_choice: dict[tuple[int, int], int] = {}  # each choice's tokens so far (continuous usage is a choice's)
        try:
            async for prompt_index, output in _merge(self.streams):
                latest[prompt_index] = output
                for seq in output.outputs:
                    key = (prompt_index, seq.index)
                    if key in done:
                        continue
                    generated += len(seq.token_ids)
                    per_choice[key] = per_choice.get(key, 0) + len(seq.token_ids)
                    wants_logprobs = self.body.logprobs is not None and seq.token_ids
                    echo = self.body.echo and key not in echoed
                    if not (seq.text or seq.finish_reason or wants_logprobs or echo):
                        continue
                    echoed.add(key)
                    offset = sent.get(key, 0)
                    choice = self._choice(
                        prompt_index, output, seq, seq.text, seq.token_ids, seq.logprobs, echo, offset
                    )
                    if key in sent:  # the prompt's ids come with the choice's first chunk only, as vLLM's
                        choice.pop("prompt_token_ids", None)
                    # offsets count the tokens' texts, as the whole answer's do
                    logprobs = choice["logprobs"]
                    sent[key] = offset + sum(map(len, logprobs["tokens"] if logprobs else [choice["text"]]))
                    if seq.finish_reason:
                        done.add(key)
                    else:
                        choice.pop("stop_reason")
                    own = usage(len(self.prompts[prompt_index].token_ids), per_choice[key]) if continuous else None
                    yield sse(self._chunk([choice], own))
            if include_usage:
                yield sse(self._chunk([], usage(prompt_tokens, generated, self._cached(latest.values()))))
        except Exception as exc:  # after the headers: report in-band and end; [DONE] marks success only
            yield sse_error(exc)
            return
        yield DONE

    def _chunk(self, choices: list[dict], usage: dict | None) -> dict[str, Any]:
        chunk = {
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if usage is not None:
            chunk["usage"] = usage
        return chunk


async def _last(stream: AsyncIterator[Any]) -> Any:
    final = None
    async for final in stream:
        pass
    return final


async def _gather(coroutines: list[Any]) -> list[Any]:
    """``asyncio.gather``, but the first failure cancels the rest (so their engine requests are aborted)."""
    tasks = [asyncio.ensure_future(c) for c in coroutines]
    try:
        return await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()


async def _merge(streams: list[AsyncIterator[Any]]) -> AsyncIterator[tuple[int, Any]]:
    """Items of several streams as they come, tagged with the stream's index."""
    if len(streams) == 1:
        async for item in streams[0]:
            yield 0, item
        return
    queue: asyncio.Queue = asyncio.Queue()
    end = object()

    async def pump(index: int, stream: AsyncIterator[Any]) -> None:
        try:
            async for item in stream:
                await queue.put((index, item))
        except Exception as exc:
            await queue.put((index, exc))
        finally:
            await queue.put((index, end))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            index, item = await queue.get()
            if item is end:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
