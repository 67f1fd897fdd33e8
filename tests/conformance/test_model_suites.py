"""The model suite: a model with a wrong rotary fails greedy parity saying where and how, while the
engine-invariance checks (which compare llmp with itself) still pass; an architecture it cannot
build, and a pattern record it has no architecture for, skip saying what to pass.

The in-repo model plugins pass it in their own tests (``plugins/models/*/tests/test_conformance.py``).
Broken models are registered in-process, their classes in a module made here.
"""

from __future__ import annotations

import re
import sys
import tempfile
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmp import hookimpl, registry
from llmp.api import ModelSpec
from llmp.conformance import CheckResult, models
from llmp.conformance.runner import Context, _run_check
from llmp.testing import registered

BROKEN_MODULE = "llmp_conformance_broken_models"


def broken_models_module() -> types.ModuleType:
    """Llama with Llama 3's rope theta on a checkpoint made with 10000: every position past 0 is
    rotated by the wrong angle."""
    from llmp_models_llama.model import LlamaForCausalLM

    class WrongRopeForCausalLM(LlamaForCausalLM):
        def make_attention(self, config: Any, kernels: Any, index: int, window: int | None) -> Any:
            attention = super().make_attention(config, kernels, index, window)
            attention.rotary_emb.base = 500000.0
            return attention

    module = types.ModuleType(BROKEN_MODULE)
    module.WrongRopeForCausalLM = WrongRopeForCausalLM
    return module


def plugin(*specs: ModelSpec) -> Any:
    return type("Plugin", (), {"llmp_register_models": hookimpl(lambda self: list(specs))})()


@pytest.fixture
def broken(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setitem(sys.modules, BROKEN_MODULE, broken_models_module())
    spec = ModelSpec(name="WrongRopeForCausalLM", impl=f"{BROKEN_MODULE}:WrongRopeForCausalLM")
    with registered(plugin(spec), "wrong-rope") as name:
        yield name


def run_checks(component: str, names: set[str], **options: Any) -> dict[str, CheckResult]:
    """The suite's checks named ``names`` for one registered model, run as ``verify`` runs them."""
    with tempfile.TemporaryDirectory() as workdir:
        context = Context(Path(workdir), options=options)
        spec = registry.get_component("model", component)
        return {c.name: _run_check("model", component, c) for c in models.suite(spec, context) if c.name in names}


def test_a_wrong_rotary_fails_parity_at_the_first_diverging_token_and_nothing_else(broken):
    # a plugin's own architecture, laid out as transformers' Llama: config.json names it
    configs = {"WrongRopeForCausalLM": {"reference": "LlamaForCausalLM"}}
    parity, blocks = "greedy parity with transformers", "paged KV: blocks of 16 give the tokens of blocks of 4"
    results = run_checks("WrongRopeForCausalLM", {parity, blocks}, model_configs=configs)
    assert results[blocks].status == "passed", results[blocks].detail  # llmp agrees with itself
    failed = results[parity]
    assert failed.status == "failed"
    assert re.match(
        r"a batch of mixed lengths: prompt \d+ \(\d+ tokens\) diverges from transformers at generated position "
        r"\d+: got token \d+, expected \d+\n  got      \[[\d, ]+\]\n  expected \[[\d, ]+\]$",
        failed.detail,
    ), failed.detail


def test_an_architecture_transformers_lacks_skips_naming_the_option_to_give(broken):
    results = run_checks("WrongRopeForCausalLM", {"greedy parity with transformers"})
    [skipped] = results.values()
    assert skipped.status == "skipped"
    assert "has no class WrongRopeForCausalLM" in skipped.detail
    assert "model_configs={'WrongRopeForCausalLM': {'reference': 'LlamaForCausalLM'}}" in skipped.detail


def test_a_pattern_record_the_kit_has_no_architecture_for_skips_saying_what_to_name(broken):
    spec = ModelSpec(name="*ForAudioFrameClassification", impl=f"{BROKEN_MODULE}:WrongRopeForCausalLM")
    with registered(plugin(spec), "audio-fallback"):
        [skipped] = run_checks("*ForAudioFrameClassification", {"parity with transformers"}).values()
    assert skipped.status == "skipped"
    assert "is a pattern, not an architecture" in skipped.detail
    assert "model_configs={'MyForAudioFrameClassification': {}}" in skipped.detail


def test_tensor_parallel_support_is_what_the_model_class_declares():
    assert models._tensor_parallel_unsupported(registry.get_component("model", "LlamaForCausalLM")) is None
    reason = models._tensor_parallel_unsupported(registry.get_component("model", "*"))
    assert reason and "TransformersForCausalLM does not declare tensor-parallel support" in reason
