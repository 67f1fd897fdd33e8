"""The conformance kit: the checks a plugin of each kind must pass, run against the installed plugin.

``llmp plugins verify NAME`` runs them and prints a report; a plugin's own tests call
:func:`assert_conforms` (or :func:`verify` for the report). Each kind has a suite module here
(``models``, ``kernels``, ``frontends``, ``parsers``, ``executors``, ``scheduling``, ``misc``): a
function ``suite(spec, context)`` that yields :class:`Check` objects, each a named callable that
raises ``AssertionError`` (the check failed: the message says precisely how) or :class:`SkipCheck`
(the check does not apply: the message says why). Checks build what they need (tiny random models
of real architectures, loopback servers) under ``context.workdir``.

Nothing here is imported by ``import llmp``: the suites import torch and transformers when they run.
"""

from __future__ import annotations

from llmp.conformance.report import CheckResult, Report
from llmp.conformance.runner import SUITES, Check, Context, SkipCheck, assert_conforms, verify

__all__ = ["SUITES", "Check", "CheckResult", "Context", "Report", "SkipCheck", "assert_conforms", "verify"]
