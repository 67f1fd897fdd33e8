"""Arguments JSON built one complete key/value pair at a time, so a streamed prefix is a prefix of the whole.

``{"a": 1, "b": "x"}`` is produced as ``{`` then ``"a": 1`` then ``, "b": "x"`` then ``}``:
the text of a call whose end has not been seen lacks the closing brace, and each pair is
added only once its value is complete. The result equals ``json.dumps(args, ensure_ascii=False)``.
"""

from __future__ import annotations

import ast
import json
from typing import Any


def json_pair(key: str, value: Any) -> str | None:
    """``"key": value`` as JSON text, or None if ``value`` has no JSON form (NaN, infinity, bytes...)."""
    try:
        return f"{json.dumps(key, ensure_ascii=False)}: {json.dumps(value, ensure_ascii=False, allow_nan=False)}"
    except (TypeError, ValueError):
        return None


def arguments_text(pairs: list[str], closed: bool) -> str:
    """The arguments object of ``pairs``; without the closing brace while the call may still grow."""
    return "{" + ", ".join(pairs) + ("}" if closed else "")


class NotALiteral(ValueError):
    """The text is not a literal these parsers accept."""


_JSON_NAMES = {"true": True, "false": False, "null": None}


def python_literal(text: str) -> Any:
    """The value of a Python literal: str, int, float, bool, None, and lists, tuples (as lists) and dicts of them.

    Negative numbers and implicitly concatenated strings are accepted, and so are the bare
    names ``true``, ``false`` and ``null`` that models sometimes write in place of Python's.
    Anything else (names, calls, sets, bytes, f-strings, complex numbers) raises :class:`NotALiteral`.
    """
    try:
        tree = ast.parse(text.strip(), mode="eval")
        return _literal(tree.body)
    except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError) as exc:
        raise NotALiteral(str(exc)) from exc


def _literal(node: ast.expr) -> Any:
    if isinstance(node, ast.Constant):
        if node.value is None or type(node.value) in (str, int, float, bool):
            return node.value
    elif isinstance(node, ast.List | ast.Tuple):
        return [_literal(item) for item in node.elts]
    elif isinstance(node, ast.Dict):
        result = {}
        for key, value in zip(node.keys, node.values, strict=True):
            if key is None:  # {**other}
                raise NotALiteral("dict unpacking")
            name = _literal(key)
            if isinstance(name, list | dict):
                raise NotALiteral("dict keys must be scalars")
            result[name] = _literal(value)
        return result
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        if isinstance(node.operand, ast.Constant) and type(node.operand.value) in (int, float):
            return -node.operand.value if isinstance(node.op, ast.USub) else node.operand.value
    elif isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    raise NotALiteral(f"not a literal: {type(node).__name__}")
