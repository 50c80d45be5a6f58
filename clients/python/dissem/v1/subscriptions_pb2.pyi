from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Qos(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    QOS_UNSPECIFIED: _ClassVar[Qos]
    QOS_AT_LEAST_ONCE: _ClassVar[Qos]
    QOS_EXACTLY_ONCE: _ClassVar[Qos]
    QOS_AT_MOST_ONCE: _ClassVar[Qos]
QOS_UNSPECIFIED: Qos
QOS_AT_LEAST_ONCE: Qos
QOS_EXACTLY_ONCE: Qos
QOS_AT_MOST_ONCE: Qos

class Target(_message.Message):
    __slots__ = ("grpc", "webhook", "stream")
    GRPC_FIELD_NUMBER: _ClassVar[int]
    WEBHOOK_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    grpc: str
    webhook: str
    stream: str
    def __init__(self, grpc: _Optional[str] = ..., webhook: _Optional[str] = ..., stream: _Optional[str] = ...) -> None: ...

class RetryPolicy(_message.Message):
    __slots__ = ("max_attempts", "ttl_ms", "initial_backoff_ms", "max_backoff_ms")
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    INITIAL_BACKOFF_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_BACKOFF_MS_FIELD_NUMBER: _ClassVar[int]
    max_attempts: int
    ttl_ms: int
    initial_backoff_ms: int
    max_backoff_ms: int
    def __init__(self, max_attempts: _Optional[int] = ..., ttl_ms: _Optional[int] = ..., initial_backoff_ms: _Optional[int] = ..., max_backoff_ms: _Optional[int] = ...) -> None: ...

class Subscription(_message.Message):
    __slots__ = ("id", "text", "eventbridge", "target", "qos", "retry", "priority", "webhook_secret", "tenant", "push_batch", "webhook_headers", "name", "ordered", "revision")
    class WebhookHeadersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    EVENTBRIDGE_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    QOS_FIELD_NUMBER: _ClassVar[int]
    RETRY_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    WEBHOOK_SECRET_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    PUSH_BATCH_FIELD_NUMBER: _ClassVar[int]
    WEBHOOK_HEADERS_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ORDERED_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    id: int
    text: str
    eventbridge: str
    target: Target
    qos: Qos
    retry: RetryPolicy
    priority: int
    webhook_secret: str
    tenant: str
    push_batch: int
    webhook_headers: _containers.ScalarMap[str, str]
    name: str
    ordered: bool
    revision: int
    def __init__(self, id: _Optional[int] = ..., text: _Optional[str] = ..., eventbridge: _Optional[str] = ..., target: _Optional[_Union[Target, _Mapping]] = ..., qos: _Optional[_Union[Qos, str]] = ..., retry: _Optional[_Union[RetryPolicy, _Mapping]] = ..., priority: _Optional[int] = ..., webhook_secret: _Optional[str] = ..., tenant: _Optional[str] = ..., push_batch: _Optional[int] = ..., webhook_headers: _Optional[_Mapping[str, str]] = ..., name: _Optional[str] = ..., ordered: _Optional[bool] = ..., revision: _Optional[int] = ...) -> None: ...

class CreateSubscriptionRequest(_message.Message):
    __slots__ = ("subscription",)
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    subscription: Subscription
    def __init__(self, subscription: _Optional[_Union[Subscription, _Mapping]] = ...) -> None: ...

class CreateSubscriptionsRequest(_message.Message):
    __slots__ = ("subscriptions",)
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    subscriptions: _containers.RepeatedCompositeFieldContainer[Subscription]
    def __init__(self, subscriptions: _Optional[_Iterable[_Union[Subscription, _Mapping]]] = ...) -> None: ...

class CreateSubscriptionsResponse(_message.Message):
    __slots__ = ("subscriptions",)
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    subscriptions: _containers.RepeatedCompositeFieldContainer[Subscription]
    def __init__(self, subscriptions: _Optional[_Iterable[_Union[Subscription, _Mapping]]] = ...) -> None: ...

class GetSubscriptionRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: int
    def __init__(self, id: _Optional[int] = ...) -> None: ...

class ListSubscriptionsRequest(_message.Message):
    __slots__ = ("after_id", "limit")
    AFTER_ID_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    after_id: int
    limit: int
    def __init__(self, after_id: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

class ListSubscriptionsResponse(_message.Message):
    __slots__ = ("subscriptions", "next_after_id")
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_AFTER_ID_FIELD_NUMBER: _ClassVar[int]
    subscriptions: _containers.RepeatedCompositeFieldContainer[Subscription]
    next_after_id: int
    def __init__(self, subscriptions: _Optional[_Iterable[_Union[Subscription, _Mapping]]] = ..., next_after_id: _Optional[int] = ...) -> None: ...

class DeleteSubscriptionRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: int
    def __init__(self, id: _Optional[int] = ...) -> None: ...

class DeleteSubscriptionResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
