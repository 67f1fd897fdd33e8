"""A batch survives its server: killed (SIGKILL) mid-job and restarted on the same ``--batch-dir``,
the job resumes and every line is answered exactly once."""

from __future__ import annotations

import io
import json
import time

import openai

from llmp.testing import serving

LINES = 50


def test_killed_server_resumes_the_job_answering_each_line_once(tiny, tmp_path):
    batch_dir = tmp_path / "batches"
    args = ("--batch-dir", str(batch_dir), "--max-num-seqs", "8")  # four lines at a time
    # 32 tokens a line: hundreds of steps left when the kill comes, however late the test sees 5 lines done
    body = {"model": tiny.name, "prompt": "count", "max_tokens": 32, "temperature": 0, "ignore_eos": True}
    lines = [{"custom_id": f"line-{i}", "method": "POST", "url": "/v1/completions", "body": body} for i in range(LINES)]
    content = "\n".join(json.dumps(line) for line in lines).encode()

    with serving(tiny.path, *args) as first:
        sdk = openai.OpenAI(base_url=first.api_url, api_key="unused", max_retries=0)
        file_id = sdk.files.create(file=("in.jsonl", io.BytesIO(content)), purpose="batch").id
        batch = sdk.batches.create(input_file_id=file_id, endpoint="/v1/completions", completion_window="24h")
        deadline = time.monotonic() + 120
        while sdk.batches.retrieve(batch.id).request_counts.completed < 5:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        first.process.kill()
        first.process.wait(30)
    answered = (batch_dir / "batches" / f"{batch.id}.output").read_bytes().splitlines()
    assert 5 <= len(answered) < LINES, len(answered)
    with open(batch_dir / "batches" / f"{batch.id}.output", "ab") as torn:  # a line the kill cut short
        torn.write(b'{"id": "batch_req_torn", "custom_id": "line-4')

    with serving(tiny.path, *args) as second:  # resumes at start-up, before any request
        sdk = openai.OpenAI(base_url=second.api_url, api_key="unused", max_retries=0)
        deadline = time.monotonic() + 240
        while (done := sdk.batches.retrieve(batch.id)).status != "completed":
            assert done.status in ("in_progress", "finalizing") and time.monotonic() < deadline, done
            time.sleep(0.1)
        assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (50, 50, 0)
        assert done.error_file_id is None
        outputs = [json.loads(text) for text in sdk.files.content(done.output_file_id).text.splitlines()]
    ids = [out["custom_id"] for out in outputs]
    assert sorted(ids) == sorted(line["custom_id"] for line in lines)  # every line, each exactly once
    assert ids[: len(answered)] == [json.loads(text)["custom_id"] for text in answered]  # kept, not rerun
    assert all(out["response"]["status_code"] == 200 for out in outputs)
    texts = {out["response"]["body"]["choices"][0]["text"] for out in outputs}
    assert len(texts) == 1  # one greedy answer, before the kill and after
