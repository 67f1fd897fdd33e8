"""A stream event's JSON (llmp.frontend.json_text) is one line for every line reader: a token's text holding
U+0085, U+2028 or U+2029, which JSON leaves as they are and str.splitlines() (httpx's iter_lines, so many SSE
clients) takes for line ends, is escaped; the decoded payload is unchanged."""

from __future__ import annotations

import json

import httpx

from llmp.frontend import json_text

TEXT = "next\x85line\u2028and\u2029para\nnewline\x0bvt\x1cfs \u00e9 \U0001f600"


def test_line_ends_in_text_are_escaped_and_decode_unchanged():
    payload = {"choices": [{"index": 0, "delta": {"content": TEXT}}]}
    text = json_text(payload)
    assert text.splitlines() == [text] and json.loads(text) == payload
    assert "\u00e9" in text  # other text stays UTF-8 as it is


def test_an_event_stream_reads_back_whole_through_httpx_iter_lines():
    events = [{"delta": {"content": TEXT[:i]}} for i in range(len(TEXT) + 1)]
    body = "".join(f"data: {json_text(event)}\n\n" for event in events).encode()
    response = httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})
    lines = [line for line in response.iter_lines() if line]
    assert [json.loads(line.removeprefix("data: ")) for line in lines] == events
