"""How the conformance kit (``llmp plugins verify``) asks this front-end for a generation:
``POST /v1/completions``, whole or as server-sent events ending with ``data: [DONE]``."""

from __future__ import annotations

import json

from llmp.conformance import Generation, ProbeRequest, ProbeResponse, sse_events


class CompletionsProbe:
    chat = False

    def request(self, generation: Generation) -> ProbeRequest:
        body = {
            "model": generation.model,
            "prompt": generation.prompt,
            "max_tokens": generation.max_tokens,
            "temperature": 0,
            "stream": generation.stream,
            "ignore_eos": generation.ignore_eos,
        }
        return ProbeRequest("POST", "/v1/completions", body)

    def text(self, response: ProbeResponse, generation: Generation) -> str:
        if not generation.stream:
            return response.json()["choices"][0]["text"]
        data = [payload for _, payload in sse_events(response.text)]
        assert data and data[-1] == "[DONE]", f"the stream did not end with 'data: [DONE]': {response.text[-300:]!r}"
        return "".join(json.loads(payload)["choices"][0]["text"] for payload in data[:-1])
