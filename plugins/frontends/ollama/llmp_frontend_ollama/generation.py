"""One ``/api/chat`` or ``/api/generate`` request, from its prompt's token ids to Ollama's replies:
one JSON object (``"stream": false``) or NDJSON, one object a line, the last with ``done: true``
and the timings (nanoseconds)."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from llmp import Prompt, StructuredOutputsParams
from llmp.frontend import SamplingRequest, as_api_error, bad_request, engine_request_id, json_text, until_disconnected
from llmp_frontend_ollama import protocol as p
from llmp_frontend_ollama.facts import now_rfc3339
from llmp_frontend_ollama.options import SAMPLING_DEFAULTS, Options, read_options

if TYPE_CHECKING:
    from llmp_frontend_ollama.frontend import OllamaFrontend

FLOOR = -9999.0  # JSON has no -inf


def ndjson(payload: dict[str, Any]) -> str:
    return json_text(payload) + "\n"


def format_constraint(value: str | dict[str, Any] | None) -> StructuredOutputsParams | None:
    """Ollama's ``format``: ``"json"`` (any JSON object) or a JSON schema, as structured outputs."""
    if value in (None, ""):
        return None
    if value == "json":
        return StructuredOutputsParams(json_object=True)
    if isinstance(value, dict):
        return StructuredOutputsParams(json=value)
    raise bad_request(f'format must be "json" or a JSON schema (an object), got {value!r}', "format")


