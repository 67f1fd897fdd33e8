"""Batch jobs on a server: validated, run a line at a time behind interactive traffic, resumed
after a restart, finalized into an output and an error file.

One job runs at a time, oldest first. Its lines go to the engine through :class:`LineRunner`
with a bounded number in flight (:class:`BatchPace`), fewer while interactive requests are in
flight, so a big batch leaves the engine room for them; under ``--scheduling-policy priority``
its lines also rank behind them. Each answer is appended durably before it is counted, so a job
resumed after a crash runs exactly the lines not yet on disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from llmp.frontend import APIError, bad_request
from llmp_frontend_openai.batch_lines import BATCH_URLS, BatchLine, batch_error, parse_batch_file
from llmp_frontend_openai.batch_runner import BATCH_PRIORITY_OFFSET, LineResult, LineRunner
from llmp_frontend_openai.batch_store import UNFINISHED, AnswerLog, BatchStore, new_id

log = logging.getLogger("llmp.frontend.openai.batch")

COMPLETION_WINDOW_S = 24 * 3600
RETRY_DELAY_S = 0.5  # the first pause after a transient outcome (busy, sleeping engine), doubled each time
MAX_RETRY_DELAY_S = 4.0
MAX_SERVER_ERROR_RETRIES = 2  # a line that keeps failing with a 500 is answered with it
# statuses that say the server cannot take the line now (busy, draining, the engine gone): run it later
TRANSIENT = frozenset({429, 499, 503})
PACE_POLL_S = 0.05
STATS_S = 0.25  # how often a running job reads the engine's figures (other API servers' requests)
WATCH_S = 0.25  # how often a process using the batch API looks for jobs to run (new, cancelled, orphaned)
FAILURE_BACKOFF_S = 5.0
RUNNER_KEY = "_server_model"  # a job's private field: the served model it was created for
CREATED_NS_KEY = "_created_ns"  # private too: the creation time to the nanosecond, orders jobs of one second


def creation_order(job: dict[str, Any]) -> tuple[int, int, str]:
    """Jobs oldest first: by creation time (to the nanosecond for jobs that record it), then id."""
    return (job["created_at"], job.get(CREATED_NS_KEY, 0), job["id"])


ANSWER_FILES = {"output": "output_file_id", "errors": "error_file_id"}


class BatchPace:
    """How many batch lines may be in flight: half the engine's sequences while no interactive
    request is in flight, an eighth (at least one) while any is, and never so many that the
    server's admission limit (``--max-queue-len``) would refuse an interactive request.

    Interactive requests are this process's own (``in_flight``, exact) and, every
    ``STATS_S``, those the engine holds for other processes (the other API servers of
    ``--api-server-count``), from its running and waiting figures."""

    def __init__(self, engine: Any) -> None:
        config = getattr(engine, "config", None)
        seqs = getattr(config, "max_num_seqs", 8)
        self.engine = engine
        self.idle = max(1, seqs // 2)
        self.busy = max(1, seqs // 8)
        self.elsewhere = 0  # engine requests not of this process
        # the engine's figures mean something next to this process's own count only
        self._stats = getattr(engine, "stats", None) if hasattr(engine, "in_flight") else None
        self._checked = -STATS_S
        self._reading: asyncio.Task | None = None

    def refresh(self) -> None:
        """Read the engine's figures again in the background (the run loop never waits for them)."""
        now = time.monotonic()
        if self._stats is None or now - self._checked < STATS_S:
            return
        if self._reading is None or self._reading.done():
            self._checked = now
            self._reading = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        before = getattr(self.engine, "in_flight", 0)
        try:
            figures = await self._stats(timeout=STATS_S * 4)
        except Exception:  # a busy or stopping engine: keep the last figure
            return
        in_engine = int(figures.get("num_running") or 0) + int(figures.get("num_waiting") or 0)
        # this process's requests while the figures were read: those that ended and those that began
        mine = max(before, getattr(self.engine, "in_flight", 0))
        self.elsewhere = max(0, in_engine - mine)

    def close(self) -> None:
        if self._reading is not None:
            self._reading.cancel()

    def slots(self, batch_requests: int) -> int:
        in_flight = getattr(self.engine, "in_flight", batch_requests)
        interactive = max(0, in_flight - batch_requests)
        slots = self.busy if interactive or self.elsewhere else self.idle
        capacity = getattr(self.engine, "capacity", None)
        if capacity is not None:
            slots = min(slots, capacity - interactive - 1)
        return slots


