"""Errors as HTTP responses, in the OpenAI shape ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

import re
from http import HTTPStatus
from typing import Any

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")

ERROR_TYPES = {
    400: "invalid_request_error",
    408: "timeout_error",
    409: "invalid_request_error",  # a conflict with the current state (OpenAI: cancelling a finished batch)
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    431: "invalid_request_error",
    500: "internal_server_error",
    501: "not_implemented_error",
    503: "service_unavailable_error",
}


class APIError(Exception):
    """A failure to report to the client: front-end handlers raise it, the server renders it."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        type: str | None = None,
        code: str | int | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.type = type or ERROR_TYPES.get(status, HTTPStatus(status).phrase)
        self.code = code if code is not None else status
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param=param)


class RequestTimeoutError(APIError):
    """A request ran or waited longer than ``--request-timeout``; the engine has aborted it."""

    def __init__(self, timeout: float) -> None:
        super().__init__(
            408,
            f"the request took longer than the server's limit of {timeout:g} s (--request-timeout) and was aborted",
            code="request_timeout",
        )


def as_api_error(exc: BaseException) -> APIError:
    """How any failure of a request is reported: bad input 400 (naming the field of a
    :class:`~llmp.api.RequestValidationError`), a LoRA adapter that is not there 404, a dead or
    sleeping engine 503, else 500."""
    from llmp.api import EngineDeadError, EngineSleepingError, LoRAAdapterNotFoundError, RequestValidationError

    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, LoRAAdapterNotFoundError):
        return APIError(404, str(exc), param="model", type="NotFoundError")
    if isinstance(exc, RequestValidationError):
        return APIError(400, str(exc), param=exc.field)
    if isinstance(exc, ValueError | TypeError):
        return APIError(400, str(exc))
    if isinstance(exc, EngineDeadError):
        return APIError(503, f"the engine is not running: {exc}")
    if isinstance(exc, EngineSleepingError):
        return APIError(503, str(exc), code="engine_sleeping")
    return APIError(500, "Internal server error")


def error_body(message: str, type: str, param: str | None = None, code: str | int | None = None) -> dict[str, Any]:
    """The OpenAI error object; memory addresses in messages are not the client's business."""
    return {"error": {"message": _ADDRESS.sub("", message), "type": type, "param": param, "code": code}}


_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "bytes", "list", "dict", "tuple", "set", "none"})


def _union_tag(part: Any) -> bool:
    """A part of pydantic's error location naming the member of a union it tried (``str``,
    ``list[int]``, ``function-after[...]``, a model's class name), not a field of the request."""
    if not isinstance(part, str) or not part:
        return False
    return part[0].isupper() or "[" in part or part.startswith("function-") or part in _TYPE_TAGS


def validation_message(errors: list[dict[str, Any]]) -> tuple[str, str | None]:
    """One line from pydantic's errors, and the first offending field as ``param``."""
    parts, param = [], None
    for err in errors:
        if err.get("type") == "json_invalid":  # its loc holds the byte offset, not a field
            offset = [p for p in err.get("loc", ()) if p != "body"]
            at = f" at byte {offset[0]}" if offset else ""
            parts.append(f"the body is not valid JSON{at}: {err.get('ctx', {}).get('error', err.get('msg', ''))}")
            continue
        loc = [str(p) for p in err.get("loc", ()) if p != "body" and not _union_tag(p)]
        where = ".".join(loc) or "body"
        param = param or (where if loc else None)
        parts.append(f"{where}: {err.get('msg', 'invalid')}" + (f" ({err['type']})" if err.get("type") else ""))
    return "; ".join(parts) or "invalid request", param
