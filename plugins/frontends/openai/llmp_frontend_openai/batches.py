"""OpenAI's Files and Batch APIs: ``/v1/files`` (upload JSONL with purpose ``batch``, list,
retrieve, content, delete) and ``/v1/batches`` (create, retrieve, list, cancel), persisted under
``--batch-dir`` and run by :mod:`llmp_frontend_openai.batch_jobs`."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import FileResponse
from pydantic import ConfigDict

from llmp.frontend import APIError, bad_request, cache_dir
from llmp.options import FrontendOptions
from llmp_frontend_openai.batch_jobs import BatchService, creation_order, file_object, priority_offset
from llmp_frontend_openai.batch_lines import count_lines
from llmp_frontend_openai.batch_runner import LineRunner
from llmp_frontend_openai.batch_store import new_id
from llmp_frontend_openai.pages import cursor_page
from llmp_frontend_openai.protocol import OpenAIModel

if TYPE_CHECKING:
    from llmp_frontend_openai.frontend import OpenAIFrontend

UPLOAD_OVERHEAD = 64 << 10  # multipart boundaries and fields around the file itself
MAX_METADATA_PAIRS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512


class BatchCreateRequest(OpenAIModel):
    model_config = ConfigDict(extra="forbid")  # OpenAI refuses an unknown argument here (a 400 naming it)

    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None = None
    output_expires_after: Any = None  # refused unless null: outputs are kept until deleted


def batch_dir(options: FrontendOptions, model_name: str) -> Path:
    """``--batch-dir`` (which servers may share on purpose), else ``batches/<served model>`` in the
    llmp cache (``LLMP_CACHE_DIR``): unrelated servers on one machine see each other's files only
    when they serve the same model name."""
    if options.batch_dir:
        return Path(options.batch_dir).expanduser()
    return cache_dir() / "batches" / safe_dir_name(model_name)


def safe_dir_name(name: str) -> str:
    """``name`` as one directory name: runs of other characters than letters, digits, ``.``, ``_``
    and ``-`` become ``_`` (``Qwen/Qwen3-0.6B`` -> ``Qwen_Qwen3-0.6B``)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._-")[:200] or "model"


def file_too_large(options: FrontendOptions) -> str:
    return f"the file exceeds the limit of {options.max_batch_file_bytes} bytes (--max-batch-file-bytes)"


def upload_limit(options: FrontendOptions) -> int:
    """The largest multipart body ``POST /v1/files`` may carry (the gate reads no more)."""
    return options.max_batch_file_bytes + UPLOAD_OVERHEAD


