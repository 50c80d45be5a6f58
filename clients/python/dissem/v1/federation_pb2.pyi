from dissem.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FederatedObject(_message.Message):
    __slots__ = ("origin_cluster", "origin_id", "message_id", "data", "metadata", "priority", "external_id", "received_unix_ms", "expires_unix_ms")
    ORIGIN_CLUSTER_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    EXTERNAL_ID_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    origin_cluster: str
    origin_id: _common_pb2.ObjectId
    message_id: str
    data: bytes
    metadata: _containers.RepeatedCompositeFieldContainer[_common_pb2.Attribute]
    priority: int
    external_id: str
    received_unix_ms: int
    expires_unix_ms: int
    def __init__(self, origin_cluster: _Optional[str] = ..., origin_id: _Optional[_Union[_common_pb2.ObjectId, _Mapping]] = ..., message_id: _Optional[str] = ..., data: _Optional[bytes] = ..., metadata: _Optional[_Iterable[_Union[_common_pb2.Attribute, _Mapping]]] = ..., priority: _Optional[int] = ..., external_id: _Optional[str] = ..., received_unix_ms: _Optional[int] = ..., expires_unix_ms: _Optional[int] = ...) -> None: ...

class Standby(_message.Message):
    __slots__ = ("epoch", "origin_node", "finished_below")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_NODE_FIELD_NUMBER: _ClassVar[int]
    FINISHED_BELOW_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    origin_node: int
    finished_below: int
    def __init__(self, epoch: _Optional[int] = ..., origin_node: _Optional[int] = ..., finished_below: _Optional[int] = ...) -> None: ...

class SpilledDelivery(_message.Message):
    __slots__ = ("object", "subscription_id", "tenant", "name", "reason")
    OBJECT_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    object: FederatedObject
    subscription_id: int
    tenant: str
    name: str
    reason: str
    def __init__(self, object: _Optional[_Union[FederatedObject, _Mapping]] = ..., subscription_id: _Optional[int] = ..., tenant: _Optional[str] = ..., name: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class FederateRequest(_message.Message):
    __slots__ = ("from_cluster", "objects", "standby", "spilled")
    FROM_CLUSTER_FIELD_NUMBER: _ClassVar[int]
    OBJECTS_FIELD_NUMBER: _ClassVar[int]
    STANDBY_FIELD_NUMBER: _ClassVar[int]
    SPILLED_FIELD_NUMBER: _ClassVar[int]
    from_cluster: str
    objects: _containers.RepeatedCompositeFieldContainer[FederatedObject]
    standby: Standby
    spilled: _containers.RepeatedCompositeFieldContainer[SpilledDelivery]
    def __init__(self, from_cluster: _Optional[str] = ..., objects: _Optional[_Iterable[_Union[FederatedObject, _Mapping]]] = ..., standby: _Optional[_Union[Standby, _Mapping]] = ..., spilled: _Optional[_Iterable[_Union[SpilledDelivery, _Mapping]]] = ...) -> None: ...

class FederateResponse(_message.Message):
    __slots__ = ("stored", "duplicates", "superseded", "epoch", "unclaimed")
    STORED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    SUPERSEDED_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    UNCLAIMED_FIELD_NUMBER: _ClassVar[int]
    stored: int
    duplicates: int
    superseded: bool
    epoch: int
    unclaimed: int
    def __init__(self, stored: _Optional[int] = ..., duplicates: _Optional[int] = ..., superseded: _Optional[bool] = ..., epoch: _Optional[int] = ..., unclaimed: _Optional[int] = ...) -> None: ...

class LinksRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class LinkInfo(_message.Message):
    __slots__ = ("name", "peer", "mode", "ttl_ms", "has_filter", "has_token", "owed", "sent", "acked", "deduplicated", "lag_seconds", "added", "unclaimed")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    HAS_FILTER_FIELD_NUMBER: _ClassVar[int]
    HAS_TOKEN_FIELD_NUMBER: _ClassVar[int]
    OWED_FIELD_NUMBER: _ClassVar[int]
    SENT_FIELD_NUMBER: _ClassVar[int]
    ACKED_FIELD_NUMBER: _ClassVar[int]
    DEDUPLICATED_FIELD_NUMBER: _ClassVar[int]
    LAG_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ADDED_FIELD_NUMBER: _ClassVar[int]
    UNCLAIMED_FIELD_NUMBER: _ClassVar[int]
    name: str
    peer: str
    mode: str
    ttl_ms: int
    has_filter: bool
    has_token: bool
    owed: int
    sent: int
    acked: int
    deduplicated: int
    lag_seconds: float
    added: bool
    unclaimed: int
    def __init__(self, name: _Optional[str] = ..., peer: _Optional[str] = ..., mode: _Optional[str] = ..., ttl_ms: _Optional[int] = ..., has_filter: _Optional[bool] = ..., has_token: _Optional[bool] = ..., owed: _Optional[int] = ..., sent: _Optional[int] = ..., acked: _Optional[int] = ..., deduplicated: _Optional[int] = ..., lag_seconds: _Optional[float] = ..., added: _Optional[bool] = ..., unclaimed: _Optional[int] = ...) -> None: ...

class AddLinkRequest(_message.Message):
    __slots__ = ("name", "peer", "mode", "ttl_ms", "token", "filter")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    name: str
    peer: str
    mode: str
    ttl_ms: int
    token: str
    filter: str
    def __init__(self, name: _Optional[str] = ..., peer: _Optional[str] = ..., mode: _Optional[str] = ..., ttl_ms: _Optional[int] = ..., token: _Optional[str] = ..., filter: _Optional[str] = ...) -> None: ...

class RemoveLinkRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class RemoveLinkResponse(_message.Message):
    __slots__ = ("dropped",)
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    dropped: int
    def __init__(self, dropped: _Optional[int] = ...) -> None: ...

class LinksResponse(_message.Message):
    __slots__ = ("cluster", "links", "role", "epoch", "standby_copies", "primary_seen_unix_ms")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    LINKS_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    STANDBY_COPIES_FIELD_NUMBER: _ClassVar[int]
    PRIMARY_SEEN_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    links: _containers.RepeatedCompositeFieldContainer[LinkInfo]
    role: str
    epoch: int
    standby_copies: int
    primary_seen_unix_ms: int
    def __init__(self, cluster: _Optional[str] = ..., links: _Optional[_Iterable[_Union[LinkInfo, _Mapping]]] = ..., role: _Optional[str] = ..., epoch: _Optional[int] = ..., standby_copies: _Optional[int] = ..., primary_seen_unix_ms: _Optional[int] = ...) -> None: ...

class PromoteRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PromoteResponse(_message.Message):
    __slots__ = ("epoch", "disseminated", "expired")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    DISSEMINATED_FIELD_NUMBER: _ClassVar[int]
    EXPIRED_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    disseminated: int
    expired: int
    def __init__(self, epoch: _Optional[int] = ..., disseminated: _Optional[int] = ..., expired: _Optional[int] = ...) -> None: ...
