"""The live server the front-end suite checks: one ``llmp serve`` of a tiny Llama per front-end,
its routes (from its OpenAPI document), its engine's counters (``/metrics``), its processes, and
requests sent the way careless or departing clients send them."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmp.conformance.probes import ProbeRequest, ProbeResponse

API_KEY = "conformance-key"
SERVED_NAME = "tiny"
MAX_MODEL_LEN = 512  # the tiny Llama's whole context
BODY_LIMIT = 64 * 1024  # --max-request-body-bytes: small, so the limit check sends little
BODY_METHODS = ("POST", "PUT", "PATCH")
SHOWN = 300  # characters of a body quoted in a failure message
REQUEST_TIMEOUT_S = 60.0  # a request the server never answers fails the check after this long


@dataclass(frozen=True)
class Route:
    """One method of one path a front-end routes; ``path`` has its parameters filled in."""

    method: str
    template: str  # as declared: /v1/files/{file_id}

    @property
    def path(self) -> str:
        return re.sub(r"\{[^}]*\}", "x", self.template)

    @property
    def takes_body(self) -> bool:
        return self.method in BODY_METHODS

    def __str__(self) -> str:
        return f"{self.method} {self.template}"


def shown(text: str) -> str:
    """A body as a failure message quotes it: one line, cut short."""
    flat = " ".join(text.split())
    return flat if len(flat) <= SHOWN else flat[:SHOWN] + "..."


class FrontendServer:
    """``llmp serve`` on loopback with ``frontends`` mounted behind :data:`API_KEY`; ``failure``
    says why it did not start (then nothing else is set)."""

    def __init__(self, frontends: Iterable[str], model_dir: Path, log_dir: Path, ready_timeout: float) -> None:
        import httpx

        from llmp.testing import free_port, serving

        self.frontends = tuple(frontends)
        self.failure: str | None = None
        self._stack = contextlib.ExitStack()
        args = [f"--frontend={name}" for name in self.frontends]
        args += ["--api-key", API_KEY, "--served-model-name", SERVED_NAME, "--dtype", "float32"]
        args += ["--max-model-len", str(MAX_MODEL_LEN), "--max-request-body-bytes", str(BODY_LIMIT)]
        args += ["--grpc-port", str(free_port())]  # a front-end with its own port must not take a busy default
        self.command = "llmp serve MODEL " + " ".join(args)
        try:
            self.live = self._stack.enter_context(
                serving(model_dir, *args, ready_timeout=ready_timeout, log_dir=log_dir)
            )
        except AssertionError as exc:  # serving's own words: the exit status or the timeout, and the log
            self.failure = f"`{self.command}` did not start: {_tail(str(exc), 40)}"
            self._stack.close()
            return
        self.pid = self.live.process.pid
        self.url = self.live.url
        self.client = self._stack.enter_context(httpx.Client(base_url=self.url, timeout=REQUEST_TIMEOUT_S))

    # -- requests -------------------------------------------------------------------

    def send(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        key: str | None = API_KEY,
    ) -> ProbeResponse:
        """One request, the API key sent as a bearer token unless ``key`` is None; a body goes as JSON.
        No answer in time is an AssertionError naming the request."""
        import httpx

        sent = {"Authorization": f"Bearer {key}"} if key is not None else {}
        if body is not None:
            sent["Content-Type"] = "application/json"
        sent.update(headers or {})
        try:
            response = self.client.request(method, path, content=body, headers=sent)
        except httpx.TimeoutException:
            shown_body = "" if body is None else f" with the body {shown(body.decode(errors='replace'))!r}"
            raise AssertionError(f"{method} {path}{shown_body}: no answer within {REQUEST_TIMEOUT_S:.0f} s") from None
        return ProbeResponse(response.status_code, dict(response.headers), response.text)

    def call(self, request: ProbeRequest, *, key: str | None = API_KEY) -> ProbeResponse:
        """A probe's request, read to its end (a stream too). A body cut off mid-way (the connection
        closed before the last chunk) is an AssertionError saying so."""
        import httpx

        body = json.dumps(request.json).encode() if request.json is not None else None
        try:
            return self.send(request.method, request.path, body=body, headers=request.headers, key=key)
        except httpx.RemoteProtocolError as exc:
            raise AssertionError(
                f"{request.method} {request.path}: the response was cut off before its end ({exc})"
            ) from None

    def raw_connection(self, request: ProbeRequest) -> socket.socket:
        """A probe's request written on a socket of its own, nothing read: closing the socket is a
        client leaving mid-request."""
        body = json.dumps(request.json).encode()
        head = [
            f"{request.method} {request.path} HTTP/1.1",
            f"Host: 127.0.0.1:{self.live.port}",
            f"Authorization: Bearer {API_KEY}",
            "Content-Type: application/json",
            f"Content-Length: {len(body)}",
            *(f"{name}: {value}" for name, value in request.headers.items()),
        ]
        sock = socket.create_connection(("127.0.0.1", self.live.port), timeout=30)
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        return sock

    # -- what the server says about itself -------------------------------------------------

    def routes(self, frontend: str) -> list[Route]:
        """Every method and path ``frontend`` routes on the shared app: those its OpenAPI document
        tags with its name (the server tags each front-end's routes so). Routes left out of the
        document (``include_in_schema=False``) are not listed."""
        response = self.send("GET", "/openapi.json", key=None)
        assert response.status == 200, f"GET /openapi.json answered {response.status}: {shown(response.text)}"
        routes = []
        for template, operations in response.json().get("paths", {}).items():
            for method, operation in operations.items():
                if isinstance(operation, dict) and frontend in operation.get("tags", ()):
                    routes.append(Route(method.upper(), template))
        return routes

    def metrics(self) -> dict[str, float]:
        """``/metrics`` as ``{'name{labels}': value}``."""
        response = self.send("GET", "/metrics", key=None)
        assert response.status == 200, f"GET /metrics answered {response.status}: {shown(response.text)}"
        values = {}
        for line in response.text.splitlines():
            if line and not line.startswith("#"):
                series, _, value = line.rpartition(" ")
                values[series] = float(value)
        return values

    def alive(self) -> bool:
        return self.live.process.poll() is None

    def assert_alive(self, after: str) -> None:
        if not self.alive():
            raise AssertionError(
                f"the server exited with status {self.live.process.returncode} after {after}:\n{_tail(self.log(), 30)}"
            )

    def log(self) -> str:
        return self.live.log()

    def descendants(self) -> list[int]:
        """The server's child processes and theirs (the engine's), as Linux's /proc lists them."""
        found, pending = [], [self.pid]
        while pending:
            pid = pending.pop()
            for task in Path(f"/proc/{pid}/task").glob("*"):
                with contextlib.suppress(OSError):
                    children = [int(c) for c in (task / "children").read_text().split()]
                    found += children
                    pending += children
        return found

    def terminate(self, timeout: float) -> int | None:
        """SIGTERM, as a supervisor stops it; the exit status, or None if it still runs after ``timeout``."""
        if self.alive():
            os.kill(self.pid, signal.SIGTERM)
        with contextlib.suppress(Exception):
            return self.live.process.wait(timeout)
        return None

    def close(self) -> None:
        """Stop the server (killed if SIGTERM does not do it) and close the client."""
        self._stack.close()


def metric(values: Mapping[str, float], name: str, **labels: str) -> float:
    """The sum of series ``name`` over every label set holding ``labels``."""
    total = 0.0
    for series, value in values.items():
        base, _, rest = series.partition("{")
        found = dict(re.findall(r'(\w+)="([^"]*)"', rest))
        if base == name and all(found.get(k) == v for k, v in labels.items()):
            total += value
    return total


def _tail(text: str, lines: int) -> str:
    kept = text.rstrip().splitlines()
    return "\n".join(kept[-lines:]) if len(kept) > lines else text.rstrip()


def json_shape(value: Any, prefix: str = "") -> frozenset[str]:
    """The key paths of a JSON value (``{"error": {"message": ...}}`` -> ``error``, ``error.message``):
    what two error bodies of one protocol share whatever their messages say."""
    if not isinstance(value, dict):
        return frozenset()
    keys = set()
    for key, inner in value.items():
        keys.add(prefix + key)
        keys |= json_shape(inner, prefix + key + ".")
    return frozenset(keys)