def add_routes(router: APIRouter, fe: OpenAIFrontend) -> BatchService:
    runner = LineRunner(router, priority_offset=priority_offset(fe.engine))
    service = BatchService(fe, runner, batch_dir(fe.options, fe.model_name))
    options = fe.options

    # every answer comes from the directory on disk: another process (another API server of
    # --api-server-count) may have made what a request names
    def find_file(file_id: str) -> dict[str, Any]:
        meta = service.open().file(file_id)
        if meta is None:
            raise APIError(404, f"No such File object: {file_id}", param="file_id", type="invalid_request_error")
        return meta

    def find_batch(batch_id: str) -> dict[str, Any]:
        job = service.open().job(batch_id)
        if job is None:
            raise APIError(404, f"No such Batch object: {batch_id}", param="batch_id", type="invalid_request_error")
        return job

    async def upload_file(request: Request) -> dict[str, Any]:
        if request.headers.get("content-type", "").split(";")[0].strip().lower() != "multipart/form-data":
            raise bad_request("POST /v1/files takes multipart/form-data: the file and its purpose")
        store = service.open()
        async with request.form(max_files=1, max_fields=4) as form:
            unknown = sorted(set(form) - {"file", "purpose"})
            if unknown:
                raise bad_request(f"unsupported field {unknown[0]!r}: uploads take 'file' and 'purpose'", unknown[0])
            purpose, upload = form.get("purpose"), form.get("file")
            if not isinstance(purpose, str) or not purpose:
                raise bad_request("Missing required parameter: 'purpose'.", "purpose")
            if purpose != "batch":
                raise bad_request(
                    f"purpose {purpose!r} is not supported: this server takes files for batches only (purpose 'batch')",
                    "purpose",
                )
            if upload is None or isinstance(upload, str):
                raise bad_request("Missing required parameter: 'file' (a file part).", "file")
            content = await upload.read(options.max_batch_file_bytes + 1)
            filename = upload.filename or "upload.jsonl"
        if len(content) > options.max_batch_file_bytes:
            raise APIError(413, file_too_large(options), param="file")
        lines = count_lines(content)
        if lines > options.max_batch_lines:
            raise bad_request(
                f"the file holds {lines} request lines; a batch takes at most {options.max_batch_lines} "
                "(--max-batch-lines)",
                "file",
            )
        file_id = new_id("file-")
        meta = file_object(file_id, Path(filename).name, len(content), purpose, int(time.time()))
        await asyncio.to_thread(store.add_file, file_id, content, meta)
        return meta

    async def list_files(
        after: str | None = None,
        limit: int = Query(10000, ge=1, le=10000),
        order: Literal["asc", "desc"] = "desc",
        purpose: str | None = None,
    ) -> dict[str, Any]:
        files = await asyncio.to_thread(service.open().files)
        files = [meta for meta in files if purpose is None or meta["purpose"] == purpose]
        files.sort(key=lambda meta: (meta["created_at"], meta["id"]), reverse=order == "desc")
        return cursor_page(files, after, limit, "after")

    async def retrieve_file(file_id: str) -> dict[str, Any]:
        return find_file(file_id)

    async def file_content(file_id: str) -> FileResponse:
        meta = find_file(file_id)
        return FileResponse(
            service.store.content_path(file_id), media_type="application/jsonl", filename=meta["filename"]
        )

    async def delete_file(file_id: str) -> dict[str, Any]:
        find_file(file_id)
        await asyncio.to_thread(service.delete_file, file_id)
        return {"id": file_id, "object": "file", "deleted": True}

    async def create_batch(body: BatchCreateRequest) -> dict[str, Any]:
        if body.completion_window != "24h":
            raise bad_request(
                f"completion_window {body.completion_window!r} is not supported: only '24h'", "completion_window"
            )
        if body.endpoint not in runner.urls:
            raise bad_request(
                f"endpoint {body.endpoint!r} is not supported for batches of this model; "
                f"supported: {', '.join(runner.urls)}",
                "endpoint",
            )
        if body.output_expires_after is not None:
            raise bad_request(
                "output_expires_after is not supported: output files are kept until deleted", "output_expires_after"
            )
        _check_metadata(body.metadata)
        service.open()
        job = await asyncio.to_thread(service.create, body.input_file_id, body.endpoint, body.metadata)
        service.wake.set()  # this process runs it at once unless another process runs jobs now
        return service.view(job)

    async def retrieve_batch(batch_id: str) -> dict[str, Any]:
        return service.view(find_batch(batch_id))

    async def list_batches(after: str | None = None, limit: int = Query(20, ge=1, le=100)) -> dict[str, Any]:
        jobs = await asyncio.to_thread(service.open().jobs)
        jobs.sort(key=creation_order, reverse=True)
        page = cursor_page(jobs, after, limit, "after")
        page["data"] = await asyncio.to_thread(lambda: [service.view(job) for job in page["data"]])
        return page

    async def cancel_batch(batch_id: str) -> dict[str, Any]:
        batch = await asyncio.to_thread(service.cancel, find_batch(batch_id))
        service.wake.set()
        return batch

    router.add_api_route("/v1/files", upload_file, methods=["POST"], summary="Upload a batch input file (JSONL)")
    router.add_api_route("/v1/files", list_files, methods=["GET"], summary="List files")
    router.add_api_route("/v1/files/{file_id}", retrieve_file, methods=["GET"], summary="Retrieve a file")
    router.add_api_route("/v1/files/{file_id}", delete_file, methods=["DELETE"], summary="Delete a file")
    router.add_api_route("/v1/files/{file_id}/content", file_content, methods=["GET"], summary="A file's content")
    router.add_api_route("/v1/batches", create_batch, methods=["POST"], summary="Create a batch")
    router.add_api_route("/v1/batches", list_batches, methods=["GET"], summary="List batches")
    router.add_api_route("/v1/batches/{batch_id}", retrieve_batch, methods=["GET"], summary="Retrieve a batch")
    router.add_api_route("/v1/batches/{batch_id}/cancel", cancel_batch, methods=["POST"], summary="Cancel a batch")
    return service


def _check_metadata(metadata: dict[str, str] | None) -> None:
    if metadata is None:
        return
    if len(metadata) > MAX_METADATA_PAIRS:
        raise bad_request(f"metadata holds at most {MAX_METADATA_PAIRS} pairs", "metadata")
    for key, value in metadata.items():
        if len(key) > MAX_METADATA_KEY or len(value) > MAX_METADATA_VALUE:
            raise bad_request(
                f"metadata keys hold at most {MAX_METADATA_KEY} characters and values {MAX_METADATA_VALUE}",
                "metadata",
            )
