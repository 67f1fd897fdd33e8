"""The blocks of docs/*.md that start engines or talk to a server, run as tests/docs_snippets.py
says; tests/test_docs.py runs all other blocks. Two modules, so that ``pytest -n 2 --dist loadfile``
runs them on different workers."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest


def _load_harness():
    # pytest imports test files by path (--import-mode=importlib), so tests/ is not on sys.path
    if "docs_snippets" in sys.modules:  # tests/test_docs.py loaded it in this process
        return sys.modules["docs_snippets"]
    spec = importlib.util.spec_from_file_location("docs_snippets", Path(__file__).with_name("docs_snippets.py"))
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


snippets = _load_harness()
SLOW = [block for block in snippets.all_blocks() if snippets.in_engines_module(block)]
scratch = snippets.scratch
python_results = snippets.python_results


def test_the_docs_start_engines():
    assert len(SLOW) >= 5


@pytest.mark.parametrize("block", SLOW, ids=[b.id for b in SLOW])
def test_block(block: snippets.Block, scratch, python_results):
    snippets.run_block(block, scratch, python_results)
