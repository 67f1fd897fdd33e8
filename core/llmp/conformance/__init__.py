"""The conformance kit: the checks a plugin of each kind must pass, run against the installed plugin.

``llmp plugins verify NAME`` runs them and prints a report; a plugin's own tests call
:func:`assert_conforms` (or :func:`verify` for the report). Each kind has a suite module here
(``models``, ``kernels``, ``frontends``, ``parsers``, ``executors``, ``scheduling``, ``misc``): a
function ``suite(spec, context)`` that yields :class:`Check` objects, each a named callable that
raises ``AssertionError`` (the check failed: the message says precisely how) or :class:`SkipCheck`
(the check does not apply: the message says why). Checks build what they need (tiny random models
of real architectures, loopback servers) under ``context.workdir``.

A front-end plugin tells the kit how to ask its protocol for a generation with a probe
(:class:`FrontendProbe`, named by ``FrontendSpec.probe``): requests as :class:`ProbeRequest`,
answers as :class:`ProbeResponse`, with :func:`sse_events` and :func:`json_lines` to read streams.

Nothing here is imported by ``import llmp``: the suites import torch and transformers when they run.
"""

from __future__ import annotations

from llmp.conformance.parser_samples import ParserSample
from llmp.conformance.probes import (
    FrontendProbe,
    Generation,
    ProbeRequest,
    ProbeResponse,
    Refused,
    json_lines,
    sse_events,
)
from llmp.conformance.report import CheckResult, Report
from llmp.conformance.runner import SUITES, Check, Context, SkipCheck, assert_conforms, verify
from llmp.conformance.tiny_models import TinyModel, save_tiny_architecture

__all__ = [
    "SUITES",
    "Check",
    "CheckResult",
    "Context",
    "FrontendProbe",
    "Generation",
    "ParserSample",
    "ProbeRequest",
    "ProbeResponse",
    "Refused",
    "Report",
    "SkipCheck",
    "TinyModel",
    "assert_conforms",
    "json_lines",
    "save_tiny_architecture",
    "sse_events",
    "verify",
]