class Generation:
    """Validated in :meth:`start` (every refusal is a 400 before a stream begins), then answered."""

    def __init__(
        self,
        fe: OllamaFrontend,
        body: p.ChatRequest | p.GenerateRequest,
        request: Request,
        *,
        model: str,
        chat: bool,
        started: int,
    ) -> None:
        self.fe, self.body, self.request, self.model, self.chat = fe, body, request, model, chat
        self.started = started  # perf_counter_ns when the request arrived
        self.options: Options = read_options(body.options)
        self.first: int | None = None  # perf_counter_ns of the first output
        # this request's context window: num_ctx, at most the server's --max-model-len
        self.window = min(self.options.num_ctx or fe.max_model_len, fe.max_model_len)
        # the room a cut prompt leaves to generate: num_predict, up to half the window (Ollama shifts its
        # context to go on generating, dropping the prompt's oldest tokens), else one token
        wanted = self.options.num_predict
        self.room = max(1, min(wanted, self.window // 2)) if wanted is not None and wanted > 0 else 1

    async def start(
        self,
        prompt_ids: list[int],
        tools: list[dict[str, Any]] | None = None,
        tool_choice: Any = None,
        text: str | None = None,
    ) -> Any:
        """Generate from ``prompt_ids`` (``text``: what they render, for the request log while no cut
        changes them)."""
        fe, body = self.fe, self.body
        ids, room = self.fit(prompt_ids)
        prompt = Prompt(text=text if ids == prompt_ids else None, token_ids=ids)
        self.prompt_ids = ids
        self.plan, constraint = fe.output_plan(
            ids,
            tools,
            tool_choice,
            parse_reasoning=body.think is not False,  # as Ollama: thinking off, every token is the answer
            constraint=format_constraint(body.format),
        )
        self.parsed = self.plan.reasoning_parser is not None or self.plan.tool_parser is not None
        await fe.check_constraint(constraint, "format")
        self.top = self._top_logprobs()
        unset = {k: v for k, v in SAMPLING_DEFAULTS.items() if fe.defaults.get(k) is None}
        request = SamplingRequest(
            **{**unset, **self.options.sampling},
            max_tokens=self._max_tokens(room),
            logprobs=self.top,
            structured_outputs=constraint,
            skip_special_tokens=fe.skip_special_tokens(self.plan),
            names={**self.options.names, "logprobs": "top_logprobs"},
        )
        params = fe.sampling_params(request, len(ids))
        if hasattr(fe.engine, "check_capacity"):  # refuse an overload before a stream's headers are sent
            fe.engine.check_capacity(1)
        self.submitted = time.perf_counter_ns()
        self.outputs = fe.engine.generate(prompt, params, engine_request_id("ollama"), delta=body.stream)
        if body.stream:
            # the first output is awaited before the headers, so that a refusal (the engine's, an
            # overload) is a real HTTP status with Ollama's error body, as Ollama's streams do
            first = await until_disconnected(self.request, anext(self.outputs))
            return StreamingResponse(
                self.stream(first), media_type="application/x-ndjson", headers={"X-Accel-Buffering": "no"}
            )
        return JSONResponse(await until_disconnected(self.request, self.whole()))

    # -- the context window ------------------------------------------------------------

    def fit(self, ids: list[int]) -> tuple[list[int], int]:
        """The prompt cut to this request's window (``num_ctx``, at most the server's
        ``--max-model-len``) as Ollama's runner cuts one: its first ``num_keep`` tokens (4 unless
        set) and its end are kept, with ``room`` left to generate. Returns the ids and the room left."""
        window, room = self.window, self.room
        if window < 2:
            raise bad_request(f"options.num_ctx={window} leaves no room to generate", "options.num_ctx")
        if self.body.truncate is False and len(ids) >= window:  # Ollama's error instead of a cut
            raise bad_request(
                f"the input length ({len(ids)} tokens) exceeds the context length ({window}); "
                "leave out truncate: false to have it cut",
                "truncate",
            )
        if len(ids) + room > window:
            keep = min(self.options.num_keep, window - room - 1)
            ids = ids[:keep] + ids[len(ids) - (window - room - keep) :]
        return ids, window - len(ids)

    def _max_tokens(self, room: int) -> int:
        """``num_predict``, at most what fits in the window; unset, the model's generation-config
        cap (as every llmp front-end); 0 or less (Ollama's -1 and -2), until the window is full."""
        wanted = self.options.num_predict
        if wanted is None:
            cap = self.fe.defaults.get("max_new_tokens")
            return min(room, cap) if cap is not None else room
        return room if wanted <= 0 else min(wanted, room)

    def _top_logprobs(self) -> int | None:
        """How many alternatives each token's logprobs list; None without ``logprobs`` (whose
        ``top_logprobs`` Ollama ignores)."""
        top = self.body.top_logprobs or 0
        if not 0 <= top <= 20:
            raise bad_request("top_logprobs must be between 0 and 20", "top_logprobs")
        return top if self.body.logprobs else None

    # -- replies ------------------------------------------------------------------------

    async def whole(self) -> dict[str, Any]:
        final = None
        async for final in self.outputs:
            self.first = self.first or time.perf_counter_ns()
        seq = final.outputs[0]
        content, reasoning, calls = seq.text, None, []
        if self.parsed:
            stream = self.plan.message_stream()
            stream.feed(seq.text, final=True)
            content, reasoning, calls = stream.sent.content, stream.sent.reasoning, stream.sent.tool_calls
        logprobs = LogprobsByText()
        logprobs.add(self._logprobs(seq), utf8_length(seq.text), cut=stopped_by_string(seq))
        reply = self.piece(content, reasoning, calls, logprobs.release())
        return {**reply, **self.done(seq.finish_reason, len(seq.token_ids), seq.token_ids)}

    async def stream(self, first: Any) -> AsyncIterator[str]:
        generated: list[int] = []
        text, reason = "", None
        parser = self.plan.message_stream() if self.parsed else None
        by_text, sent_bytes = LogprobsByText(), 0
        try:
            async for output in self._after(first):
                self.first = self.first or time.perf_counter_ns()
                seq = output.outputs[0]
                generated += seq.token_ids
                text += seq.text
                sent_bytes += utf8_length(seq.text)
                reason = seq.finish_reason
                content, reasoning = seq.text, None
                if parser is not None:
                    delta = parser.feed(text, final=reason is not None)
                    content, reasoning = delta.content, delta.reasoning
                by_text.add(self._logprobs(seq), sent_bytes, cut=stopped_by_string(seq), final=reason is not None)
                logprobs = by_text.release()
                if content or reasoning or logprobs:
                    yield ndjson(self.piece(content, reasoning, [], logprobs))
            if parser is not None and parser.sent.tool_calls:  # Ollama sends a call once it is whole
                yield ndjson(self.piece("", None, parser.sent.tool_calls, None))
            yield ndjson({**self.piece("", None, [], None), **self.done(reason, len(generated), generated)})
        except Exception as exc:  # noqa: BLE001  (after the headers, the error travels in the stream)
            yield ndjson({"error": as_api_error(exc).message})

    async def _after(self, first: Any) -> AsyncIterator[Any]:
        """The engine's outputs, ``first`` (already awaited) included."""
        yield first
        async for output in self.outputs:
            yield output

    def piece(self, content: str, reasoning: str | None, calls: Sequence[Any], logprobs: Any) -> dict[str, Any]:
        """A reply object before its ``done`` fields: the message (chat) or response (generate)."""
        thinking = reasoning if reasoning and self.plan.include_reasoning else None
        out: dict[str, Any] = {"model": self.model, "created_at": now_rfc3339()}
        if self.chat:
            message: dict[str, Any] = {"role": self.fe.options.response_role, "content": content}
            if thinking:
                message["thinking"] = thinking
            if calls:
                message["tool_calls"] = [tool_call(i, call) for i, call in enumerate(calls)]
            out["message"] = message
        else:
            out["response"] = content
            if thinking:
                out["thinking"] = thinking
        out["done"] = False
        if logprobs:
            out["logprobs"] = logprobs
        return out

    def done(self, reason: str | None, generated: int, token_ids: Sequence[int]) -> dict[str, Any]:
        end = time.perf_counter_ns()
        first = self.first or end
        out: dict[str, Any] = {
            "done": True,
            "done_reason": "length" if reason == "length" else "stop",
            "total_duration": end - self.started,
            "load_duration": self.submitted - self.started,  # templating and tokenizing: the model stays loaded
            "prompt_eval_count": len(self.prompt_ids),
            "prompt_eval_duration": max(1, first - self.submitted),
            "eval_count": generated,
            "eval_duration": max(1, end - first),
        }
        if not self.chat and not self.body.raw:  # /api/generate's conversation so far, for its next `context`
            out["context"] = [*self.prompt_ids, *token_ids]
        return out

    def _logprobs(self, seq: Any) -> list[dict[str, Any]] | None:
        if self.top is None or not seq.logprobs:
            return None
        out = []
        for token_id, entry in zip(seq.token_ids, seq.logprobs, strict=False):
            chosen = entry[token_id]
            ranked = sorted(
                (e for e in entry.items() if e[1].rank is not None and e[1].rank <= self.top), key=lambda e: e[1].rank
            )
            token_bytes = self.fe.token_bytes
            out.append(
                {
                    "token": chosen.decoded_token or "",
                    "logprob": max(chosen.logprob, FLOOR),
                    "bytes": token_bytes(token_id),
                    "top_logprobs": [
                        {"token": lp.decoded_token or "", "logprob": max(lp.logprob, FLOOR), "bytes": token_bytes(i)}
                        for i, lp in ranked
                    ],
                }
            )
        return out


def utf8_length(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def stopped_by_string(seq: Any) -> bool:
    return seq.finish_reason == "stop" and isinstance(seq.stop_reason, str)


class LogprobsByText:
    """Each token's logprobs sent with its text, as Ollama's runner sends them: held while the
    engine holds the text back (a possible stop string), and those of a stop string's tokens
    dropped with it, so the logprobs always cover the text returned, no more. Counted in UTF-8
    bytes (each entry's raw ``bytes``), which a token holding part of a character has too."""

    def __init__(self) -> None:
        self.pending: list[dict[str, Any]] = []
        self.ready: list[dict[str, Any]] = []
        self.covered = 0  # bytes of text the released tokens spell

    def add(self, entries: list[dict[str, Any]] | None, text_bytes: int, *, cut: bool, final: bool = True) -> None:
        """``entries`` generated; ``text_bytes``: the UTF-8 length of the text sent so far (the
        whole, at the end); ``cut``: the sequence ended on a stop string (cut from the text)."""
        self.pending += entries or []
        while self.pending and self.covered + _size(self.pending[0]) <= text_bytes:
            self._release()
        if final and cut:  # a token the text starts in is kept; the stop string's own are dropped
            while self.pending and self.covered < text_bytes:
                self._release()
            self.pending = []
        elif final:
            while self.pending:
                self._release()

    def release(self) -> list[dict[str, Any]] | None:
        ready, self.ready = self.ready, []
        return ready or None

    def _release(self) -> None:
        entry = self.pending.pop(0)
        self.covered += _size(entry)
        self.ready.append(entry)


def _size(entry: dict[str, Any]) -> int:
    raw = entry.get("bytes")
    return len(raw) if raw is not None else len(entry["token"].encode("utf-8", "surrogatepass"))


def tool_call(index: int, call: Any) -> dict[str, Any]:
    """A parsed call in Ollama's shape: the arguments as an object, not JSON text."""
    return {
        "id": call.id,
        "function": {"index": index, "name": call.name, "arguments": arguments_object(call.arguments)},
    }


def arguments_object(arguments: str) -> dict[str, Any]:
    """A call's JSON arguments as an object; a call cut off by num_predict gives what parses."""
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        from partial_json_parser import loads as partial_loads

        try:
            value = partial_loads(arguments)
        except Exception:  # noqa: BLE001  (nothing usable was generated)
            value = {}
    return value if isinstance(value, dict) else {}
