"""How the conformance kit (``llmp plugins verify frontend-tgi``) asks TGI's API for a generation:
the request, and the text read back out of its answer (see ``llmp.conformance.FrontendProbe``)."""

from __future__ import annotations

import json

from llmp.conformance import Generation, ProbeRequest, ProbeResponse, sse_events


class TGIProbe:
    chat = False  # the prompt is text to continue (compared with the OpenAI front-end's /v1/completions)

    def request(self, generation: Generation) -> ProbeRequest:
        # greedy (TGI's default); TGI has no way to ignore the end of sequence, nor a model field
        body = {"inputs": generation.prompt, "parameters": {"max_new_tokens": generation.max_tokens}}
        path = "/tgi/generate_stream" if generation.stream else "/tgi/generate"
        return ProbeRequest("POST", path, body)

    def text(self, response: ProbeResponse, generation: Generation) -> str:
        if not generation.stream:
            return response.json()["generated_text"]
        events = [json.loads(data) for _, data in sse_events(response.text)]
        assert events and events[-1].get("generated_text") is not None, (
            f"the stream did not end with an event carrying generated_text: {response.text[-300:]!r}"
        )
        return "".join(event["token"]["text"] for event in events)
