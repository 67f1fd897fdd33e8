"""How the conformance kit (``llmp plugins verify``) asks this front-end for a generation: a
completion body on ``POST /invocations``, answered whole (SageMaker's route does not stream)."""

from __future__ import annotations

from llmp.conformance import Generation, ProbeRequest, ProbeResponse


class InvocationsProbe:
    chat = False

    def request(self, generation: Generation) -> ProbeRequest | None:
        if generation.stream:
            return None
        body = {
            "model": generation.model,
            "prompt": generation.prompt,
            "max_tokens": generation.max_tokens,
            "temperature": 0,
            "ignore_eos": generation.ignore_eos,
        }
        return ProbeRequest("POST", "/invocations", body)

    def text(self, response: ProbeResponse, generation: Generation) -> str:
        return response.json()["choices"][0]["text"]
