"""``llmp collect-env``: plain text that pastes cleanly into a bug report, ``--json`` for machines, and
what the default engine would choose (kernel set, ISA path, dtype)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from llmp import registry
from llmp.testing import run_llmp

BOX_DRAWING = re.compile("[\u2500-\u257f]")  # ─ │ ┏ ┃ ╭ ...


@pytest.fixture(scope="module")
def report() -> dict:
    return json.loads(run_llmp("collect-env", "--json").stdout)


@pytest.fixture(scope="module")
def text() -> str:
    return run_llmp("collect-env", env={"COLUMNS": "80"}).stdout


def test_the_json_report_has_what_a_bug_report_needs(report):
    assert report["llmp"] == "0.1.0"
    assert report["torch"]["version"] == torch.__version__
    assert report["torch"]["build"] == (f"cuda {torch.version.cuda}" if torch.version.cuda else "cpu")
    assert report["torch"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    cpu = report["cpu"]
    assert cpu["model"] and cpu["logical_cores"] >= cpu["usable_cores"] >= 1
    flags = set(Path("/proc/cpuinfo").read_text().split())
    for flag in ("avx2", "avx512f", "avx512_bf16", "amx_bf16"):
        assert (flag in cpu["flags"]) == (flag in flags), flag
    assert all(f in flags for f in cpu["flags"])
    assert report["memory_gib"] > 0
    assert report["gpu"]["available"] == torch.cuda.is_available()
    engine = report["engine"]
    assert engine["model"] == "HuggingFaceTB/SmolLM2-135M-Instruct" and engine["device"] == "cpu"
    chosen = registry.select_kernels(None, "cpu")  # the compiled cpu-native set when it built, else cpu
    assert engine["kernels"] == chosen.name and engine["kernels_plugin"] == chosen.plugin
    assert engine["dtype"] == "float32"  # the default model's, as LLM() would resolve it (a small GGUF file)
    assert engine["isa_path"].startswith(torch.backends.cpu.get_cpu_capability())
    plugins = {p["name"]: p for p in report["plugins"]}
    assert plugins["kernels-cpu"]["status"] == "ok" and plugins["llmp-commands"]["distribution"] == "llmp"


def test_the_text_report_is_headings_and_key_value_items(text, report):
    assert not BOX_DRAWING.search(text), text
    headings = [line for line in text.splitlines() if line.startswith("#")]
    assert headings[:2] == ["### llmp", "### default engine"] and "### plugins" in headings
    assert all(h.startswith("### ") for h in headings), headings  # no page-sized title when pasted
    for line in text.splitlines():
        assert not line or line.startswith("### ") or re.match(r"^- [^:]+: \S", line), line
    engine = report["engine"]
    for key in ("kernels", "dtype", "isa_path"):
        assert f"\n- {key}: {engine[key]}\n" in text
    assert f"\n- version: {torch.__version__}\n" in text
    assert "\n- kernels-cpu: ok (llmp-kernels-cpu 0.1.0)\n" in text
    # lines are never cut or wrapped to the terminal: a long value stays on its line
    assert f"\n- executable: {report['executable']}\n" in text


def test_pasted_into_a_markdown_issue_each_value_is_its_own_list_item(text, report):
    """GitHub renders the report as small headings over lists, not one run-together paragraph."""
    from markdown_it import MarkdownIt

    html = MarkdownIt("commonmark").render(text)
    assert "<h1>" not in html and "<h2>" not in html and "<p>" not in html, html
    assert "<em>" not in html and "<strong>" not in html, html  # no * or _ read as emphasis
    items = re.findall(r"<li>(.*?)</li>", html)
    assert len(items) == sum(1 for line in text.splitlines() if line.startswith("- "))
    assert f"isa_path: {report['engine']['isa_path']}" in items


def test_a_secret_in_the_environment_is_not_shown():
    """A bug report is public: LLMP_API_KEY is reported as set, never with its value."""
    env = {"LLMP_API_KEY": "sk-very-secret", "LLMP_LOG_LEVEL": "debug"}
    text = run_llmp("collect-env", env=env).stdout
    assert "sk-very-secret" not in text and "- LLMP_API_KEY: (set, not shown)" in text
    assert "- LLMP_LOG_LEVEL: debug" in text
    assert "sk-very-secret" not in run_llmp("collect-env", "--json", env=env).stdout
