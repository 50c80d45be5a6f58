from dissem.v1 import subscriber_pb2 as _subscriber_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class StreamClientMessage(_message.Message):
    __slots__ = ("attach", "ack")
    ATTACH_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    attach: str
    ack: str
    def __init__(self, attach: _Optional[str] = ..., ack: _Optional[str] = ...) -> None: ...
