"""The front-end suite: what every protocol front-end must do, whatever its protocol.

One ``llmp serve`` of a tiny random Llama per front-end, with the front-end mounted (and the
OpenAI front-end, the reference of the parity check, when it is installed) behind ``--api-key``:

- it starts, answers ``/health``, and on SIGTERM exits 0 leaving no process behind;
- every route it adds refuses a request without the API key (401/403, in the protocol's error
  shape where it has its own), and its ``public_paths`` answer without one (and take no body);
- an oversized body, malformed JSON, an empty body or a body of the wrong type is a 4xx on every
  route taking a body, never a 500;
- with a probe (``FrontendSpec.probe``, :class:`llmp.conformance.FrontendProbe`), which tells
  the kit how to ask the protocol for a generation: fields of the wrong type never make a 500, an
  unknown model and a prompt longer than the context are refused, a stream ends with its terminal
  event and the text of the whole answer, the greedy text equals the OpenAI front-end's, and a
  client leaving mid-generation aborts the engine's request.

A check that cannot apply is skipped saying why: a front-end with its own server (gRPC) routes
nothing on the HTTP app, a page takes no body, a protocol that answers whole has no stream.
Options (``verify(..., ready_timeout=S)``): ``ready_timeout``, the seconds the server may take to
start (default 180).
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from llmp.api import ComponentSpec, resolve_reference
from llmp.conformance.frontend_server import (
    API_KEY,
    BODY_LIMIT,
    MAX_MODEL_LEN,
    SERVED_NAME,
    FrontendServer,
    Route,
    json_shape,
    metric,
    shown,
)
from llmp.conformance.probes import FrontendProbe, Generation, ProbeRequest, ProbeResponse, Refused
from llmp.conformance.runner import Check, Context, SkipCheck

REFERENCE = "openai"  # the front-end whose greedy text the others must match
PROMPT = "The quick brown fox"
PARITY_TOKENS = 8
# greedy, the tiny Llama (seed 0) does not end this one early, as text or as a chat message
LONG_PROMPT = "Paged attention keeps"
LONG_TOKENS = MAX_MODEL_LEN - 64  # seconds of work on a CPU: still running when the client leaves
OVERLONG_PROMPT = "東京 " * MAX_MODEL_LEN  # several byte-level tokens a character: far beyond the context
UNKNOWN_MODEL = "no-such-model"
BAD_BODIES = (  # (what, body, must be refused: a success is as wrong as a 500)
    ("malformed JSON", b'{"model": ', True),
    ("an empty body", b"", True),
    ("a JSON array", b"[1, 2]", False),
    ("a JSON string", b'"text"', False),
    ("JSON null", b"null", False),
    ("an empty JSON object", b"{}", False),
)
WAIT_S = 60.0  # for the engine to pick a request up, or to let go of one, on a busy machine
STOP_S = 30.0


def suite(spec: ComponentSpec, context: Context) -> Iterator[Check]:
    """The checks of front-end ``spec`` (see the module's docstring), in the order they run."""
    checks = FrontendChecks(spec, context)
    yield Check("starts and answers /health", checks.starts)
    yield Check("API key guards every route", checks.api_key)
    yield Check("public paths answer without the key", checks.public_paths)
    yield Check("oversized body is a 4xx", checks.body_limit)
    yield Check("bad bodies are a 4xx, never a 500", checks.bad_bodies)
    yield Check("fields of the wrong type never a 500", checks.wrong_types)
    yield Check("unknown model is refused", checks.unknown_model)
    yield Check("prompt longer than the context is refused", checks.overlong_prompt)
    yield Check("stream ends cleanly, whole", checks.stream)
    yield Check(f"greedy text equals {REFERENCE}'s", checks.parity)
    yield Check("client leaving aborts the request", checks.disconnect)
    yield Check("stops on SIGTERM, no process left", checks.stops)


class FrontendChecks:
    """The checks of one front-end, sharing its server (built by the first check that needs it)."""

    def __init__(self, spec: ComponentSpec, context: Context) -> None:
        self.spec = spec
        self.name = spec.name
        self.context = context
        self._cache: dict[str, Any] = {}

    # -- what the checks share ------------------------------------------------------------

    def _once(self, key: str, build: Callable[[], Any]) -> Any:
        if key not in self._cache:
            self._cache[key] = build()
        return self._cache[key]

    def _launch(self) -> FrontendServer:
        def model() -> Path:
            from llmp.testing import save_tiny_llama

            path = self.context.workdir / "tiny-llama"
            save_tiny_llama(path)
            return path

        model_dir = self.context.once("frontends:tiny-llama", model)
        frontends = [self.name] + ([REFERENCE] if self._reference_installed() else [])
        timeout = float(self.context.options.get("ready_timeout", 180))
        return self.context.once(
            f"frontends:server:{self.name}",
            lambda: FrontendServer(dict.fromkeys(frontends), model_dir, self.context.workdir, timeout),
        )

    def _server(self) -> FrontendServer:
        server = self._launch()
        if server.failure:
            raise SkipCheck("the server did not start (see the check 'starts and answers /health')")
        server.assert_alive("the checks before this one")
        return server

    def _reference_installed(self) -> bool:
        from llmp import registry
        from llmp.api import UnknownComponentError

        if self.name == REFERENCE:
            return False
        try:
            registry.get_component("frontend", REFERENCE)
        except UnknownComponentError:
            return False
        return True

    def _declared(self, attribute: str) -> tuple[str, ...]:
        """A class attribute the server reads (``public_paths``, ``error_paths``): a sequence of paths."""
        value = getattr(self.spec.load(), attribute, ())
        return tuple(value) if isinstance(value, tuple | list) else ()

    def _probe(self) -> FrontendProbe:
        reference = getattr(self.spec, "probe", None)
        if not reference:
            raise SkipCheck(
                f"{self.name} names no probe (FrontendSpec.probe): the kit cannot ask its protocol for a "
                "generation (see docs/plugins.md, 'Writing a front-end')"
            )

        def load() -> FrontendProbe:
            probe = resolve_reference(reference)
            probe = probe() if isinstance(probe, type) else probe
            missing = [a for a in ("chat", "request", "text") if not hasattr(probe, a)]
            assert not missing, (
                f"the probe {reference} has no {', '.join(missing)} (see llmp.conformance.FrontendProbe)"
            )
            return probe

        return self._once("probe", load)

    def _probe_request(self, generation: Generation, needs: str) -> ProbeRequest:
        request = self._probe().request(generation)
        if request is None:
            raise SkipCheck(f"the probe of {self.name} cannot ask for {needs}")
        return request

    def _routes(self) -> list[Route]:
        """The front-end's routes on the shared app, and its probe's route when the OpenAPI
        document leaves it out."""

        def collect() -> list[Route]:
            routes = self._server().routes(self.name)
            try:
                request = self._probe().request(Generation(PROMPT, 4, SERVED_NAME))
            except SkipCheck:
                request = None
            if request is not None and not any(r.path == request.path for r in routes):
                routes.append(Route(request.method.upper(), request.path))
            return routes

        return self._once("routes", collect)

    def _body_routes(self) -> list[Route]:
        routes = [r for r in self._routes() if r.takes_body]
        if not routes:
            raise SkipCheck(f"no route of {self.name} takes a body")
        return routes

    def _valid_body(self, route: Route) -> tuple[bytes, dict[str, str]]:
        """A body the route takes: the probe's request on its route, else ``{}``."""
        try:
            request = self._probe().request(Generation(PROMPT, 4, SERVED_NAME))
        except SkipCheck:
            request = None
        if request is not None and request.path == route.path and request.method.upper() == route.method:
            return json.dumps(request.json).encode(), dict(request.headers)
        return b"{}", {}

    def _whole_text(self) -> str:
        """The greedy text of the probe's short generation, answered whole."""

        def generate() -> str:
            generation = Generation(PROMPT, PARITY_TOKENS, SERVED_NAME)
            request = self._probe_request(generation, "a generation")
            response = self._server().call(request)
            assert response.status == 200, f"{_described(request)}: {response.status} {shown(response.text)}"
            return self._read(request, response, generation)

        return self._once("whole text", generate)

    def _read(self, request: ProbeRequest, response: ProbeResponse, generation: Generation) -> str:
        """The probe's text of an answer; its complaint (a stream without its end) names the request."""
        try:
            return self._probe().text(response, generation)
        except AssertionError as exc:
            how = "streamed" if generation.stream else "whole"
            raise AssertionError(f"{_described(request)} ({how}): {exc}") from None

    def _expect_refusal(self, generation: Generation, what: str) -> None:
        request = self._probe_request(generation, what)
        response = self._server().call(request)
        where = f"{_described(request)} with {what}"
        assert not _server_error(response.status), f"{where}: {response.status} {shown(response.text)} (expected a 4xx)"
        if response.status >= 400:
            return
        try:
            text = self._probe().text(response, generation)
        except Refused:
            return
        raise AssertionError(f"{where} was answered ({response.status}, text {text!r}) instead of refused")

    # -- the checks ---------------------------------------------------------------------------

    def starts(self) -> None:
        server = self._launch()
        if server.failure:
            raise AssertionError(server.failure)

    def api_key(self) -> None:
        routes = self._routes()
        if not routes:
            raise SkipCheck(
                f"{self.name} routes nothing on the server's HTTP app (a front-end with a server of its own "
                "must check --api-key there: test it in the plugin's own tests)"
            )
        public = self._declared("public_paths")
        guarded = [r for r in routes if not _public_path(r.path, public)]
        if not guarded:
            raise SkipCheck(f"every route of {self.name} is under its public_paths")
        server = self._server()
        error_paths = self._declared("error_paths")
        problems = []
        for route in guarded:
            body, headers = self._valid_body(route) if route.takes_body else (None, {})
            for key, what in ((None, "no API key"), ("not-the-key", "a wrong API key")):
                response = server.send(route.method, route.path, body=body, headers=headers, key=key)
                if response.status not in (401, 403):
                    problems.append(
                        f"{route} with {what}: {response.status} {shown(response.text)} (expected 401 or 403)"
                    )
                    continue
                problem = self._error_body_problem(server, route, response, error_paths)
                if problem:
                    problems.append(f"{route} with {what}: {problem}")
        assert not problems, "\n".join(problems)

    def _error_body_problem(
        self, server: FrontendServer, route: Route, refusal: ProbeResponse, error_paths: tuple[str, ...]
    ) -> str:
        """Whether a refusal is a JSON error in the protocol's shape: where the front-end renders its
        own errors (``error_paths``), the shape of its answer to malformed JSON on the same route."""
        if route.method == "HEAD":
            return ""  # a HEAD answer has no body
        try:
            body = refusal.json()
        except ValueError:
            return f"the {refusal.status} is not JSON: {shown(refusal.text)}"
        if not isinstance(body, dict):
            return f"the {refusal.status} is not a JSON object: {shown(refusal.text)}"
        if not route.takes_body or not any(route.path.startswith(prefix) for prefix in error_paths):
            return ""
        own = server.send(route.method, route.path, body=b'{"model": ')
        try:
            expected = json_shape(own.json())
        except ValueError:
            return ""  # not JSON: the bad-bodies check reports it
        got = json_shape(body)
        if got != expected:
            return (
                f"the {refusal.status} has the keys {sorted(got)}, but the route's own errors (malformed JSON: "
                f"{own.status}) have {sorted(expected)}: render the gate's refusals with render_error"
            )
        return ""

    def public_paths(self) -> None:
        declared = self._declared("public_paths")
        if not declared:
            raise SkipCheck(f"{self.name} declares no public_paths")
        routes = [r for r in self._routes() if _public_path(r.path, declared)]
        # an exact public path is a page to ask for, routed in the OpenAPI document or not
        listed = {r.path for r in routes}
        routes += [Route("GET", p) for p in declared if (p == "/" or not p.endswith("/")) and p not in listed]
        if not routes:
            raise SkipCheck(f"no route of {self.name} is under its public_paths {list(declared)}")
        server = self._server()
        problems = []
        for route in routes:
            if route.takes_body:
                problems.append(
                    f"{route} is under public_paths {list(declared)}: public paths are for pages and files, "
                    "which take no body and run no model"
                )
                continue
            response = server.send(route.method, route.path, key=None)
            if response.status in (401, 403) or _server_error(response.status):
                problems.append(f"{route} without the API key: {response.status} {shown(response.text)}")
        assert not problems, "\n".join(problems)

    def body_limit(self) -> None:
        routes = self._body_routes()
        server = self._server()
        body = b'{"padding": "' + b"x" * BODY_LIMIT + b'"}'
        problems = []
        for route in routes:
            response = server.send(route.method, route.path, body=body)
            if not 400 <= response.status < 500:
                problems.append(
                    f"{route} with a body of {len(body)} bytes (--max-request-body-bytes {BODY_LIMIT}): "
                    f"{response.status} {shown(response.text)} (expected a 4xx: 413)"
                )
        assert not problems, "\n".join(problems)

    def bad_bodies(self) -> None:
        routes = self._body_routes()
        server = self._server()
        problems = []
        for route in routes:
            _, headers = self._valid_body(route)
            for what, body, refused in BAD_BODIES:
                response = server.send(route.method, route.path, body=body, headers=headers)
                if _server_error(response.status) or (refused and response.status < 400):
                    problems.append(
                        f"{route} with {what} ({body.decode()!r}): {response.status} {shown(response.text)} "
                        f"(expected a 4xx)"
                    )
        server.assert_alive("the bad bodies")
        assert not problems, "\n".join(problems)

    def wrong_types(self) -> None:
        generation = Generation(PROMPT, 4, SERVED_NAME)
        request = self._probe_request(generation, "a generation")
        server = self._server()
        problems = []
        for label, where, was, wrong in _wrong_types(request.json):
            body = _replaced(request.json, where, wrong)
            response = server.send(
                request.method, request.path, body=json.dumps(body).encode(), headers=request.headers
            )
            if _server_error(response.status):
                problems.append(
                    f"{_described(request)} with {label} = {json.dumps(wrong)} (was {shown(json.dumps(was))}): "
                    f"{response.status} {shown(response.text)} (expected a 4xx)"
                )
        server.assert_alive("the fields of the wrong type")
        assert not problems, "\n".join(problems)

    def unknown_model(self) -> None:
        generation = Generation(PROMPT, 4, UNKNOWN_MODEL)
        request = self._probe_request(generation, "a model by name")
        if UNKNOWN_MODEL not in json.dumps([request.json, dict(request.headers)]):
            raise SkipCheck(f"the probe of {self.name} names no model in its request")
        self._expect_refusal(generation, f"the model {UNKNOWN_MODEL!r} (not served),")

    def overlong_prompt(self) -> None:
        generation = Generation(OVERLONG_PROMPT, 4, SERVED_NAME)
        what = f"a prompt far longer than the context ({MAX_MODEL_LEN} tokens)"
        if not getattr(self._probe(), "truncates_prompts", False):
            return self._expect_refusal(generation, what)
        # a protocol that cuts the prompt to fit, by design: an answer or a refusal, never a 500
        request = self._probe_request(generation, what)
        response = self._server().call(request)
        where = f"{_described(request)} with {what} (the probe says the protocol cuts it to fit)"
        assert not _server_error(response.status), f"{where}: {response.status} {shown(response.text)}"
        if response.status < 400:
            try:
                self._read(request, response, generation)
            except Refused:
                pass
        return None

    def stream(self) -> None:
        generation = Generation(PROMPT, PARITY_TOKENS, SERVED_NAME, stream=True)
        request = self._probe_request(generation, "a stream (its protocol answers whole)")
        response = self._server().call(request)
        assert response.status == 200, f"{_described(request)}: {response.status} {shown(response.text)}"
        streamed = self._read(request, response, generation)
        whole = self._whole_text()
        assert streamed == whole, (
            f"{_described(request)}: the streamed text {streamed!r} is not the whole answer's {whole!r} "
            "(pieces lost, repeated or cut)"
        )

    def parity(self) -> None:
        if self.name == REFERENCE:
            raise SkipCheck(f"{REFERENCE} is the reference of this check")
        if not self._reference_installed():
            raise SkipCheck(f"the reference front-end {REFERENCE!r} (llmp-frontend-openai) is not installed")
        text = self._whole_text()
        probe = self._probe()
        fields = {"model": SERVED_NAME, "max_tokens": PARITY_TOKENS, "temperature": 0}
        if probe.chat:
            path, fields["messages"] = "/v1/chat/completions", [{"role": "user", "content": PROMPT}]
        else:
            path, fields["prompt"] = "/v1/completions", PROMPT
        response = self._server().send("POST", path, body=json.dumps(fields).encode())
        assert response.status == 200, f"the reference, POST {path}: {response.status} {shown(response.text)}"
        choice = response.json()["choices"][0]
        expected = choice["message"]["content"] if probe.chat else choice["text"]
        assert text == expected, (
            f"greedy, {PARITY_TOKENS} tokens of {PROMPT!r}: {self.name} said {text!r}, {REFERENCE} (POST {path}) "
            f"said {expected!r}"
        )

    def disconnect(self) -> None:
        long = Generation(LONG_PROMPT, LONG_TOKENS, SERVED_NAME, stream=True, ignore_eos=True)
        request = self._probe().request(long)
        if request is None:  # a protocol that answers whole: the client leaves while it waits
            long = Generation(LONG_PROMPT, LONG_TOKENS, SERVED_NAME, ignore_eos=True)
            request = self._probe_request(long, "a generation")
        server = self._server()
        where = f"{_described(request)} ({'streamed' if long.stream else 'answered whole'}, {LONG_TOKENS} tokens)"
        before = server.metrics()
        connection = server.raw_connection(request)
        try:
            _wait_running(server, before, where, connection)
        finally:
            connection.close()
        _wait_idle(server, where)
        after = server.metrics()
        finished = _finished(before, after)
        if finished.get("abort") != 1 or sum(finished.values()) != 1:
            generated = metric(after, "llmp_generation_tokens_total") - metric(before, "llmp_generation_tokens_total")
            raise AssertionError(
                f"{where}: the client closed its connection mid-generation, but the engine's request was not "
                f"aborted: {_reasons(finished)}, {generated:.0f} tokens generated "
                "(cancel the engine's work when the client leaves: llmp.frontend.until_disconnected, or "
                "generate inside the streamed response)"
            )

    def stops(self) -> None:
        server = self._server()
        children = server.descendants()
        status = server.terminate(STOP_S)
        if status is None:
            raise AssertionError(f"the server still ran {STOP_S:.0f} s after SIGTERM")
        assert status == 0, f"the server exited with status {status} after SIGTERM (expected 0):\n{_tail(server.log())}"
        from llmp.testing import pid_alive

        deadline = time.monotonic() + 10
        while (left := [pid for pid in children if pid_alive(pid)]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not left, f"processes {left} of the server still run after it exited on SIGTERM"


# -- helpers -------------------------------------------------------------------------------


def _server_error(status: int) -> bool:
    """A 5xx other than 501: a route answering that it is not implemented (Ollama's ``/api/push``
    in llmp) is telling the client so, not failing."""
    return status >= 500 and status != 501


def _public_path(path: str, public: tuple[str, ...]) -> bool:
    """The server's rule: a public path is exact, or a prefix when it ends in ``/`` (never ``/`` itself)."""
    return any(path == p or (p != "/" and p.endswith("/") and path.startswith(p)) for p in public)


def _described(request: ProbeRequest) -> str:
    return f"{request.method} {request.path}"


def _tail(text: str, lines: int = 20) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


Where = tuple[str | int, ...]


def _wrong_types(body: Any) -> Iterator[tuple[str, Where, Any, Any]]:
    """``(label, where, value, a value of another JSON type)`` for every value in a request body:
    each field, container or not, and what containers hold (a list's first item)."""

    def walk(value: Any, where: Where) -> Iterator[tuple[str, Where, Any, Any]]:
        if where:
            label = "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else p) for i, p in enumerate(where))
            yield label, where, value, _other_type(value)
        if isinstance(value, dict):
            for key, inner in value.items():
                yield from walk(inner, (*where, key))
        elif isinstance(value, list) and value:
            yield from walk(value[0], (*where, 0))

    return walk(body, ())


def _other_type(value: Any) -> Any:
    if isinstance(value, bool):
        return "maybe"
    if isinstance(value, int | float):
        return "many"
    if isinstance(value, str):
        return 42
    if isinstance(value, list):
        return {"x": 1}
    if isinstance(value, dict):
        return "x"
    return []  # null


def _replaced(value: Any, where: Where, new: Any) -> Any:
    """A copy of ``value`` with the item at ``where`` replaced by ``new``."""
    if not where:
        return new
    head, rest = where[0], where[1:]
    if isinstance(value, dict):
        return {**value, head: _replaced(value[head], rest, new)}
    return [_replaced(item, rest, new) if i == head else item for i, item in enumerate(value)]


def _finished(before: dict[str, float], after: dict[str, float]) -> dict[str, int]:
    """Requests finished between two readings of ``/metrics``, by finish reason."""
    reasons: dict[str, int] = {}
    for series, value in after.items():
        if series.startswith("llmp_request_success_total{"):
            grew = int(value - before.get(series, 0.0))
            if grew:
                reason = series.split('finished_reason="', 1)[-1].split('"', 1)[0]
                reasons[reason] = reasons.get(reason, 0) + grew
    return reasons


def _reasons(finished: dict[str, int]) -> str:
    """``it finished with finished_reason 'length'``, or how many finished how."""
    if sum(finished.values()) == 1:
        return f"it finished with finished_reason {next(iter(finished))!r}"
    return "; ".join(f"{count} finished with {reason!r}" for reason, count in finished.items()) or "none finished"


def _wait_running(server: FrontendServer, before: dict[str, float], where: str, connection: socket.socket) -> None:
    """Until the engine runs the request (or it has already ended: a failure, the client was still there)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        now = server.metrics()
        if metric(now, "llmp_num_requests_running") + metric(now, "llmp_num_requests_waiting") >= 1:
            return
        finished = _finished(before, now)
        if finished:
            connection.settimeout(5)
            try:
                answer = connection.recv(2000).decode(errors="replace")
            except OSError:
                answer = ""
            raise AssertionError(
                f"{where}: the request ended before the client could leave ({_reasons(finished)}): it must run "
                f"long (ignore EOS where the protocol can; the answer began {shown(answer)!r})"
            )
        time.sleep(0.02)
    raise AssertionError(f"{where}: the engine did not start the request within {WAIT_S:.0f} s")


def _wait_idle(server: FrontendServer, where: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        now = server.metrics()
        if metric(now, "llmp_num_requests_running") + metric(now, "llmp_num_requests_waiting") == 0:
            return
        time.sleep(0.02)
    raise AssertionError(
        f"{where}: the engine still ran the request {WAIT_S:.0f} s after the client closed its connection "
        "(cancel the engine's work when the client leaves)"
    )


__all__ = ["API_KEY", "FrontendChecks", "suite"]
