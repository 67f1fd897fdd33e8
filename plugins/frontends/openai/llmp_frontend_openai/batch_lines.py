"""Batch input files: JSONL lines ``{"custom_id", "method": "POST", "url", "body"}``, checked as
OpenAI checks them when a batch is validated (its error codes: ``invalid_json_line``,
``missing_required_parameter``, ``duplicate_custom_id``, ``url_mismatch``, ``empty_file``,
``too_many_tasks``). A file with any such problem fails as a whole, with every problem listed by
line; what is wrong inside a request's ``body`` is that line's own error, found when it runs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

# the routes a line may name (vLLM's run-batch set); each only where the model serves it
BATCH_URLS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/score", "/v1/rerank")
MAX_REPORTED_ERRORS = 100  # a file broken on every line need not list each


@dataclass(frozen=True, slots=True)
class BatchLine:
    line: int  # 1-based, as the error list names it
    custom_id: str
    url: str
    body: dict[str, Any]


def batch_error(code: str, message: str, line: int | None = None, param: str | None = None) -> dict[str, Any]:
    """One entry of a batch's ``errors.data`` (OpenAI's BatchError)."""
    return {"code": code, "message": message, "param": param, "line": line}


def count_lines(content: bytes) -> int:
    """The request lines of a file: its non-blank lines."""
    return sum(1 for line in content.splitlines() if line.strip())


def parse_batch_file(
    content: bytes, *, endpoint: str | None, served: tuple[str, ...], max_lines: int | None = None
) -> tuple[list[BatchLine], list[dict[str, Any]]]:
    """The lines of a batch file, and its problems (an empty list when it can run).

    ``endpoint``: the batch's; every line must name it (``None``: any of ``served``, as
    ``llmp run-batch`` takes mixed files). ``served``: the batch URLs this server has routes for."""
    lines: list[BatchLine] = []
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()
    for number, raw in enumerate(content.splitlines(), start=1):
        if not raw.strip():
            continue
        problem, line = _parse_line(raw, number, endpoint, served)
        if problem is None and line.custom_id in seen:
            problem = batch_error(
                "duplicate_custom_id",
                f"The custom_id {line.custom_id!r} is a duplicate of another request's. "
                "The custom_id parameter must be unique for each request in a batch.",
                number,
                "custom_id",
            )
        if problem is not None:
            errors.append(problem)
            continue
        seen.add(line.custom_id)
        lines.append(line)
    total = len(lines) + len(errors)
    if total == 0:
        errors.append(batch_error("empty_file", "The batch input file is empty."))
    if max_lines is not None and total > max_lines:
        errors.insert(
            0,
            batch_error(
                "too_many_tasks",
                f"The batch input file holds {total} requests; at most {max_lines} are allowed (--max-batch-lines).",
            ),
        )
    return lines, errors[:MAX_REPORTED_ERRORS]


def _parse_line(
    raw: bytes, number: int, endpoint: str | None, served: tuple[str, ...]
) -> tuple[dict[str, Any] | None, Any]:
    try:
        data = json.loads(raw)
    except ValueError:
        return batch_error("invalid_json_line", "This line is not parseable as valid JSON.", number), None
    if not isinstance(data, dict):
        return batch_error("invalid_json_line", "This line is not a JSON object.", number), None
    for name in ("custom_id", "method", "url", "body"):
        if data.get(name) is None:
            return batch_error(
                "missing_required_parameter", f"Missing required parameter: {name!r}.", number, name
            ), None
    custom_id, method, url, body = data["custom_id"], data["method"], data["url"], data["body"]
    if not isinstance(custom_id, str) or not custom_id:
        return batch_error("invalid_request", "custom_id must be a non-empty string.", number, "custom_id"), None
    if method != "POST":
        return batch_error("invalid_method", f"The method must be 'POST', not {method!r}.", number, "method"), None
    if endpoint is not None and url != endpoint:
        message = f"The URL {url!r} of this request does not match the batch's endpoint {endpoint!r}."
        return batch_error("url_mismatch", message, number, "url"), None
    if url not in served:
        served_text = ", ".join(served) or "none"
        message = f"The URL {url!r} cannot run in a batch here; these can: {served_text}."
        return batch_error("invalid_url", message, number, "url"), None
    if not isinstance(body, dict):
        return batch_error("invalid_request", "body must be a JSON object.", number, "body"), None
    unknown = sorted(set(data) - {"custom_id", "method", "url", "body"})
    if unknown:
        message = f"Unknown field(s) in the request line: {', '.join(unknown)}."
        return batch_error("invalid_request", message, number, unknown[0]), None
    return None, BatchLine(number, custom_id, url, body)
