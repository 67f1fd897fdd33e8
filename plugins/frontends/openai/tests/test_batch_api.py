"""OpenAI's Files and Batch APIs through the openai SDK, on one live server with two API-server
processes (``--api-server-count 2``: every request, on a new connection, may reach either; one of
them runs the jobs), ``--batch-dir`` in a temporary directory, small limits so the limit tests stay
small. The single-process server is the restart test's (``test_batch_restart.py``)."""

from __future__ import annotations

import io
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from llmp_frontend_openai.batch_jobs import RUNNER_KEY
from llmp_frontend_openai.batch_store import BatchStore
from llmp_frontend_openai.batches import batch_dir
from openai_frontend_support import assert_error

from llmp.options import FrontendOptions
from llmp.testing import LiveServer, serving

FILE_LIMIT = 64 * 1024
LINE_LIMIT = 60
# uvicorn's access log, each line naming its API server
ACCESS = re.compile(r'\[api-server (\d+)\] [^"\n]*"(\w+) (\S+) HTTP/[\d.]+" (\d+)')


@pytest.fixture(scope="module")
def batch_server(tiny, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    batch_dir = tmp_path_factory.mktemp("batches")
    args = ("--batch-dir", str(batch_dir), "--max-batch-file-bytes", str(FILE_LIMIT))
    args += ("--max-batch-lines", str(LINE_LIMIT), "--max-num-seqs", "8", "--api-server-count", "2")
    with serving(tiny.path, *args) as live:
        deadline = time.monotonic() + 60
        while "llmp: ready" not in live.log():  # both API servers serve from then on
            assert time.monotonic() < deadline, live.log()
            time.sleep(0.1)
        live.batch_dir = batch_dir
        yield live
        assert live.process.poll() is None, f"the server died during the tests:\n{live.log()}"


@pytest.fixture(scope="module")
def sdk(batch_server: LiveServer) -> Iterator[openai.OpenAI]:
    http_client = httpx.Client(limits=httpx.Limits(max_keepalive_connections=0), timeout=60)  # a connection each
    with openai.OpenAI(base_url=batch_server.api_url, api_key="unused", max_retries=0, http_client=http_client) as c:
        yield c


@pytest.fixture(scope="module")
def http(batch_server: LiveServer) -> Iterator[httpx.Client]:
    limits = httpx.Limits(max_keepalive_connections=0)
    with httpx.Client(base_url=batch_server.url, timeout=60, limits=limits) as client:
        yield client


def answered_by(server: LiveServer, method: str, path: str) -> dict[str, str]:
    """The API server (its index) that answered each ``METHOD path?probe=N``, by N, from the access log."""
    found = {}
    for index, m, target, _ in ACCESS.findall(server.log()):
        base, _, query = target.partition("?")
        if (m, base) == (method, path) and query.startswith("probe="):
            found[query.removeprefix("probe=")] = index
    return found


def line(custom_id: str, body: dict, url: str = "/v1/chat/completions") -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def chat_body(model: str, text: str, max_tokens: int = 6, **extra) -> dict:
    messages = [{"role": "user", "content": text}]
    return {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0, **extra}


def upload(sdk: openai.OpenAI, lines: list, name: str = "in.jsonl") -> str:
    text = "\n".join(item if isinstance(item, str) else json.dumps(item) for item in lines) + "\n"
    return sdk.files.create(file=(name, io.BytesIO(text.encode())), purpose="batch").id


def wait_for(sdk: openai.OpenAI, batch_id: str, statuses: tuple[str, ...], timeout: float = 60) -> openai.types.Batch:
    deadline = time.monotonic() + timeout
    while True:
        batch = sdk.batches.retrieve(batch_id)
        if batch.status in statuses:
            return batch
        assert time.monotonic() < deadline, f"batch still {batch.status}: {batch}"
        time.sleep(0.05)


def jsonl(sdk: openai.OpenAI, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    return [json.loads(text) for text in sdk.files.content(file_id).text.splitlines()]


def test_batch_end_to_end(sdk, tiny):
    lines = [line(f"chat-{i}", chat_body(tiny.name, f"word {i}")) for i in range(4)]
    lines.append(line("streamed", chat_body(tiny.name, "x", stream=True)))
    lines.append(line("too-hot", chat_body(tiny.name, "x", temperature=-1)))
    lines.append(line("unknown-model", chat_body("no-such-model", "x")))
    file_id = upload(sdk, lines)
    assert sdk.files.retrieve(file_id).purpose == "batch"
    created = sdk.batches.create(
        input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h", metadata={"job": "e2e"}
    )
    assert created.status == "validating" and created.metadata == {"job": "e2e"}
    assert created.expires_at == created.created_at + 24 * 3600
    batch = wait_for(sdk, created.id, ("completed", "failed"))
    assert batch.status == "completed", batch
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (7, 4, 3)
    assert batch.in_progress_at and batch.finalizing_at and batch.completed_at and batch.errors is None
    assert batch.usage.output_tokens == 4 * 6 and batch.usage.input_tokens > 0

    outputs = jsonl(sdk, batch.output_file_id)
    assert sorted(o["custom_id"] for o in outputs) == [f"chat-{i}" for i in range(4)]
    for out in outputs:
        assert out["id"].startswith("batch_req_") and out["error"] is None
        assert out["response"]["status_code"] == 200 and out["response"]["request_id"]
        assert out["response"]["body"]["object"] == "chat.completion"
    # the same handler as the interactive route: the same greedy answer
    interactive = sdk.chat.completions.create(**chat_body(tiny.name, "word 2"))
    batched = next(o for o in outputs if o["custom_id"] == "chat-2")["response"]["body"]
    assert batched["choices"][0]["message"]["content"] == interactive.choices[0].message.content
    assert batched["usage"] == interactive.usage.model_dump(exclude_none=True) | batched["usage"]

    errors = {e["custom_id"]: e for e in jsonl(sdk, batch.error_file_id)}
    assert set(errors) == {"streamed", "too-hot", "unknown-model"}
    assert errors["streamed"]["response"]["status_code"] == 400
    assert errors["streamed"]["response"]["body"]["error"]["param"] == "stream"
    assert errors["too-hot"]["response"]["body"]["error"]["param"] == "temperature"
    assert errors["unknown-model"]["response"]["status_code"] == 404
    output_file = sdk.files.retrieve(batch.output_file_id)
    assert output_file.purpose == "batch_output" and output_file.bytes > 0

    listed = sdk.batches.list(limit=100)
    assert created.id in [b.id for b in listed.data]
    assert {file_id, batch.output_file_id} <= {f.id for f in sdk.files.list()}
    newest = sdk.files.list(purpose="batch_output", order="desc").data[:2]
    assert {f.id for f in newest} == {batch.output_file_id, batch.error_file_id}
    assert all(f.purpose == "batch_output" for f in sdk.files.list(purpose="batch_output"))


def test_batches_are_listed_newest_first_within_a_second_too(sdk, tiny):
    file_id = upload(sdk, [line("one", chat_body(tiny.name, "x", max_tokens=1))])
    created = [
        sdk.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
        for _ in range(4)
    ]
    listed = [b.id for b in sdk.batches.list(limit=100).data]
    assert [i for i in listed if i in {b.id for b in created}] == [b.id for b in reversed(created)]
    for batch in created:
        wait_for(sdk, batch.id, ("completed",))


def test_file_validation_fails_the_batch(sdk, tiny):
    body = chat_body(tiny.name, "x")
    lines = [
        line("a", body),
        "{not json",
        line("a", body),  # a duplicate custom_id
        line("b", {"model": tiny.name, "prompt": "x"}, url="/v1/completions"),  # not the batch's endpoint
        {"custom_id": "c", "method": "POST", "url": "/v1/chat/completions"},  # no body
    ]
    file_id = upload(sdk, lines)
    batch = sdk.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
    batch = wait_for(sdk, batch.id, ("failed", "completed"))
    assert batch.status == "failed" and batch.failed_at and batch.output_file_id is None
    found = [(e.line, e.code, e.param) for e in batch.errors.data]
    assert found == [
        (2, "invalid_json_line", None),
        (3, "duplicate_custom_id", "custom_id"),
        (4, "url_mismatch", "url"),
        (5, "missing_required_parameter", "body"),
    ]


def test_upload_and_create_errors(sdk, http, tiny):
    with pytest.raises(openai.BadRequestError) as info:
        sdk.files.create(file=("x.jsonl", io.BytesIO(b"{}\n")), purpose="assistants")
    assert info.value.body["param"] == "purpose"
    too_big = b"x" * (FILE_LIMIT + 1)
    with pytest.raises(openai.APIStatusError) as info:
        sdk.files.create(file=("big.jsonl", io.BytesIO(too_big)), purpose="batch")
    assert info.value.status_code == 413 and "--max-batch-file-bytes" in info.value.message
    # past the gate's reading limit (the file limit + room for the multipart framing): the same 413
    huge_file = {"file": ("huge.jsonl", b"x" * (FILE_LIMIT + 100_000))}
    huge = http.post("/v1/files", files=huge_file, data={"purpose": "batch"})
    assert huge.status_code == 413 and huge.content.startswith(b'{"error":{"message":')  # compact, as route errors
    message = f"the file exceeds the limit of {FILE_LIMIT} bytes (--max-batch-file-bytes)"
    assert huge.json()["error"]["message"] == message
    many = "\n".join(json.dumps(line(str(i), {})) for i in range(LINE_LIMIT + 1)).encode()
    with pytest.raises(openai.BadRequestError) as info:
        sdk.files.create(file=("many.jsonl", io.BytesIO(many)), purpose="batch")
    assert "--max-batch-lines" in info.value.message
    assert_error(http.post("/v1/files", json={"purpose": "batch"}), 400, contains="multipart/form-data")

    for call in (lambda: sdk.files.retrieve("file-nope"), lambda: sdk.files.content("file-nope")):
        with pytest.raises(openai.NotFoundError):
            call()
    assert_error(http.get("/v1/batches/batch_nope"), 404, param="batch_id")
    assert_error(http.post("/v1/batches/batch_nope/cancel"), 404, param="batch_id")
    file_id = upload(sdk, [line("a", chat_body(tiny.name, "x"))])
    for fields, param in (
        ({"completion_window": "1h"}, "completion_window"),
        ({"endpoint": "/v1/embeddings"}, "endpoint"),  # a generative model: no embeddings route
        ({"input_file_id": "file-nope"}, "input_file_id"),
        ({"metadata": {"k" * 65: "v"}}, "metadata"),
        ({"output_expires_after": {"anchor": "created_at", "seconds": 3600}}, "output_expires_after"),
        ({"bogus": 1}, "bogus"),  # an unknown argument, as OpenAI refuses it
    ):
        request = {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h", **fields}
        response = http.post("/v1/batches", json=request)
        assert_error(response, 404 if param == "input_file_id" else 400, param=param)

    deleted = sdk.files.delete(file_id)
    assert deleted.deleted and deleted.id == file_id
    with pytest.raises(openai.NotFoundError):
        sdk.files.retrieve(file_id)


def test_interactive_request_is_prompt_during_a_batch_then_cancel(sdk, http, tiny):
    # long lines (cancelled before they end): a round of them is hundreds of steps, never within one poll
    body = {"model": tiny.name, "prompt": "long", "max_tokens": 384, "temperature": 0, "ignore_eos": True}
    lines = [line(f"n{i}", body, url="/v1/completions") for i in range(40)]
    batch = sdk.batches.create(input_file_id=upload(sdk, lines), endpoint="/v1/completions", completion_window="24h")
    wait_for(sdk, batch.id, ("in_progress",))
    for _ in range(3):
        before = sdk.batches.retrieve(batch.id).request_counts.completed
        sdk.chat.completions.create(**chat_body(tiny.name, "quick", max_tokens=4))
        after = sdk.batches.retrieve(batch.id)
        # measured in steps, not seconds (the CI machine is shared): the interactive request shares
        # steps with a few batch lines, it does not queue behind a round of them (--max-num-seqs 8)
        assert after.status == "in_progress" and after.request_counts.completed - before < 8, (before, after)

    cancelling = sdk.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled") and cancelling.cancelling_at
    done = wait_for(sdk, batch.id, ("cancelled",))
    counts = done.request_counts
    assert counts.total == 40 and counts.completed + counts.failed == 40 and counts.failed > 0
    answered = jsonl(sdk, done.output_file_id) + jsonl(sdk, done.error_file_id)
    assert sorted(a["custom_id"] for a in answered) == sorted(f"n{i}" for i in range(40))  # each exactly once
    assert {a["error"]["code"] for a in answered if a["error"]} == {"batch_cancelled"}
    assert sdk.batches.cancel(batch.id).status == "cancelled"  # cancelling again changes nothing
    short = [line("s0", {"model": tiny.name, "prompt": "x", "max_tokens": 1}, url="/v1/completions")]
    small = sdk.batches.create(input_file_id=upload(sdk, short), endpoint="/v1/completions", completion_window="24h")
    assert wait_for(sdk, small.id, ("completed", "failed")).status == "completed"
    assert_error(http.post(f"/v1/batches/{small.id}/cancel"), 409, contains="completed")


def test_batch_across_api_servers(sdk, batch_server, tiny):
    """Upload, create, poll, retrieve and download on whichever API server each connection reaches:
    each reads the directory on disk, so each shows the job that one of them runs, live."""
    lines = [line(f"m{i}", chat_body(tiny.name, f"count {i}", max_tokens=4)) for i in range(12)]
    file_id = upload(sdk, lines)
    assert sdk.files.retrieve(file_id).bytes > 0
    batch = sdk.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
    seen = []
    deadline = time.monotonic() + 60
    while (polled := sdk.batches.retrieve(batch.id)).status != "completed":
        assert polled.status in ("validating", "in_progress", "finalizing") and time.monotonic() < deadline, polled
        seen.append(polled.request_counts.completed)
        time.sleep(0.02)
    assert seen == sorted(seen), seen  # live counts from disk never go back, whichever server answers
    # the kernel hands each new connection (one a retrieve) to either API server, in no set share: retrieves,
    # each tagged so the access log names the server that answered it, until each server has answered some
    path = f"/v1/batches/{batch.id}"
    done: dict[str, openai.types.Batch] = {}
    servers: dict[str, str] = {}
    deadline = time.monotonic() + 60
    while set(servers.values()) != {"0", "1"}:
        assert time.monotonic() < deadline, f"{len(done)} retrieves, all answered by {set(servers.values())}"
        for _ in range(10):
            probe = str(len(done))
            done[probe] = sdk.batches.retrieve(batch.id, extra_query={"probe": probe})
        servers = answered_by(batch_server, "GET", path)
    first = next(iter(done.values()))
    # each server's answers (every one, whichever server) show the job as it ended
    assert {
        (b.status, b.request_counts.completed, b.request_counts.failed, b.output_file_id) for b in done.values()
    } == {("completed", 12, 0, first.output_file_id)}
    outputs = jsonl(sdk, first.output_file_id)
    assert sorted(o["custom_id"] for o in outputs) == sorted(f"m{i}" for i in range(12))  # each line once
    assert all(o["response"]["status_code"] == 200 for o in outputs)
    assert batch.id in {b.id for b in sdk.batches.list(limit=100)}
    # the progress note keeps the final counts, for a view that read the job's state just before it ended
    progress = json.loads((Path(batch_server.batch_dir) / "batches" / f"{batch.id}.progress").read_text())
    assert progress == {"total": 12, "completed": 12, "failed": 0}
    assert first.error_file_id is None  # and no empty log of failed lines is left behind
    assert not (Path(batch_server.batch_dir) / "batches" / f"{batch.id}.errors").exists()


def test_jobs_are_run_by_one_process_holding_the_directory(batch_server, sdk, tiny):
    """The directory's lock is held while a job runs, by an API server (not the launcher), and let
    go once no job is left: any process may take it then (another server sharing the directory)."""
    # long enough (about 1300 steps, four lines at a time) never to end between two polls; cancelled once seen
    body = {"model": tiny.name, "prompt": "x", "max_tokens": 128, "temperature": 0, "ignore_eos": True}
    lines = [line(f"k{i}", body, url="/v1/completions") for i in range(40)]
    batch = sdk.batches.create(input_file_id=upload(sdk, lines), endpoint="/v1/completions", completion_window="24h")
    store = BatchStore(Path(batch_server.batch_dir))
    deadline = time.monotonic() + 60
    while True:  # a lock taken while the job was in progress before and after would be a second runner
        before = sdk.batches.retrieve(batch.id).status
        taken = store.try_lock()
        store.unlock()
        if before == sdk.batches.retrieve(batch.id).status == "in_progress":
            assert not taken
            break
        assert before in ("validating", "in_progress") and time.monotonic() < deadline, before
        time.sleep(0.01)
    holder = (Path(batch_server.batch_dir) / "lock").read_text()
    assert Path(f"/proc/{holder}/stat").read_text().split()[3] == str(batch_server.process.pid)  # a child
    sdk.batches.cancel(batch.id)
    wait_for(sdk, batch.id, ("cancelled",))
    deadline = time.monotonic() + 10
    while not store.try_lock():  # let go once no job is left
        assert time.monotonic() < deadline
        time.sleep(0.05)
    store.unlock()


def test_a_job_of_another_servers_model_is_shown_not_run(batch_server, sdk, http):
    """A job another server (of another model) left in the shared directory: listed and retrievable
    here, never run here (its lines name a model this server does not serve), but cancellable."""
    now = int(time.time())
    foreign = {"id": "batch_foreign0", "object": "batch", "endpoint": "/v1/chat/completions", "status": "validating"}
    foreign |= {"input_file_id": upload(sdk, [line("f0", chat_body("another-model", "x"))]), "completion_window": "24h"}
    foreign |= {"created_at": now, "expires_at": now + 24 * 3600}
    foreign |= {"request_counts": {"total": 0, "completed": 0, "failed": 0}}
    foreign |= dict.fromkeys(("model", "errors", "output_file_id", "error_file_id", "usage", "metadata"))
    foreign |= dict.fromkeys(("in_progress_at", "finalizing_at", "completed_at", "failed_at", "expired_at"))
    foreign |= {"cancelling_at": None, "cancelled_at": None, RUNNER_KEY: "another-model"}
    BatchStore(Path(batch_server.batch_dir)).save_job(foreign)
    time.sleep(1)  # a few rounds of every API server's watch
    shown = sdk.batches.retrieve("batch_foreign0")
    assert shown.status == "validating" and shown.in_progress_at is None
    assert set(http.get("/v1/batches/batch_foreign0").json()) == set(foreign) - {RUNNER_KEY}  # OpenAI's fields
    assert "batch_foreign0" in {b.id for b in sdk.batches.list()}
    assert sdk.batches.cancel("batch_foreign0").status in ("cancelling", "cancelled")
    done = wait_for(sdk, "batch_foreign0", ("cancelled",))
    assert done.cancelling_at and done.cancelled_at and done.request_counts.total == 0
    # past its completion window, whoever's job it is: expired by any process watching the directory
    old = foreign | {"id": "batch_foreign1", "created_at": now - 25 * 3600, "expires_at": now - 3600}
    BatchStore(Path(batch_server.batch_dir)).save_job(old)
    expired = wait_for(sdk, "batch_foreign1", ("expired",))
    assert expired.expired_at and expired.request_counts.total == expired.request_counts.failed == 1
    (answer,) = jsonl(sdk, expired.error_file_id)
    assert answer["custom_id"] == "f0" and answer["error"]["code"] == "batch_expired"


def test_the_default_directory_is_per_served_model(monkeypatch, tmp_path):
    monkeypatch.setenv("LLMP_CACHE_DIR", str(tmp_path))
    options = FrontendOptions()
    assert batch_dir(options, "Qwen/Qwen3-0.6B") == tmp_path / "batches" / "Qwen_Qwen3-0.6B"
    assert batch_dir(options, "../..") == tmp_path / "batches" / "model"
    shared = FrontendOptions(batch_dir=str(tmp_path / "shared"))  # given: shared on purpose
    assert batch_dir(shared, "a") == batch_dir(shared, "b") == tmp_path / "shared"
