"""``llmp run-batch``: vLLM's offline batch command, with files and with stdin/stdout."""

from __future__ import annotations

import json
import subprocess
import sys

from llmp.testing import child_environment, run_llmp


def _lines(model: str) -> list[dict]:
    chat = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0}
    completion = {"model": model, "prompt": "once upon", "max_tokens": 3, "temperature": 0}
    return [
        {"custom_id": "chat", "method": "POST", "url": "/v1/chat/completions", "body": chat},
        {"custom_id": "completion", "method": "POST", "url": "/v1/completions", "body": completion},
        {"custom_id": "streamed", "method": "POST", "url": "/v1/completions", "body": {**completion, "stream": True}},
        {"custom_id": "embed", "method": "POST", "url": "/v1/embeddings", "body": {"model": model, "input": "x"}},
    ]


def _check(outputs: list[dict]) -> None:
    assert [o["custom_id"] for o in outputs] == ["chat", "completion", "streamed", "embed"]  # input order
    assert [o["response"]["status_code"] for o in outputs] == [200, 200, 400, 400]
    assert all(o["id"].startswith("batch_req_") and o["error"] is None for o in outputs)
    assert outputs[0]["response"]["body"]["object"] == "chat.completion"
    assert outputs[1]["response"]["body"]["usage"]["completion_tokens"] == 3
    assert outputs[2]["response"]["body"]["error"]["param"] == "stream"
    assert "does not serve /v1/embeddings" in outputs[3]["response"]["body"]["error"]["message"]


def test_run_batch_files(tiny, tmp_path):
    source, target = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text("".join(json.dumps(line) + "\n" for line in _lines(tiny.name)))
    command = ("run-batch", "-i", str(source), "-o", str(target), str(tiny.path))
    result = run_llmp(*command, env={"LLMP_PROGRESS": "1"}, timeout=300)
    _check([json.loads(text) for text in target.read_text().splitlines()])
    assert "4 requests, 2 answered, 2 failed" in result.stderr
    # the command's own bar, at the default log level (warning: no start-up lines)
    assert "Running batch" in result.stderr and "4/4" in result.stderr, result.stderr
    assert "INFO" not in result.stderr, result.stderr


def test_run_batch_stdin_stdout_with_model_flag(tiny):
    env = child_environment()
    text = "".join(json.dumps(line) + "\n" for line in _lines(tiny.name))
    result = subprocess.run(
        [sys.executable, "-m", "llmp", "run-batch", "-i", "-", "-o", "-", "--model", str(tiny.path)],
        input=text.encode(),
        capture_output=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr.decode()
    _check([json.loads(line) for line in result.stdout.decode().splitlines()])  # nothing else on stdout


def test_run_batch_refuses_a_broken_file_before_starting(tmp_path):
    source = tmp_path / "in.jsonl"
    line = {"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {}}
    source.write_text(json.dumps(line) + "\n{oops\n" + json.dumps(line) + "\n")
    result = run_llmp("run-batch", "-i", str(source), "-o", str(tmp_path / "out.jsonl"), "no-model", check=False)
    assert result.returncode == 1
    assert "line 2: This line is not parseable as valid JSON. (invalid_json_line)" in result.stderr
    assert "line 3: The custom_id 'a' is a duplicate" in result.stderr
    assert not (tmp_path / "out.jsonl").exists()
    both = run_llmp("run-batch", "-i", str(source), "-o", "-", "m1", "--model", "m2", check=False)
    assert both.returncode == 2 and "the model is given twice" in both.stderr


def test_a_failing_start_keeps_an_earlier_output_file(tmp_path):
    source, target = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text(json.dumps(_lines("m")[1]) + "\n")
    target.write_text("earlier results\n")
    result = run_llmp("run-batch", "-i", str(source), "-o", str(target), str(tmp_path / "no-model"), check=False)
    assert result.returncode == 2 and "cannot start the engine" in result.stderr
    assert target.read_text() == "earlier results\n"  # written to a temporary file, renamed only at the end
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "out.jsonl"]


def test_an_unwritable_output_is_one_line_and_status_3(tiny, tmp_path):
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps(_lines(tiny.name)[1]) + "\n")
    missing = tmp_path / "nowhere" / "out.jsonl"
    result = run_llmp("run-batch", "-i", str(source), "-o", str(missing), str(tiny.path), check=False)
    assert (result.returncode, result.stderr.strip()) == (
        3,
        f"llmp run-batch: cannot write {missing}: No such file or directory",
    )
    full = run_llmp("run-batch", "-i", str(source), "-o", "/dev/full", str(tiny.path), check=False, timeout=300)
    assert full.returncode == 3, full.stderr
    assert "llmp run-batch: cannot write /dev/full: No space left on device" in full.stderr
    assert "Traceback" not in full.stderr
