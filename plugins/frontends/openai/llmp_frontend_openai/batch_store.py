"""The batch directory (``--batch-dir``): uploaded files and batch jobs, kept across restarts and
shared by every process that opens it (the API servers of ``--api-server-count``, other servers).

Layout::

    lock                    held (flock) by the one process running this directory's jobs, while it runs them
    state.lock              held a moment to check and change together (a batch's input file exists / is unused)
    files/<id>.json         a FileObject; the file exists once its content is complete
    files/<id>.jsonl        the content
    batches/<id>.json       a Batch object, rewritten (atomically) at each change of status
    batches/<id>.cancel     a cancel request (its time), left by whichever process took it
    batches/<id>.progress   a job's live request counts, then its final ones (advisory: the answers are the truth)
    batches/<id>.output     the answers of a job in progress, one JSON line each, appended durably
    batches/<id>.errors     its failed lines, likewise

Every process reads the directory and writes new files and cancel requests; a job's own files
(its state, answers and progress) are written by the process holding ``lock`` alone, and by the
creating process before any can run it. Every state file is written to a temporary name, synced,
then renamed over the old one, so a reader (or a crash) sees the old version or the new, never half
of one. Answers are appended and synced one line at a time before they are counted: after a crash,
the lines on disk are the lines answered (a torn last line, cut by the crash, is dropped and its
request runs again).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

UNFINISHED = ("validating", "in_progress", "finalizing", "cancelling")


def new_id(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(12)}"


class BatchStore:
    """The files and jobs of one batch directory, as one process sees them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.files_dir, self.jobs_dir = root / "files", root / "batches"
        self._lock_fd: int | None = None
        self._files = _JsonDir(self.files_dir)
        self._jobs = _JsonDir(self.jobs_dir)

    def open(self) -> None:
        """Make the directory's folders (any process may be the first)."""
        for directory in (self.root, self.files_dir, self.jobs_dir):
            directory.mkdir(parents=True, exist_ok=True)

    # -- the runner's lock ------------------------------------------------------------------

    def try_lock(self) -> bool:
        """Take the right to run this directory's jobs, unless another process (or another store
        in this one) has it; released by :meth:`unlock` or when the process exits, however it exits."""
        if self._lock_fd is not None:
            return True
        fd = os.open(self.root / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)  # who runs the jobs, for an operator reading it
        self._lock_fd = fd
        return True

    def unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Every process's check-then-change of files and jobs, one at a time (held a moment: a
        blocking call, for a worker thread)."""
        fd = os.open(self.root / "state.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    # -- files ----------------------------------------------------------------------------

    def content_path(self, file_id: str) -> Path:
        return self.files_dir / f"{file_id}.jsonl"

    def add_file(self, file_id: str, content: bytes, meta: dict[str, Any]) -> None:
        _write_atomic(self.content_path(file_id), content)  # first: a listed file has its content
        save_json(self.files_dir / f"{file_id}.json", meta)

    def adopt_file(self, file_id: str, source: Path, meta: dict[str, Any]) -> None:
        """Make ``source`` (a job's output, complete and synced) the content of file ``file_id``."""
        os.replace(source, self.content_path(file_id))
        _sync_dir(self.files_dir)
        save_json(self.files_dir / f"{file_id}.json", meta)

    def add_meta(self, file_id: str, meta: dict[str, Any]) -> None:
        save_json(self.files_dir / f"{file_id}.json", meta)

    def file(self, file_id: str) -> dict[str, Any] | None:
        return load_json(self.files_dir / f"{file_id}.json") if _valid_id(file_id) else None

    def files(self) -> list[dict[str, Any]]:
        return self._files.read()

    def delete_file(self, file_id: str) -> None:
        (self.files_dir / f"{file_id}.json").unlink(missing_ok=True)  # first: no half-deleted file is listed
        self.content_path(file_id).unlink(missing_ok=True)
        _sync_dir(self.files_dir)

    # -- jobs -----------------------------------------------------------------------------

    def save_job(self, job: dict[str, Any]) -> None:
        save_json(self.jobs_dir / f"{job['id']}.json", job)

    def job(self, batch_id: str) -> dict[str, Any] | None:
        return load_json(self.jobs_dir / f"{batch_id}.json") if _valid_id(batch_id) else None

    def jobs(self) -> list[dict[str, Any]]:
        return self._jobs.read()

    def answers_path(self, batch_id: str, kind: str) -> Path:
        """Where a job's answers (``output``) or failed lines (``errors``) accumulate."""
        return self.jobs_dir / f"{batch_id}.{kind}"

    def request_cancel(self, batch_id: str) -> int:
        """Record a cancel request for the job's runner; the time of the first one."""
        path = self.jobs_dir / f"{batch_id}.cancel"
        with contextlib.suppress(FileExistsError):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                os.write(fd, str(int(time.time())).encode())
                os.fsync(fd)
            finally:
                os.close(fd)
            _sync_dir(self.jobs_dir)
        return self.cancel_requested(batch_id) or int(time.time())

    def cancel_requested(self, batch_id: str) -> int | None:
        """When a cancel was requested (None: never). A request being written reads as now."""
        try:
            text = (self.jobs_dir / f"{batch_id}.cancel").read_text()
        except FileNotFoundError:
            return None
        return int(text) if text.isdigit() else int(time.time())

    def save_progress(self, batch_id: str, counts: dict[str, int]) -> None:
        """A running job's counts for other processes' views; not synced: the answers on disk are
        what a resumed job counts."""
        _write_atomic(self.jobs_dir / f"{batch_id}.progress", json.dumps(counts).encode(), sync=False)

    def progress(self, batch_id: str) -> dict[str, int] | None:
        return load_json(self.jobs_dir / f"{batch_id}.progress")

    def clear_job_notes(self, batch_id: str) -> None:
        """Drop a finished job's cancel request. Its progress (the final counts by now) stays: a view
        in another process that read the job's state just before it finished still reads them."""
        (self.jobs_dir / f"{batch_id}.cancel").unlink(missing_ok=True)


class _JsonDir:
    """The ``*.json`` objects of a folder, each parsed again only when its file was replaced
    (another process wrote it): listing and polling stay cheap however many jobs a directory holds."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._cache: dict[str, tuple[tuple[int, int, int], dict[str, Any]]] = {}
        self._mutex = threading.Lock()  # listings run in worker threads

    def read(self) -> list[dict[str, Any]]:
        with self._mutex:
            seen: dict[str, tuple[tuple[int, int, int], dict[str, Any]]] = {}
            try:
                entries = list(os.scandir(self.directory))
            except FileNotFoundError:
                entries = []
            for entry in entries:
                if not entry.name.endswith(".json") or entry.name.startswith("."):
                    continue
                try:
                    st = entry.stat()
                except FileNotFoundError:  # deleted meanwhile
                    continue
                key = (st.st_ino, st.st_mtime_ns, st.st_size)
                cached = self._cache.get(entry.name)
                if cached is None or cached[0] != key:
                    data = load_json(Path(entry.path))
                    if not isinstance(data, dict):
                        continue
                    cached = (key, data)
                seen[entry.name] = cached
            self._cache = seen
            return [dict(data) for _, data in seen.values()]  # copies: callers may change theirs


class AnswerLog:
    """One job's answers in one file: appended and synced line by line; reopened after a crash
    with its torn last line dropped."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.custom_ids: list[str] = []
        self.usage = {"input_tokens": 0, "output_tokens": 0, "cached_tokens": 0, "reasoning_tokens": 0}
        for record in self._recover():
            self._count(record)
        self._file = open(path, "ab")  # noqa: SIM115  (open for the job's life; closed by close())

    def _recover(self) -> Iterator[dict[str, Any]]:
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        whole = data[: data.rfind(b"\n") + 1]
        if len(whole) != len(data):  # a crash cut the last line: it was never counted
            with open(self.path, "r+b") as f:
                f.truncate(len(whole))
                os.fsync(f.fileno())
        for line in whole.splitlines():
            yield json.loads(line)

    def _count(self, record: dict[str, Any]) -> None:
        self.custom_ids.append(record["custom_id"])
        usage = ((record.get("response") or {}).get("body") or {}).get("usage")
        if isinstance(usage, dict):
            self.usage["input_tokens"] += int(usage.get("prompt_tokens") or 0)
            self.usage["output_tokens"] += int(usage.get("completion_tokens") or 0)
            self.usage["cached_tokens"] += int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
            self.usage["reasoning_tokens"] += int(
                (usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0
            )

    def append(self, record: dict[str, Any]) -> None:
        """Write ``record`` as one line and sync it: once this returns, the answer survives a crash."""
        self._file.write(json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode() + b"\n")
        self._file.flush()
        os.fsync(self._file.fileno())
        self._count(record)

    def close(self) -> None:
        self._file.close()

    def __len__(self) -> int:
        return len(self.custom_ids)


def save_json(path: Path, data: Any) -> None:
    _write_atomic(path, json.dumps(data, ensure_ascii=False).encode())


def load_json(path: Path) -> Any:
    with contextlib.suppress(FileNotFoundError, ValueError):
        return json.loads(path.read_bytes())
    return None


def _write_atomic(path: Path, data: bytes, *, sync: bool = True) -> None:
    # a name of its own per write: two writers (processes or threads) never share a temporary file
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    with open(temporary, "wb") as f:
        f.write(data)
        if sync:
            f.flush()
            os.fsync(f.fileno())
    os.replace(temporary, path)
    if sync:
        _sync_dir(path.parent)


def _sync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _valid_id(value: str) -> bool:
    """An id as this store makes them: no path separators or dots reach the file system."""
    return bool(value) and value.replace("-", "").replace("_", "").isalnum()
