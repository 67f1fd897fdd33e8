"""How the conformance kit asks a front-end for a generation: the probe a front-end plugin names in
``FrontendSpec(probe="package.module:Probe")``.

A probe knows one thing the kit cannot guess: the shape of the protocol. Given a
:class:`Generation` (a prompt, a token budget, greedy), it builds the HTTP request of the
protocol (:meth:`FrontendProbe.request`) and reads the generated text back out of the answer
(:meth:`FrontendProbe.text`), whole or streamed. The kit does the rest: it sends the requests,
breaks them (wrong types, an unknown model, a prompt longer than the context), disconnects
mid-generation and compares the text with the OpenAI front-end's.

Nothing here imports more than the standard library: a probe module stays cheap to import.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class Generation:
    """A greedy generation (temperature 0) the kit asks a front-end for.

    ``prompt`` is the text to continue, or with a chat probe (``FrontendProbe.chat``) the content of
    the one user message. ``model`` is the served name, or (the unknown-model check) a name the
    server does not serve. ``ignore_eos``: keep generating past the end-of-sequence token, where the
    protocol can say so (the kit's long generations ask for it; a probe whose protocol cannot leaves it).
    """

    prompt: str
    max_tokens: int
    model: str
    stream: bool = False
    ignore_eos: bool = False


@dataclass(frozen=True)
class ProbeRequest:
    """An HTTP request: ``json`` is the body (sent as ``application/json``); ``headers`` are the
    protocol's own (the kit adds the API key)."""

    method: str
    path: str
    json: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ProbeResponse:
    """What came back: the status, the headers (names lower-cased) and the whole body as text (a
    streamed body too, once it has ended)."""

    status: int
    headers: Mapping[str, str]
    text: str

    def json(self) -> Any:
        return json.loads(self.text)


class Refused(Exception):
    """Raised by :meth:`FrontendProbe.text` for an answer that is the protocol's refusal although
    its HTTP status is a success (an MCP tool error is a 200 holding ``isError``): the message is
    the protocol's."""


@runtime_checkable
class FrontendProbe(Protocol):
    """How the conformance kit calls a front-end (``FrontendSpec.probe``).

    ``chat``: whether :meth:`request` sends the prompt as a user message through the chat template
    (then the OpenAI reference is ``/v1/chat/completions``), or as text to continue
    (``/v1/completions``).

    Optional: ``truncates_prompts = True`` for a protocol that cuts a prompt longer than the context
    to fit, by design (Ollama's runner keeps the prompt's first ``num_keep`` tokens and its end):
    the kit then wants such a prompt answered or refused, never a 500, where it otherwise wants it
    refused.
    """

    chat: bool

    def request(self, generation: Generation) -> ProbeRequest | None:
        """The request asking for ``generation``; None when the protocol cannot ask for it (a
        stream, from a protocol that answers whole): the checks needing it are skipped."""
        ...

    def text(self, response: ProbeResponse, generation: Generation) -> str:
        """The generated text of a successful answer to :meth:`request` (a streamed one joined
        from its pieces). Raise :class:`Refused` when the answer is the protocol's refusal, and
        AssertionError, saying what is missing, when it is not the protocol's answer: for a stream,
        when it did not end with the protocol's terminal event."""
        ...


def sse_events(text: str) -> list[tuple[str, str]]:
    """``(event, data)`` of each server-sent event of a stream's body (``event`` is ``"message"``
    when the event names none; ``data`` joins its data lines)."""
    events = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        name, data = "message", []
        for line in block.split("\n"):
            if line.startswith("event:"):
                name = line[len("event:") :].strip()
            elif line.startswith("data:"):
                data.append(line[len("data:") :].removeprefix(" "))
        if data:
            events.append((name, "\n".join(data)))
    return events


def json_lines(text: str) -> list[Any]:
    """Each line of a newline-delimited JSON stream (NDJSON), parsed."""
    return [json.loads(line) for line in text.splitlines() if line.strip()]
