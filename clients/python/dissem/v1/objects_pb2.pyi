from dissem.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetObjectRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: _common_pb2.ObjectId
    def __init__(self, id: _Optional[_Union[_common_pb2.ObjectId, _Mapping]] = ...) -> None: ...

class StoredObject(_message.Message):
    __slots__ = ("id", "data", "external_id", "metadata", "priority", "message_id", "received_unix_ms")
    ID_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    EXTERNAL_ID_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    id: _common_pb2.ObjectId
    data: bytes
    external_id: str
    metadata: _containers.RepeatedCompositeFieldContainer[_common_pb2.Attribute]
    priority: int
    message_id: str
    received_unix_ms: int
    def __init__(self, id: _Optional[_Union[_common_pb2.ObjectId, _Mapping]] = ..., data: _Optional[bytes] = ..., external_id: _Optional[str] = ..., metadata: _Optional[_Iterable[_Union[_common_pb2.Attribute, _Mapping]]] = ..., priority: _Optional[int] = ..., message_id: _Optional[str] = ..., received_unix_ms: _Optional[int] = ...) -> None: ...
