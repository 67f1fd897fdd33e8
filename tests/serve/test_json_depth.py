"""The gate's JSON depth scan: brackets inside strings do not count; a large shallow body is cheap."""

from __future__ import annotations

import json
import time

import pytest

from llmp.server.app import json_depth_exceeds


@pytest.mark.parametrize(
    "body, limit, exceeds",
    [
        (b"[" * 65 + b"]" * 65, 64, True),
        (b"[" * 64 + b"]" * 64, 64, False),
        (json.dumps({"a": "[[[[" * 100}).encode(), 3, False),  # brackets in a string
        (json.dumps({"a": 'x\\"[[[[' * 100}).encode(), 3, False),  # escaped quotes do not end the string
        (json.dumps({"a": "x\\" * 10, "b": [[[[1]]]]}).encode(), 4, True),  # a string ending in a backslash
        (b'{"a":[[[[1]]]]}', 4, True),
        (b'{"a":[[[[1]]]]}', 5, False),
    ],
)
def test_depth(body, limit, exceeds):
    assert json_depth_exceeds(body, limit) is exceeds


def test_a_large_shallow_body_is_scanned_quickly():
    body = json.dumps({"junk": [[1]] * 400_000}).encode()
    started = time.perf_counter()
    assert not json_depth_exceeds(body, 64)
    assert time.perf_counter() - started < 0.5  # a pure-Python scan took over a second
