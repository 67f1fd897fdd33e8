"""docs/ stays true: every fenced block of README.md and docs/*.md runs as shown (tests/docs_snippets.py
has the rules), every hook is documented with its signature, and the guide's examples are the real ones."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import os
import re
import sys
from pathlib import Path

import pytest

from llmp import hookspecs

REPO = Path(__file__).resolve().parents[1]


def _load_harness():
    # pytest imports test files by path (--import-mode=importlib), so tests/ is not on sys.path
    if "docs_snippets" in sys.modules:  # tests/test_docs_engines.py loaded it in this process
        return sys.modules["docs_snippets"]
    spec = importlib.util.spec_from_file_location("docs_snippets", Path(__file__).with_name("docs_snippets.py"))
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


snippets = _load_harness()
GUIDE = REPO / "docs" / "plugins.md"
BLOCKS = snippets.all_blocks()
MINE = [block for block in BLOCKS if not snippets.in_engines_module(block)]  # the rest: tests/test_docs_engines.py
scratch = snippets.scratch
python_results = snippets.python_results


def test_every_block_is_run_or_annotated_with_a_reason():
    problems = [f"{b.id}: {p}" for b in BLOCKS for p in snippets.annotation_problems(b)]
    assert not problems, "\n".join(problems)
    assert len(BLOCKS) > 60


def test_checked_by_names_a_test_of_this_file():
    for block in BLOCKS:
        if annotation := block.annotation("checked-by"):
            assert callable(globals().get(annotation.argument)), f"{block.id}: no test {annotation.argument}"


@pytest.mark.parametrize("block", MINE, ids=[b.id for b in MINE])
def test_block(block: snippets.Block, scratch, python_results):
    snippets.run_block(block, scratch, python_results)


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


def test_the_parser_guides_example_passes_verify(tmp_path, monkeypatch):
    from llmp import hookimpl
    from llmp.api import ToolParserSpec
    from llmp.conformance import verify
    from llmp.testing import registered

    guide = GUIDE.read_text().split("## Writing a tool-call or reasoning parser")[1]
    (tmp_path / "guide_calltag.py").write_text(guide.split("```python\n")[1].split("```")[0])
    monkeypatch.syspath_prepend(str(tmp_path))

    class Plugin:
        @hookimpl
        def llmp_register_tool_parsers(self):
            yield ToolParserSpec(name="guide-calltag", impl="guide_calltag:CallTagParser")

    with registered(Plugin(), "guide-calltag"):
        report = verify("guide-calltag")
    assert report.passed and not report.error, [(r.check, r.detail) for r in report.failed] or report.error


def test_every_testing_helper_is_in_the_guides_table():
    import llmp.testing

    section = guide_section("Testing plugins")
    missing = [name for name in llmp.testing.__all__ if f"`{name}" not in section and f"{name}`" not in section]
    assert not missing, f"llmp.testing exports these, docs/plugins.md's 'Testing plugins' does not say them: {missing}"


def guide_section(title: str) -> str:
    return GUIDE.read_text().split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_the_public_modules_table_is_api_public_modules():
    from llmp.api import PUBLIC_MODULES

    rows = re.findall(r"^\| `([\w.]+)` \|", guide_section("Public modules"), flags=re.MULTILINE)
    assert rows == list(PUBLIC_MODULES)
    # and the API module's docstring lists the same modules
    import llmp.api

    assert re.findall(r"^``([\w.]+)``\s", llmp.api.__doc__, flags=re.MULTILINE) == list(PUBLIC_MODULES)


def test_the_front_end_example_is_the_echo_fixture():
    code = guide_section("Writing a front-end").split("```python\n")[1].split("```")[0]
    fixture = (REPO / "tests" / "fixtures" / "llmp-frontend-echo" / "llmp_frontend_echo.py").read_text()
    assert code.split("class EchoFrontend")[1] == fixture.split("class EchoFrontend")[1].rstrip("\n") + "\n"
    # the guide imports what the fixture imports (bar the fixture's registration hook's)
    imported = {source: _imported_names(source) for source in (code, fixture)}
    assert imported[code] and imported[code] <= imported[fixture]


def test_the_command_example_runs_as_the_guide_shows(tmp_path, monkeypatch):
    import sys
    import types

    import typer
    from typer.testing import CliRunner

    section = guide_section("Adding commands")
    code = section.split("```python\n# llmp_command_greet/cli.py\n")[1].split("```")[0]
    module = types.ModuleType("llmp_command_greet_cli")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    exec(compile(code, "plugins.md", "exec"), module.__dict__)
    app = typer.Typer(add_completion=False)
    app.command()(module.greet)
    for var in [v for v in os.environ if v.startswith("LLMP_")]:
        monkeypatch.delenv(var)
    monkeypatch.chdir(tmp_path)
    transcript = section.split("```console\n")[1].split("```")[0]
    runs = re.findall(r"^\$ (.+)\n((?:[^$].*\n)*)", transcript, flags=re.MULTILINE)
    assert len(runs) == 4
    for command, expected in runs:
        if command.startswith("printf"):
            (tmp_path / "greet.yaml").write_text("name: yaml\ntimes: 1\n")
            continue
        words = command.split()
        env = dict(word.split("=", 1) for word in words[: words.index("llmp")])
        args = words[words.index("greet") + 1 :]
        result = CliRunner().invoke(app, args, env=env)
        assert result.exit_code == 0, result.output
        assert result.output == expected, command


def _imported_names(source: str) -> set[tuple[str | None, str]]:
    tree = ast.parse(source)
    return {
        (node.module, alias.name) for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for alias in node.names
    }
