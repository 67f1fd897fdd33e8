"""How the conformance kit (``llmp plugins verify``) asks this front-end for a generation:
``POST /v1/messages`` with one user message, whole or as events ending with ``message_stop``."""

from __future__ import annotations

import json

from llmp.conformance import Generation, ProbeRequest, ProbeResponse, sse_events


class MessagesProbe:
    chat = True

    def request(self, generation: Generation) -> ProbeRequest:
        body = {
            "model": generation.model,
            "messages": [{"role": "user", "content": generation.prompt}],
            "max_tokens": generation.max_tokens,
            "temperature": 0,
            "stream": generation.stream,
        }  # the Messages API cannot ignore the end of the sequence
        return ProbeRequest("POST", "/v1/messages", body, {"anthropic-version": "2023-06-01"})

    def text(self, response: ProbeResponse, generation: Generation) -> str:
        if not generation.stream:
            return "".join(block["text"] for block in response.json()["content"] if block["type"] == "text")
        events = [(name, json.loads(data)) for name, data in sse_events(response.text)]
        assert events and events[-1][0] == "message_stop", (
            f"the stream did not end with a message_stop event: {response.text[-300:]!r}"
        )
        return "".join(
            data["delta"]["text"]
            for name, data in events
            if name == "content_block_delta" and data["delta"]["type"] == "text_delta"
        )