class BatchService:
    """The Files and Batches API's state in one process: the store on disk, which every process
    serving the directory reads and writes, and the job runner (the front-end's ``serve()`` task).

    Whichever process a request reaches answers it from disk. Jobs are run by one process at a
    time, the holder of the directory's lock: each process that has used the API (or found jobs of
    its model to resume at start-up) watches the directory, and when it finds a job it can run and
    the lock is free, takes the lock, runs the jobs oldest first, then lets the lock go. So a new
    job, a cancel request or a dead runner's job is picked up by whoever is free, and a job only
    runs on a server that serves the model it was created on (independent servers sharing the
    default directory do not run each other's jobs)."""

    def __init__(self, fe: Any, runner: LineRunner, root: Path) -> None:
        self.fe = fe
        self.runner = runner
        self.root = root
        self.store = BatchStore(root)
        self.server_model = fe.model_name  # the jobs this process may run: those created for it
        self.active = asyncio.Event()
        self.wake = asyncio.Event()

    def open(self) -> BatchStore:
        """The store, its folders made on first use (a 503 if the directory is unusable); from then on
        this process watches the directory for jobs to run. In the event loop: the actions that run
        in worker threads expect it opened."""
        if not self.active.is_set():
            try:
                self.store.open()
            except OSError as exc:
                raise APIError(503, f"cannot open the batch directory {self.root}: {exc}") from None
            self.active.set()
        return self.store

    async def serve(self) -> None:
        """Run jobs for the server's life: at once if the directory holds unfinished ones of this
        server's model (a restart mid-job), else from the first use of the API."""
        if await asyncio.to_thread(self._runnable):
            self.open()
        if self.active.is_set():
            await asyncio.to_thread(self._log_others_jobs)
        await self.active.wait()
        try:
            while True:
                try:
                    await self._run_pending()
                except Exception:  # the store failed (disk full ...): keep serving, try again later
                    log.exception("running the batch jobs of %s failed", self.root)
                    await asyncio.sleep(FAILURE_BACKOFF_S)
                self.wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), WATCH_S)
        finally:
            self.store.unlock()

    def _runnable(self) -> list[dict[str, Any]]:
        """The unfinished jobs on disk this process may run, oldest first: those of its model (or of
        no recorded model), and any with a cancel request or past its completion window (those run
        no request: any process finalizes them)."""
        now = time.time()
        jobs = [
            job
            for job in self.store.jobs()
            if job.get("status") in UNFINISHED
            and (
                job.get(RUNNER_KEY) in (None, self.server_model)
                or now > job["expires_at"]
                or self.store.cancel_requested(job["id"]) is not None
            )
        ]
        return sorted(jobs, key=creation_order)

    def _log_others_jobs(self) -> None:
        """Say once which unfinished jobs of the directory wait for a server of another model."""
        waiting = [
            f"{job['id']} ({job[RUNNER_KEY]})"
            for job in self.store.jobs()
            if job.get("status") in UNFINISHED and job.get(RUNNER_KEY) not in (None, self.server_model)
        ]
        if waiting:
            log.warning(
                "%d unfinished batch jobs in %s are for other served models and will not run on this server "
                "(they expire 24 h after creation): %s",
                len(waiting),
                self.root,
                ", ".join(waiting),
            )

    async def _run_pending(self) -> None:
        if not await asyncio.to_thread(self._runnable):
            return
        if not self.store.try_lock():
            return  # another process runs the directory's jobs now; its lock is free when it is done
        try:
            ran: set[str] = set()
            while True:  # read again under the lock: another runner may have finished one meanwhile
                pending = [job for job in await asyncio.to_thread(self._runnable) if job["id"] not in ran]
                if not pending:
                    return
                ran.add(pending[0]["id"])
                await self._run_job(pending[0])
        finally:
            self.store.unlock()

    # -- the API's actions ---------------------------------------------------------------

    def create(self, input_file_id: str, endpoint: str, metadata: dict[str, str] | None) -> dict[str, Any]:
        """A new job (in a worker thread: it waits for other processes' changes), or an APIError
        for an input file that is not there (deleted meanwhile, by any process) or not a batch's."""
        store = self.store
        created_ns = time.time_ns()
        now = created_ns // 1_000_000_000
        job = {
            "id": new_id("batch_"),
            "object": "batch",
            "endpoint": endpoint,
            "model": None,
            "errors": None,
            "input_file_id": input_file_id,
            "completion_window": "24h",
            "status": "validating",
            "output_file_id": None,
            "error_file_id": None,
            "created_at": now,
            "in_progress_at": None,
            "expires_at": now + COMPLETION_WINDOW_S,
            "finalizing_at": None,
            "completed_at": None,
            "failed_at": None,
            "expired_at": None,
            "cancelling_at": None,
            "cancelled_at": None,
            "request_counts": {"total": 0, "completed": 0, "failed": 0},
            "usage": None,
            "metadata": metadata,
            RUNNER_KEY: self.server_model,
            CREATED_NS_KEY: created_ns,
        }
        with store.exclusive():  # the file is not deleted between this check and the job's creation
            meta = store.file(input_file_id)
            if meta is None:
                raise APIError(404, f"No such File object: {input_file_id}", param="input_file_id")
            if meta["purpose"] != "batch":
                raise bad_request(
                    f"the file {input_file_id} has purpose {meta['purpose']!r}, not 'batch'", "input_file_id"
                )
            store.save_job(job)
        return job

    def delete_file(self, file_id: str) -> None:
        """Delete an uploaded file (in a worker thread), unless an unfinished job reads it (409)."""
        store = self.store
        with store.exclusive():
            running = [
                job["id"] for job in store.jobs() if job["input_file_id"] == file_id and job["status"] in UNFINISHED
            ]
            if running:
                raise APIError(
                    409,
                    f"the file {file_id} is the input of batch {running[0]}, which has not finished: "
                    "cancel it or wait for it first",
                    param="file_id",
                    type="invalid_request_error",
                )
            store.delete_file(file_id)

    def cancel(self, job: dict[str, Any]) -> dict[str, Any]:
        """Record a cancel request on disk, for whichever process runs the job (in a worker thread)."""
        if job["status"] in ("cancelling", "cancelled"):
            return self.view(job)
        if job["status"] not in ("validating", "in_progress"):
            raise APIError(409, f"Cannot cancel a batch with status {job['status']!r}.", type="invalid_request_error")
        self.store.request_cancel(job["id"])
        return self.view(self.store.job(job["id"]) or job)

    def view(self, job: dict[str, Any]) -> dict[str, Any]:
        """The Batch object as the API shows it: a requested cancel, and a running job's live counts
        (written by its runner, in whichever process)."""
        shown = {key: value for key, value in job.items() if not key.startswith("_")}
        if job["status"] in ("validating", "in_progress"):
            cancelling_at = self.store.cancel_requested(job["id"])
            if cancelling_at is not None:
                shown.update(status="cancelling", cancelling_at=cancelling_at)
        if job["status"] in ("in_progress", "cancelling", "finalizing"):
            live = self.store.progress(job["id"])
            if isinstance(live, dict):
                shown["request_counts"] = live
        return shown

    def _cancel_requested(self, job: dict[str, Any]) -> bool:
        return job["status"] == "cancelling" or self.store.cancel_requested(job["id"]) is not None

    # -- running a job (holding the directory's lock) -----------------------------------

    async def _run_job(self, job: dict[str, Any]) -> None:
        try:
            if job["status"] == "validating" and _expired(job) and not self._cancel_requested(job):
                await self._expire_unvalidated(job)
            elif job["status"] == "validating":
                lines = await self._validate(job)
                if lines is not None:
                    await self._execute(job, lines)
            elif job["status"] in ("in_progress", "cancelling", "finalizing"):
                await self._execute(job)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the store failed (disk full ...): the job fails, the server goes on
            log.exception("batch %s failed", job["id"])
            job.update(status="failed", failed_at=int(time.time()))
            job["errors"] = {"object": "list", "data": [batch_error("server_error", f"the batch job failed: {exc}")]}
            self._save(job)

    def _read_lines(self, job: dict[str, Any], *, strict: bool = True) -> tuple[list[BatchLine], list[dict[str, Any]]]:
        """The job's lines and the file's problems; not ``strict``: only the lines, for a job being
        cancelled (perhaps by a server of another model, whose routes differ)."""
        path = self.store.content_path(job["input_file_id"])
        try:
            content = path.read_bytes()
        except FileNotFoundError:
            return [], [batch_error("file_not_found", f"The input file {job['input_file_id']!r} no longer exists.")]
        if not strict:
            return parse_batch_file(content, endpoint=None, served=BATCH_URLS)
        return parse_batch_file(
            content, endpoint=job["endpoint"], served=self.runner.urls, max_lines=self.fe.options.max_batch_lines
        )

    async def _expire_unvalidated(self, job: dict[str, Any]) -> None:
        """A job never started within its window (no server of its model ran it): every line gets
        its ``batch_expired`` answer."""
        lines, _ = await asyncio.to_thread(self._read_lines, job, strict=False)
        job.update(status="in_progress", in_progress_at=int(time.time()))
        job["request_counts"] = {"total": len(lines), "completed": 0, "failed": 0}
        await self._execute(job, lines)

    async def _validate(self, job: dict[str, Any]) -> list[BatchLine] | None:
        if self._cancel_requested(job):  # never started: nothing to answer
            now = int(time.time())
            job.update(
                status="cancelled", cancelling_at=self.store.cancel_requested(job["id"]) or now, cancelled_at=now
            )
            self._save(job)
            await _on_disk(self.store.clear_job_notes, job["id"])
            return None
        lines, errors = await asyncio.to_thread(self._read_lines, job)
        now = int(time.time())
        if errors:
            job.update(status="failed", failed_at=now, errors={"object": "list", "data": errors})
            self._save(job)
            return None
        model = next((line.body.get("model") for line in lines if isinstance(line.body.get("model"), str)), None)
        job.update(status="in_progress", in_progress_at=now, model=model or self.fe.model_name)
        job["request_counts"] = {"total": len(lines), "completed": 0, "failed": 0}
        self._save(job)
        return lines

    async def _execute(self, job: dict[str, Any], lines: list[BatchLine] | None = None) -> None:
        if lines is None:
            strict = not (self._cancel_requested(job) or _expired(job))  # else: nothing runs, whoever's job it is
            lines, errors = await asyncio.to_thread(self._read_lines, job, strict=strict)
            if errors:  # the input or the limits changed under a job: fail it, as validation would have
                job.update(status="failed", failed_at=int(time.time()), errors={"object": "list", "data": errors})
                self._save(job)
                return
        output, failed = self._answer_log(job, "output"), self._answer_log(job, "errors")
        counts = {"total": len(lines), "completed": len(output), "failed": len(failed)}
        try:
            await _on_disk(self.store.save_progress, job["id"], counts)
            done = set(output.custom_ids) | set(failed.custom_ids)
            todo = [line for line in lines if line.custom_id not in done]
            if job["status"] == "in_progress" and todo and not self._cancel_requested(job) and not _expired(job):
                await self._run_lines(job, todo, output, failed, counts)
            answered = set(output.custom_ids) | set(failed.custom_ids)
            rest = [line for line in lines if line.custom_id not in answered]
            cancelled = self._cancel_requested(job)
            if rest:  # cancelled or expired: every line still gets its one answer, in the error file
                code, message = (
                    ("batch_cancelled", "This request was not executed because the batch was cancelled.")
                    if cancelled
                    else ("batch_expired", "This request could not be executed before the completion window expired.")
                )
                for line in rest:
                    record = {"id": new_id("batch_req_"), "custom_id": line.custom_id, "response": None}
                    await _on_disk(failed.append, {**record, "error": {"code": code, "message": message}})
                    counts["failed"] += 1
            final = "cancelled" if cancelled else "expired" if rest else "completed"
            await _on_disk(self._finalize, job, output, failed, final)
        finally:
            output.close()
            failed.close()

    def _answer_log(self, job: dict[str, Any], kind: str) -> AnswerLog:
        """A job's answers of one kind: still beside the job, or already the file finalizing made of them."""
        path = self.store.answers_path(job["id"], kind)
        file_id = job[ANSWER_FILES[kind]]
        if not path.exists() and file_id is not None and self.store.content_path(file_id).exists():
            path = self.store.content_path(file_id)
        return AnswerLog(path)

    async def _run_lines(
        self,
        job: dict[str, Any],
        todo: list[BatchLine],
        output: AnswerLog,
        failed: AnswerLog,
        counts: dict[str, int],
    ) -> None:
        pace = BatchPace(self.fe.engine)
        queue = list(reversed(todo))  # popped from the end: input order
        running: dict[asyncio.Task, tuple[BatchLine, int]] = {}
        attempts: dict[str, int] = {}
        append_lock = asyncio.Lock()
        shown = dict(counts)  # the counts other processes see
        paused_until, setbacks = 0.0, 0  # after transient outcomes: no new line before then
        cancelling = False
        try:
            while queue or running:
                if _expired(job):
                    break  # the lines in flight are aborted: the window is over
                if not cancelling and self.store.cancel_requested(job["id"]) is not None:
                    cancelling = True  # as OpenAI: no new line; those in flight finish and are kept
                    queue.clear()
                pace.refresh()
                if time.monotonic() >= paused_until:
                    while queue and len(running) < pace.slots(len(running)):
                        line = queue.pop()
                        task = asyncio.ensure_future(self.runner.answer(line, job["id"]))
                        running[task] = (line, attempts.get(line.custom_id, 0))
                if not running:
                    await asyncio.sleep(PACE_POLL_S)
                    continue
                finished, _ = await asyncio.wait(running, timeout=PACE_POLL_S, return_when=asyncio.FIRST_COMPLETED)
                for task in finished:
                    line, attempt = running.pop(task)
                    result: LineResult = task.result()
                    if _retry(result, attempt):
                        if not cancelling:  # run again later; cancelled: it gets its batch_cancelled answer
                            attempts[line.custom_id] = attempt + 1
                            queue.append(line)
                        setbacks += 1
                        delay = min(MAX_RETRY_DELAY_S, RETRY_DELAY_S * 2 ** min(setbacks - 1, 8))
                        paused_until = max(paused_until, time.monotonic() + delay)
                        log.debug(
                            "batch %s: line %s got %d (the server cannot take it now): again in %.1f s",
                            job["id"],
                            line.custom_id,
                            result.status,
                            delay,
                        )
                        continue
                    setbacks = 0
                    async with append_lock:
                        target = output if result.ok else failed
                        await _on_disk(target.append, result.record)
                    counts["completed" if result.ok else "failed"] += 1
                if counts != shown:
                    shown = dict(counts)
                    await _on_disk(self.store.save_progress, job["id"], shown)
        finally:
            pace.close()
            for task in running:  # cancelled, expired or shut down: the engine aborts them
                task.cancel()
            if running:
                await asyncio.wait(running)

    def _finalize(self, job: dict[str, Any], output: AnswerLog, failed: AnswerLog, final: str) -> None:
        """Make the answers files (ids saved with the job first, so a crash here resumes the same
        finalizing), then the final status."""
        now = int(time.time())
        counts = {"total": len(output) + len(failed), "completed": len(output), "failed": len(failed)}
        # the final counts first: a view that read the job's state before this one must not see them go back
        self.store.save_progress(job["id"], counts)
        job["request_counts"] = counts
        if final == "cancelled" and job["status"] != "cancelling":  # recorded once, with the request's time
            job.update(status="cancelling", cancelling_at=self.store.cancel_requested(job["id"]) or now)
        elif job["status"] == "in_progress":
            job.update(status="finalizing", finalizing_at=now)
        logs = {"output": output, "errors": failed}
        for kind, log_ in logs.items():
            if len(log_) and job[ANSWER_FILES[kind]] is None:
                job[ANSWER_FILES[kind]] = new_id("file-")
        self._save(job)
        for kind, log_ in logs.items():
            file_id = job[ANSWER_FILES[kind]]
            if file_id is None:  # no line of this kind: no file, and no empty log left behind
                log_.path.unlink(missing_ok=True)
                continue
            name = f"{job['id']}_{'output' if kind == 'output' else 'error'}.jsonl"
            meta = file_object(file_id, name, log_.path.stat().st_size, "batch_output", now)
            if log_.path != self.store.content_path(file_id):
                self.store.adopt_file(file_id, log_.path, meta)
            else:
                self.store.add_meta(file_id, meta)
        usage = output.usage
        job["usage"] = {
            "input_tokens": usage["input_tokens"],
            "input_tokens_details": {"cached_tokens": usage["cached_tokens"]},
            "output_tokens": usage["output_tokens"],
            "output_tokens_details": {"reasoning_tokens": usage["reasoning_tokens"]},
            "total_tokens": usage["input_tokens"] + usage["output_tokens"],
        }
        job.update(status=final, **{f"{final}_at": now})
        self._save(job)
        self.store.clear_job_notes(job["id"])

    def _save(self, job: dict[str, Any]) -> None:
        self.store.save_job(job)


