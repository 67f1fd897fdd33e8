"""How the conformance kit (``llmp plugins verify``) asks this front-end for a generation: the
``generate`` tool called over streamable HTTP (``POST /mcp``, stateless, answered whole)."""

from __future__ import annotations

from llmp.conformance import Generation, ProbeRequest, ProbeResponse, Refused


class GenerateToolProbe:
    chat = False

    def request(self, generation: Generation) -> ProbeRequest | None:
        if generation.stream:
            return None  # a tool answers once
        arguments = {
            "prompt": generation.prompt,
            "max_tokens": generation.max_tokens,
            "temperature": 0,
            "model": generation.model,
        }  # the tool cannot ignore the end of the sequence
        body = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "generate", "arguments": arguments},
        }
        return ProbeRequest("POST", "/mcp", body, {"Accept": "application/json, text/event-stream"})

    def text(self, response: ProbeResponse, generation: Generation) -> str:
        answer = response.json()
        if "error" in answer:
            raise Refused(answer["error"].get("message", str(answer["error"])))
        result = answer["result"]
        if result.get("isError"):
            raise Refused(" ".join(part.get("text", "") for part in result["content"]))
        [part] = result["content"]
        return part["text"]
