from dissem.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Delivery(_message.Message):
    __slots__ = ("delivery_id", "subscription_id", "object_id", "metadata", "data", "priority", "attempt", "redelivered")
    DELIVERY_ID_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_ID_FIELD_NUMBER: _ClassVar[int]
    OBJECT_ID_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    REDELIVERED_FIELD_NUMBER: _ClassVar[int]
    delivery_id: str
    subscription_id: int
    object_id: _common_pb2.ObjectId
    metadata: _containers.RepeatedCompositeFieldContainer[_common_pb2.Attribute]
    data: bytes
    priority: int
    attempt: int
    redelivered: bool
    def __init__(self, delivery_id: _Optional[str] = ..., subscription_id: _Optional[int] = ..., object_id: _Optional[_Union[_common_pb2.ObjectId, _Mapping]] = ..., metadata: _Optional[_Iterable[_Union[_common_pb2.Attribute, _Mapping]]] = ..., data: _Optional[bytes] = ..., priority: _Optional[int] = ..., attempt: _Optional[int] = ..., redelivered: _Optional[bool] = ...) -> None: ...

class DeliveryBatch(_message.Message):
    __slots__ = ("deliveries",)
    DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    deliveries: _containers.RepeatedCompositeFieldContainer[Delivery]
    def __init__(self, deliveries: _Optional[_Iterable[_Union[Delivery, _Mapping]]] = ...) -> None: ...

class Rejected(_message.Message):
    __slots__ = ("index", "reason")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    index: int
    reason: str
    def __init__(self, index: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class DeliverBatchAck(_message.Message):
    __slots__ = ("rejected",)
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    rejected: _containers.RepeatedCompositeFieldContainer[Rejected]
    def __init__(self, rejected: _Optional[_Iterable[_Union[Rejected, _Mapping]]] = ...) -> None: ...

class DeliverAck(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("delivery_id",)
    DELIVERY_ID_FIELD_NUMBER: _ClassVar[int]
    delivery_id: str
    def __init__(self, delivery_id: _Optional[str] = ...) -> None: ...

class ReleaseAck(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