async def _on_disk(write: Callable[..., Any], *args: Any) -> Any:
    """A write of the job's files in a worker thread that a cancellation (shutdown) waits for: the
    directory's lock passes to another process only once no write of this one is under way."""
    task = asyncio.ensure_future(asyncio.to_thread(write, *args))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        await asyncio.wait([task])
        raise


def _expired(job: dict[str, Any]) -> bool:
    return time.time() > job["expires_at"]


def _retry(result: LineResult, attempt: int) -> bool:
    """Whether a line's outcome says nothing about the line: the server was busy, draining or lost
    its engine (run it again later), or a server error that may pass (a few times)."""
    if result.status in TRANSIENT or result.aborted:
        return True
    return result.status >= 500 and attempt < MAX_SERVER_ERROR_RETRIES


def file_object(file_id: str, filename: str, size: int, purpose: str, created_at: int) -> dict[str, Any]:
    """OpenAI's FileObject."""
    return {
        "id": file_id,
        "object": "file",
        "bytes": size,
        "created_at": created_at,
        "filename": filename,
        "purpose": purpose,
        "status": "processed",
        "status_details": None,
        "expires_at": None,
    }


def priority_offset(engine: Any) -> int:
    policy = getattr(getattr(engine, "config", None), "scheduling_policy", "fcfs")
    return BATCH_PRIORITY_OFFSET if policy == "priority" else 0
