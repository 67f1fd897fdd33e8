"""How the conformance kit (``llmp plugins verify``) asks this front-end for a generation:
``POST /api/chat`` with one user message, whole or as NDJSON ending with a ``"done": true`` line."""

from __future__ import annotations

from llmp.conformance import Generation, ProbeRequest, ProbeResponse, json_lines


class ChatProbe:
    chat = True
    truncates_prompts = True  # Ollama's runner cuts a prompt to the window: its first num_keep tokens and its end

    def request(self, generation: Generation) -> ProbeRequest:
        body = {
            "model": generation.model,
            "messages": [{"role": "user", "content": generation.prompt}],
            "stream": generation.stream,
            "options": {"temperature": 0, "num_predict": generation.max_tokens},
        }  # Ollama's options cannot ignore the end of the sequence
        return ProbeRequest("POST", "/api/chat", body)

    def text(self, response: ProbeResponse, generation: Generation) -> str:
        if not generation.stream:
            return response.json()["message"]["content"]
        lines = json_lines(response.text)
        assert lines and lines[-1].get("done") is True, (
            f"the stream did not end with a done line: {response.text[-300:]!r}"
        )
        return "".join(line["message"]["content"] for line in lines)
