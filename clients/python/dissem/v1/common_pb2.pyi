from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Value(_message.Message):
    __slots__ = ("decimal", "number", "integer", "text")
    DECIMAL_FIELD_NUMBER: _ClassVar[int]
    NUMBER_FIELD_NUMBER: _ClassVar[int]
    INTEGER_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    decimal: str
    number: float
    integer: int
    text: str
    def __init__(self, decimal: _Optional[str] = ..., number: _Optional[float] = ..., integer: _Optional[int] = ..., text: _Optional[str] = ...) -> None: ...

class Attribute(_message.Message):
    __slots__ = ("name", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: Value
    def __init__(self, name: _Optional[str] = ..., value: _Optional[_Union[Value, _Mapping]] = ...) -> None: ...

class ObjectId(_message.Message):
    __slots__ = ("node", "seq")
    NODE_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    node: int
    seq: int
    def __init__(self, node: _Optional[int] = ..., seq: _Optional[int] = ...) -> None: ...
