"""docs/ stays true: every hook is documented with its signature; the guide's example is the real one."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from llmp import hookspecs

REPO = Path(__file__).resolve().parents[1]
GUIDE = REPO / "docs" / "plugins.md"


def hook_signatures() -> dict[str, str]:
    """`name(param: annotation, ...) -> return` as written in hookspecs.py."""
    signatures = {}
    for name, function in vars(hookspecs).items():
        if name.startswith("llmp_") and hasattr(function, "llmp_spec"):
            sig = inspect.signature(function)
            params = ", ".join(f"{p.name}: {p.annotation}" for p in sig.parameters.values())
            signatures[name] = f"{name}({params}) -> {sig.return_annotation}"
    return signatures


def test_there_are_hooks_to_document():
    assert len(hook_signatures()) >= 12


def test_every_hook_has_a_heading_with_its_exact_signature():
    headings = set(re.findall(r"^### (.+?)\s*$", GUIDE.read_text(), flags=re.MULTILINE))
    missing = [sig for sig in hook_signatures().values() if sig not in headings]
    assert not missing, f"docs/plugins.md lacks headings for: {missing}"


def test_every_hook_docstring_has_an_example():
    for name in hook_signatures():
        doc = inspect.getdoc(getattr(hookspecs, name)) or ""
        assert "Example::" in doc and "@hookimpl" in doc, name


def test_the_guides_example_is_the_example_plugin_verbatim():
    text = GUIDE.read_text()
    for relative in ("examples/llmp-hello/pyproject.toml", "examples/llmp-hello/llmp_hello.py"):
        match = re.search(rf"`{re.escape(relative)}`\s*\n+```\w*\n(.*?)```", text, flags=re.DOTALL)
        assert match, f"docs/plugins.md does not show {relative}"
        assert match.group(1).rstrip("\n") == (REPO / relative).read_text().rstrip("\n")


def test_the_example_is_under_30_lines():
    lines = [
        line
        for path in (REPO / "examples" / "llmp-hello").iterdir()
        if path.is_file()
        for line in path.read_text().splitlines()
        if line.strip()
    ]
    assert len(lines) < 30


def test_the_parser_guides_example_streams_as_it_parses():
    guide = GUIDE.read_text().split("## Writing a tool-call or reasoning parser")[1]
    code = guide.split("```python\n")[1].split("```")[0]
    namespace: dict = {}
    exec(compile(code, "plugins.md", "exec"), namespace)
    from llmp.testing import assert_streams_agree

    parser = namespace["CallTagParser"](None)
    message = assert_streams_agree('Hi <call>{"name": "f", "arguments": {"a": [1, "}"]}}</call>', tool_parser=parser)
    assert message.content == "Hi " and [(c.name, c.arguments) for c in message.tool_calls] == [
        ("f", '{"a": [1, "}"]}')
    ]
