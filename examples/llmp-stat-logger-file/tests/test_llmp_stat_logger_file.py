"""Tests of the logger beyond the conformance kit's (tests/test_conformance.py): the lines it writes."""

import json

from llmp.api import EngineInfo, FinishedRequestStats, SchedulerStats

from llmp_stat_logger_file.logger import PATH_VARIABLE, JSONLinesStatLogger

INFO = EngineInfo("m", "uniproc", "torch", "default", "default", "cpu")


def test_one_json_line_per_record(tmp_path, monkeypatch):
    path = tmp_path / "stats.jsonl"
    path.write_text('{"event": "from an earlier run"}\n')
    monkeypatch.setenv(PATH_VARIABLE, str(path))
    logger = JSONLinesStatLogger(INFO)
    logger.record_step(SchedulerStats(1, 0, 0.25, 0, 0, 0, num_prompt_tokens=5, num_generation_tokens=1))
    logger.record_finished(FinishedRequestStats("r", "length", 5, 2, 0, 0.0, 0.01, 0.02))
    earlier, step, finished = [json.loads(line) for line in path.read_text().splitlines()]  # appended
    assert earlier == {"event": "from an earlier run"}
    assert {k: step[k] for k in ("event", "model", "num_running", "kv_cache_usage", "num_prompt_tokens")} == {
        "event": "step",
        "model": "m",
        "num_running": 1,
        "kv_cache_usage": 0.25,
        "num_prompt_tokens": 5,
    }
    assert (finished["event"], finished["request_id"], finished["finish_reason"]) == ("finished", "r", "length")
    assert step["time"] <= finished["time"] and step["pid"] == finished["pid"]


def test_nothing_is_written_without_the_variable(tmp_path, monkeypatch):
    monkeypatch.delenv(PATH_VARIABLE, raising=False)
    monkeypatch.chdir(tmp_path)
    logger = JSONLinesStatLogger(INFO)
    logger.record_step(SchedulerStats(0, 0, 0.0, 0, 0, 0))
    assert list(tmp_path.iterdir()) == []
