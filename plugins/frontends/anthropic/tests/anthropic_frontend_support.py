"""Constants and helpers shared by the Anthropic front-end tests (conftest puts this folder on sys.path)."""

from __future__ import annotations

import json

API_KEY = "Secret-Key-42"


def sse_events(text: str) -> list[tuple[str, dict]]:
    """``(event, data)`` of each SSE event; the event name must match the data's ``type``."""
    events = []
    for chunk in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in chunk.splitlines())
        data = json.loads(lines["data"])
        assert lines["event"] == data["type"], chunk
        events.append((lines["event"], data))
    return events
