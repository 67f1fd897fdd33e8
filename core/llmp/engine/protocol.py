"""Messages between AsyncLLM (front-end) and the engine core, msgpack-encoded with msgspec.

Front-end -> engine: AddRequest, AbortRequests, Utility.
Engine -> front-end: Ready, Outputs, RequestFailed, UtilityResult, SleepState, EngineFailed.

Each engine client has its own pair of sockets: the engine knows the sender of a message by
the socket it came in on, so no message names its client. Client 0 started the engine; it
alone may call the control utilities ``shutdown``, ``attach_client`` (``[input_address,
output_address]`` of another client, which gets ``Ready`` on them; the answer is its index)
and ``detach_client`` (``[index]``; its requests are aborted).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import msgspec

from llmp.inputs import Prompt
from llmp.lora import LoRARequest
from llmp.outputs import (
    ClassificationOutput,
    EmbeddingOutput,
    PoolingOutput,
    PoolingRequestOutput,
    RequestOutput,
    ScoringOutput,
)
from llmp.pooling_params import PoolingParams
from llmp.sampling_params import SamplingParams


class AddRequest(msgspec.Struct, tag=True):
    request_id: str
    prompt: Prompt
    params: SamplingParams
    priority: int = 0
    delta: bool = True
    pooling: PoolingParams | None = None  # a pooling request (params is then ignored)
    lora: LoRARequest | None = None  # the adapter it runs with


class AbortRequests(msgspec.Struct, tag=True):
    request_ids: list[str]


class Utility(msgspec.Struct, tag=True):
    """Call an engine method by name (``ping``, ``stats``) and answer with UtilityResult."""

    call_id: int
    method: str
    args: list[Any] = []


class Ready(msgspec.Struct, tag=True):
    info: dict[str, Any]


class PooledOutput(msgspec.Struct):
    """A :class:`PoolingRequestOutput` as plain data: msgspec cannot decode a union of the output
    dataclasses, so ``kind`` names the class of ``outputs`` and ``data`` holds its value."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    kind: str  # a key of POOLED_KINDS
    data: Any  # a float, a list of floats, or a list of rows
    num_cached_tokens: int = 0

    @classmethod
    def of(cls, output: PoolingRequestOutput) -> PooledOutput:
        kind = type(output.outputs).__name__
        return cls(
            output.request_id,
            output.prompt,
            output.prompt_token_ids,
            kind,
            getattr(output.outputs, dataclasses.fields(output.outputs)[0].name),  # the one field, plain data
            output.num_cached_tokens,
        )

    def rebuild(self) -> PoolingRequestOutput:
        outputs = POOLED_KINDS[self.kind](self.data)
        return PoolingRequestOutput(
            self.request_id, self.prompt, self.prompt_token_ids, outputs, num_cached_tokens=self.num_cached_tokens
        )


POOLED_KINDS = {cls.__name__: cls for cls in (EmbeddingOutput, ClassificationOutput, ScoringOutput, PoolingOutput)}


class Outputs(msgspec.Struct, tag=True):
    outputs: list[RequestOutput]
    pooled: list[PooledOutput] = []


class RequestFailed(msgspec.Struct, tag=True):
    request_id: str
    error_type: str  # SamplingParamsError, RequestValidationError, ValueError, TypeError or LLMPError
    message: str  # re-raised in the caller as error_type(message), or error_type(field, message)
    field: str | None = None  # a RequestValidationError's field


class UtilityResult(msgspec.Struct, tag=True):
    call_id: int
    result: Any = None
    error: str | None = None


class SleepState(msgspec.Struct, tag=True):
    """The engine fell asleep (``level`` 1 or 2) or woke up (``level`` 0); sent to every client, so
    each refuses new requests at once while it sleeps."""

    level: int


class EngineFailed(msgspec.Struct, tag=True):
    """The engine hit an error it cannot recover from; it exits after sending this."""

    message: str


ToEngine = AddRequest | AbortRequests | Utility
FromEngine = Ready | Outputs | RequestFailed | UtilityResult | SleepState | EngineFailed

encoder = msgspec.msgpack.Encoder()
to_engine_decoder = msgspec.msgpack.Decoder(ToEngine)
from_engine_decoder = msgspec.msgpack.Decoder(FromEngine)
