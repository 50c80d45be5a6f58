from dissem.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PutRequest(_message.Message):
    __slots__ = ("data", "metadata", "priority", "message_id")
    DATA_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    metadata: _containers.RepeatedCompositeFieldContainer[_common_pb2.Attribute]
    priority: int
    message_id: str
    def __init__(self, data: _Optional[bytes] = ..., metadata: _Optional[_Iterable[_Union[_common_pb2.Attribute, _Mapping]]] = ..., priority: _Optional[int] = ..., message_id: _Optional[str] = ...) -> None: ...

class AnnounceRequest(_message.Message):
    __slots__ = ("external_id", "metadata", "priority", "message_id")
    EXTERNAL_ID_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    external_id: str
    metadata: _containers.RepeatedCompositeFieldContainer[_common_pb2.Attribute]
    priority: int
    message_id: str
    def __init__(self, external_id: _Optional[str] = ..., metadata: _Optional[_Iterable[_Union[_common_pb2.Attribute, _Mapping]]] = ..., priority: _Optional[int] = ..., message_id: _Optional[str] = ...) -> None: ...

class PutResponse(_message.Message):
    __slots__ = ("id", "duplicate")
    ID_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    id: _common_pb2.ObjectId
    duplicate: bool
    def __init__(self, id: _Optional[_Union[_common_pb2.ObjectId, _Mapping]] = ..., duplicate: _Optional[bool] = ...) -> None: ...

class PutStreamResponse(_message.Message):
    __slots__ = ("ok", "rejected")
    OK_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    ok: PutResponse
    rejected: Rejection
    def __init__(self, ok: _Optional[_Union[PutResponse, _Mapping]] = ..., rejected: _Optional[_Union[Rejection, _Mapping]] = ...) -> None: ...

class Rejection(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...
