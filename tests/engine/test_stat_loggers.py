"""Stat loggers: the engine builds every registered one and feeds it each step and finished request."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from llmp import LLM, SamplingParams, hookimpl
from llmp.api import StatLoggerSpec
from llmp.testing import pip_install_target, registered, save_tiny_llama

REPO = Path(__file__).resolve().parents[2]
OPTIONS = dict(dtype="float32", block_size=4, max_model_len=256)
PARAMS = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)

pytestmark = pytest.mark.usefixtures("clean_plugin_env")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-llama-stats")
    save_tiny_llama(path, vocab_size=400, logit_scale=4.0)
    return path


@pytest.fixture(scope="module")
def stats_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = tmp_path_factory.mktemp("stats-site")
    pip_install_target(site, REPO / "tests" / "fixtures" / "llmp-example-stats")
    return site


def test_an_installed_stat_logger_counts_every_step_and_finished_request(model_dir, stats_site, monkeypatch):
    monkeypatch.syspath_prepend(str(stats_site))  # found through its entry point, as when pip-installed
    llm = LLM(str(model_dir), **OPTIONS)
    from llmp_example_stats import StepCounter

    counter = StepCounter.built[-1]
    assert counter.info.model == str(model_dir) and counter.steps == []
    outputs = llm.generate(["The quick", "Paged attention", "Café"], PARAMS, use_tqdm=False)
    assert len(counter.steps) == llm.engine.num_steps > 0
    assert counter.steps[-1].num_running == counter.steps[-1].num_waiting == 0
    by_id = {s.request_id: s for s in counter.finished}
    assert sorted(by_id) == sorted(o.request_id for o in outputs) and len(counter.finished) == 3
    for output in outputs:
        stats = by_id[output.request_id]
        assert (stats.finish_reason, stats.num_generation_tokens) == ("length", 5)
        assert stats.num_prompt_tokens == len(output.prompt_token_ids)
        assert 0 <= stats.queued_seconds <= stats.time_to_first_token_seconds <= stats.end_to_end_seconds
    assert StepCounter.built[-1] is counter  # built once per engine


class Flaky:
    """Fails on its second step; a second logger keeps counting."""

    def __init__(self, info):
        self.calls = 0

    def record_step(self, stats):
        self.calls += 1
        if self.calls == 2:
            raise RuntimeError("flaky logger")

    def record_finished(self, stats):
        pass


def broken_factory(info):
    raise RuntimeError("cannot start")


class Counting:
    built: list[Counting] = []

    def __init__(self, info):
        self.steps = 0
        self.finished = []
        Counting.built.append(self)

    def record_step(self, stats):
        self.steps += 1

    def record_finished(self, stats):
        self.finished.append(stats)


class Loggers:
    @hookimpl
    def llmp_register_stat_loggers(self):
        yield StatLoggerSpec(name="flaky", impl=f"{__name__}:Flaky")
        yield StatLoggerSpec(name="broken", impl=f"{__name__}:broken_factory")
        yield StatLoggerSpec(name="counting", impl=f"{__name__}:Counting")


def test_a_failing_stat_logger_is_reported_once_and_the_engine_goes_on(model_dir, caplog):
    with registered(Loggers(), "loggers"), caplog.at_level(logging.ERROR, logger="llmp.engine"):
        llm = LLM(str(model_dir), **OPTIONS)
        outputs = llm.generate(["The quick", "Paged attention"], PARAMS, use_tqdm=False)
    assert all(o.finished and len(o.outputs[0].token_ids) == 5 for o in outputs)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert sum("'broken'" in e and "failed to start" in e for e in errors) == 1
    assert sum("'flaky' failed" in e for e in errors) == 1
    assert [name for name, _ in llm.engine.stat_loggers.loggers] == ["counting"]
    assert Counting.built[-1].steps == llm.engine.num_steps


class CountingOnly:
    @hookimpl
    def llmp_register_stat_loggers(self):
        yield StatLoggerSpec(name="counting", impl=f"{__name__}:Counting")


def test_embedding_steps_and_requests_are_logged_too(model_dir):
    with registered(CountingOnly(), "counting"):
        llm = LLM(str(model_dir), task="embed", **OPTIONS)
        outputs = llm.embed(["The quick", "Paged attention"], use_tqdm=False)
    counter = Counting.built[-1]
    assert counter.steps == llm.engine.num_steps > 0
    assert sorted(s.request_id for s in counter.finished) == sorted(o.request_id for o in outputs)
    assert all(s.num_generation_tokens == 0 and s.finish_reason == "stop" for s in counter.finished)


def test_aborted_requests_are_reported_with_finish_reason_abort(model_dir):
    """Aborts count too (a Prometheus-style logger counts them): a running and a waiting request."""
    with registered(CountingOnly(), "counting"):
        llm = LLM(str(model_dir), max_num_seqs=1, **OPTIONS)
    engine, counter = llm.engine, Counting.built[-1]
    long = SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True)
    engine.add_request("running", "The quick", long)
    engine.add_request("waiting", "Paged attention", long)
    engine.step()
    engine.step()
    engine.abort_request(["running", "waiting"])
    by_id = {s.request_id: s for s in counter.finished}
    assert sorted(by_id) == ["running", "waiting"] and len(counter.finished) == 2
    assert by_id["running"].finish_reason == by_id["waiting"].finish_reason == "abort"
    assert by_id["running"].num_generation_tokens == 2 and by_id["waiting"].num_generation_tokens == 0
    assert by_id["waiting"].time_to_first_token_seconds is None
    engine.abort_request("running")  # already ended: reported once
    assert len(counter.finished) == 2


@pytest.mark.parametrize("value", ["abc", "0", "-1", "nan"])
def test_a_bad_stats_interval_is_one_warning_and_the_default(model_dir, monkeypatch, caplog, value):
    """Not a positive number of seconds: one line naming the variable, and the default (as vLLM)."""
    from llmp.engine.log_stats import DEFAULT_INTERVAL_S

    monkeypatch.setenv("LLMP_LOG_STATS_INTERVAL", value)
    with caplog.at_level(logging.WARNING, logger="llmp.engine"):
        llm = LLM(str(model_dir), disable_log_stats=False, **OPTIONS)
    assert dict(llm.engine.stat_loggers.loggers)["logging"].interval == DEFAULT_INTERVAL_S
    [warning] = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert warning.getMessage().startswith(f"LLMP_LOG_STATS_INTERVAL={value} is not a positive number of seconds")
    assert warning.exc_info is None


def test_an_abort_between_steps_tells_the_loggers_the_fresh_counts(model_dir):
    """No step may follow an abort (an idle engine): the loggers must not keep the aborted request running."""
    with registered(CountingOnly(), "counting"):
        llm = LLM(str(model_dir), disable_log_stats=False, **OPTIONS)
    engine, counter = llm.engine, Counting.built[-1]
    engine.add_request("gone", "The quick", SamplingParams(max_tokens=50, ignore_eos=True))
    engine.step()
    steps = counter.steps
    engine.abort_request("gone")
    assert counter.steps == steps + 1 == engine.num_steps + 1
    line = dict(engine.stat_loggers.loggers)["logging"].line()
    assert "Running: 0 reqs, Waiting: 0 reqs" in line
    engine.abort_request("gone")  # nothing left to abort: nothing new to tell
    assert counter.steps == steps + 1
