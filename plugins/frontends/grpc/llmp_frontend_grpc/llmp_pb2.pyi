from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ChatMessage(_message.Message):
    __slots__ = ("role", "content")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ...) -> None: ...

class Chat(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ...) -> None: ...

class TokenIds(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("model", "text", "token_ids", "chat", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "ignore_eos", "add_special_tokens")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    CHAT_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    ADD_SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    model: str
    text: str
    token_ids: TokenIds
    chat: Chat
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    seed: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    ignore_eos: bool
    add_special_tokens: bool
    def __init__(self, model: _Optional[str] = ..., text: _Optional[str] = ..., token_ids: _Optional[_Union[TokenIds, _Mapping]] = ..., chat: _Optional[_Union[Chat, _Mapping]] = ..., max_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., seed: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., ignore_eos: _Optional[bool] = ..., add_special_tokens: _Optional[bool] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("prompt_tokens", "completion_tokens", "total_tokens")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., total_tokens: _Optional[int] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("text", "token_ids", "finish_reason", "stop_reason", "usage", "model")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    STOP_REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    finish_reason: str
    stop_reason: str
    usage: Usage
    model: str
    def __init__(self, text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., finish_reason: _Optional[str] = ..., stop_reason: _Optional[str] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., model: _Optional[str] = ...) -> None: ...

class TokenizeRequest(_message.Message):
    __slots__ = ("model", "text", "chat", "add_special_tokens")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    CHAT_FIELD_NUMBER: _ClassVar[int]
    ADD_SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    model: str
    text: str
    chat: Chat
    add_special_tokens: bool
    def __init__(self, model: _Optional[str] = ..., text: _Optional[str] = ..., chat: _Optional[_Union[Chat, _Mapping]] = ..., add_special_tokens: _Optional[bool] = ...) -> None: ...

class TokenizeResponse(_message.Message):
    __slots__ = ("token_ids", "count", "max_model_len")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    count: int
    max_model_len: int
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., count: _Optional[int] = ..., max_model_len: _Optional[int] = ...) -> None: ...

class ListModelsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Model(_message.Message):
    __slots__ = ("id", "root", "max_model_len")
    ID_FIELD_NUMBER: _ClassVar[int]
    ROOT_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    id: str
    root: str
    max_model_len: int
    def __init__(self, id: _Optional[str] = ..., root: _Optional[str] = ..., max_model_len: _Optional[int] = ...) -> None: ...

class ListModelsResponse(_message.Message):
    __slots__ = ("models",)
    MODELS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[Model]
    def __init__(self, models: _Optional[_Iterable[_Union[Model, _Mapping]]] = ...) -> None: ...

class HealthRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HealthResponse(_message.Message):
    __slots__ = ("status",)
    class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        UNKNOWN: _ClassVar[HealthResponse.Status]
        SERVING: _ClassVar[HealthResponse.Status]
    UNKNOWN: HealthResponse.Status
    SERVING: HealthResponse.Status
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: HealthResponse.Status
    def __init__(self, status: _Optional[_Union[HealthResponse.Status, str]] = ...) -> None: ...
