"""The front-end suite fails a deliberately broken front-end, check by check, with precise messages
(the route, what was sent, the status and what came back), and passes what it does right.

The broken front-end is one installed distribution (a package and its ``dist-info`` on a path the
server process sees too), so a single ``llmp serve`` shows every defect: the conforming front-ends
are the in-repo ones, each verified by its own ``tests/test_conformance.py``.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from llmp.conformance import CheckResult, verify
from llmp.testing import plugin_site

BROKEN = '''
"""A front-end with a defect for each check of the suite (and the probe of its protocol)."""

import asyncio
import json

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from llmp import Prompt, SamplingParams, hookimpl
from llmp.api import FrontendSpec
from llmp.conformance import ProbeRequest, json_lines


@hookimpl
def llmp_register_frontends():
    yield FrontendSpec(name="broken", impl="llmp_broken_frontend:BrokenFrontend", probe="llmp_broken_frontend:Probe")


class BrokenFrontend:
    public_paths = ("/open/",)  # and a route taking a body there
    error_paths = ("/broken/",)  # rendered by render_error, but the route answers its own errors otherwise

    def __init__(self, engine, options):
        self.engine = engine

    def render_error(self, error):
        return error.status, {"error": {"message": error.message}}

    def http_router(self):
        router = APIRouter()
        router.add_api_route("/broken/generate", self.generate, methods=["POST"])
        router.add_api_route("/open/echo", self.echo, methods=["POST"])
        return router

    async def serve(self):
        return None

    async def echo(self, request: Request):
        return await request.json()

    async def generate(self, request: Request):
        try:  # every failure a 500: bad JSON, missing or mistyped fields, a prompt beyond the context
            body = json.loads(await request.body())
            # any model served; the prompt's first token lost (the text differs from /v1/completions')
            prompt = Prompt(token_ids=self.engine.get_tokenizer().encode(body["prompt"])[1:])
            eos = bool(body["ignore_eos"])  # (a str here would hang the engine's request)
            params = SamplingParams(max_tokens=body["max_tokens"] + 0, temperature=0.0, ignore_eos=eos)
            if len(prompt.token_ids) > 512:
                raise RuntimeError("too long")
        except Exception as exc:
            return JSONResponse({"detail": repr(exc)}, status_code=500)
        pieces = asyncio.Queue()

        async def run():  # a task of its own: nothing cancels it when the client leaves
            async for output in self.engine.generate(prompt, params, delta=True):
                await pieces.put(output.outputs[0].text)
            await pieces.put(None)

        task = asyncio.ensure_future(run())
        if body.get("stream"):
            async def lines():
                while (piece := await pieces.get()) is not None:
                    yield json.dumps({"text": piece}) + "\\n"
                # no terminal line
            return StreamingResponse(lines(), media_type="application/x-ndjson")
        await asyncio.shield(task)
        text = ""
        while (piece := pieces.get_nowait()) is not None:
            text += piece
        return {"text": text}


class Probe:
    chat = False

    def request(self, generation):
        body = {"model": generation.model, "prompt": generation.prompt, "max_tokens": generation.max_tokens,
                "stream": generation.stream, "ignore_eos": generation.ignore_eos}
        return ProbeRequest("POST", "/broken/generate", body)

    def text(self, response, generation):
        if not generation.stream:
            return response.json()["text"]
        lines = json_lines(response.text)
        assert lines and lines[-1].get("done") is True, f"no done line at the end: {response.text[-80:]!r}"
        return "".join(line.get("text", "") for line in lines)
'''


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The broken front-end, installed: its module and a ``dist-info`` with the entry point."""
    site = tmp_path_factory.mktemp("site")
    plugin_site(site, "llmp_broken_frontend", textwrap.dedent(BROKEN), name="broken-frontend", version="0.1.0")
    return site


@pytest.fixture(scope="module")
def results(site: Path) -> dict[str, CheckResult]:
    """The suite's results on the broken front-end, by check name (one server for all)."""
    from llmp import plugins

    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(site))
        patch.setenv("PYTHONPATH", str(site))  # the server process loads it too
        patch.setattr(plugins, "_state", plugins._State())  # entry points read afresh
        report = verify("broken-frontend")
    assert not report.error, report.error
    return {result.check: result for result in report.results}


def result(results: dict[str, CheckResult], start: str) -> CheckResult:
    [found] = [r for name, r in results.items() if name.startswith(start)]
    return found


def test_a_500_on_malformed_json_fails_naming_the_route_body_and_status(results):
    bad = result(results, "bad bodies")
    assert bad.status == "failed"
    assert 'POST /broken/generate with malformed JSON (\'{"model": \'): 500 {"detail":' in bad.detail
    assert "expected a 4xx" in bad.detail
    assert "POST /broken/generate with an empty body (''): 500" in bad.detail


def test_a_500_on_a_field_of_the_wrong_type_names_the_field(results):
    wrong = result(results, "fields of the wrong type")
    assert wrong.status == "failed"
    assert 'POST /broken/generate with max_tokens = "many" (was 4): 500' in wrong.detail
    assert "with prompt = 42" in wrong.detail


def test_an_unknown_model_served_and_a_500_for_a_long_prompt(results):
    unknown = result(results, "unknown model")
    assert unknown.status == "failed"
    assert "POST /broken/generate with the model 'no-such-model' (not served), was answered (200" in unknown.detail
    long = result(results, "prompt longer than the context")
    assert long.status == "failed"
    assert re.search(r"POST /broken/generate with a prompt far longer than the context .*: 500 .*too long", long.detail)


def test_a_stream_without_its_terminal_line_fails_with_the_probes_words(results):
    stream = result(results, "stream ends cleanly")
    assert stream.status == "failed"
    assert stream.detail.startswith("POST /broken/generate (streamed): no done line at the end")


def test_a_text_unlike_the_references_fails_with_both_texts(results):
    parity = result(results, "greedy text equals openai's")
    assert parity.status == "failed"
    assert "broken said" in parity.detail and "openai (POST /v1/completions) said" in parity.detail


def test_a_request_left_running_after_its_client_left_fails(results):
    disconnect = result(results, "client leaving aborts the request")
    assert disconnect.status == "failed"
    assert "POST /broken/generate (streamed, 448 tokens): the client closed its connection mid-generation" in (
        disconnect.detail
    )
    assert "it finished with finished_reason 'length', 448 tokens generated" in disconnect.detail


def test_a_public_path_taking_a_body_and_an_error_shape_of_its_own_fail(results):
    public = result(results, "public paths")
    assert public.status == "failed"
    assert "POST /open/echo is under public_paths ['/open/']" in public.detail
    key = result(results, "API key guards every route")
    assert key.status == "failed"
    assert "POST /broken/generate with no API key: the 401 has the keys ['error', 'error.message']" in key.detail
    assert "(malformed JSON: 500) have ['detail']" in key.detail


def test_what_the_broken_front_end_does_right_passes(results):
    for start in ("starts", "oversized body", "stops on SIGTERM"):
        assert result(results, start).status == "passed", result(results, start)
