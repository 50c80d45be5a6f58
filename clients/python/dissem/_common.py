"""What the sync and async clients share: the target and credentials, attribute values,
request building and errors. Kept apart so both clients say the same thing the same way."""

from __future__ import annotations

import decimal
import os
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Optional, Sequence, Tuple, Union

import grpc

from dissem.v1 import (admin_pb2, common_pb2, ingest_pb2, subscriber_pb2,
                       subscriptions_pb2)

#: An attribute value as Python writes it: an integer, a float, a string, or a Decimal.
Value = Union[int, float, str, decimal.Decimal]

#: Every subscription's QoS by the name the CLI and the docs use.
QOS = {
    "at_least_once": subscriptions_pb2.QOS_AT_LEAST_ONCE,
    "exactly_once": subscriptions_pb2.QOS_EXACTLY_ONCE,
    "at_most_once": subscriptions_pb2.QOS_AT_MOST_ONCE,
}

#: The largest message the client accepts from a node (a delivery carries an object).
MAX_MESSAGE = 64 << 20


class DissemError(Exception):
    """A call the node refused or could not answer: ``code`` is the gRPC status name
    (``NOT_FOUND``, ``INVALID_ARGUMENT``, ``UNAUTHENTICATED``, ``UNAVAILABLE``...) and the
    message is the node's own."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message

    @staticmethod
    def of(e: grpc.RpcError) -> "DissemError":
        code = e.code() if hasattr(e, "code") else None
        details = e.details() if hasattr(e, "details") else None
        return DissemError(code.name if code is not None else "UNKNOWN", details or str(e))


@dataclass(frozen=True)
class PutResult:
    """A stored object's id, and whether its message id was seen before (a retry)."""

    node: int
    seq: int
    duplicate: bool = False

    @property
    def id(self) -> str:
        return f"{self.node}:{self.seq}"


@dataclass(frozen=True)
class Rejected:
    """One object of a put stream the node refused (the stream goes on)."""

    code: str
    message: str


@dataclass
class Obj:
    """One object to put: its bytes, attributes, priority 0..=7 and optional message id
    (a retry with the same id is stored once)."""

    data: bytes = b""
    attributes: Mapping[str, Value] = field(default_factory=dict)
    priority: int = 0
    message_id: str = ""


@dataclass(frozen=True)
class Connection:
    """Where a client connects and with what: the gRPC target, TLS root certificates
    (``None``: plain text), and the bearer token (``None``: no header)."""

    target: str
    root_certificates: Optional[bytes]
    token: Optional[str]

    @staticmethod
    def make(url: Optional[str], token: Optional[str], tls_ca: Optional[str]) -> "Connection":
        url = url or os.environ.get("DISSEM_NODE_URL") or "http://127.0.0.1:7700"
        token = token if token is not None else os.environ.get("DISSEM_TOKEN") or None
        tls_ca = tls_ca if tls_ca is not None else os.environ.get("DISSEM_TLS_CA") or None
        secure = url.startswith("https://")
        target = url.split("://", 1)[1] if "://" in url else url
        target = target.rstrip("/")
        if not target:
            raise ValueError(f"url: {url!r} names no host")
        if tls_ca is not None and not secure and "://" in url:
            raise ValueError(f"tls_ca is set but the url {url!r} is not https://")
        roots = None
        if secure or tls_ca is not None:
            if tls_ca is not None:
                with open(tls_ca, "rb") as f:
                    roots = f.read()
            else:
                roots = b""  # the system's roots
        return Connection(target, roots, token)

    def metadata(self) -> Tuple[Tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()

    def options(self) -> Sequence[Tuple[str, int]]:
        return [
            ("grpc.max_receive_message_length", MAX_MESSAGE),
            ("grpc.max_send_message_length", MAX_MESSAGE),
        ]

    def credentials(self) -> grpc.ChannelCredentials:
        assert self.root_certificates is not None
        return grpc.ssl_channel_credentials(self.root_certificates or None)


def value(name: str, v: Value) -> common_pb2.Value:
    """An attribute value as the API takes it; a bool or another type is refused, naming
    the attribute."""
    if isinstance(v, bool):
        raise TypeError(f"attribute {name!r}: a bool is not a value (use 0/1 or a string)")
    if isinstance(v, int):
        return common_pb2.Value(integer=v)
    if isinstance(v, float):
        return common_pb2.Value(number=v)
    if isinstance(v, decimal.Decimal):
        return common_pb2.Value(decimal=str(v))
    if isinstance(v, str):
        return common_pb2.Value(text=v)
    raise TypeError(
        f"attribute {name!r}: {type(v).__name__} is not a value (int, float, str or Decimal)"
    )


def attributes(attrs: Optional[Mapping[str, Value]]) -> list:
    return [common_pb2.Attribute(name=k, value=value(k, v)) for k, v in (attrs or {}).items()]


def from_value(v: common_pb2.Value) -> Value:
    kind = v.WhichOneof("kind")
    if kind == "integer":
        return v.integer
    if kind == "number":
        return v.number
    if kind == "decimal":
        return decimal.Decimal(v.decimal)
    return v.text


def put_request(o: Obj) -> ingest_pb2.PutRequest:
    if not 0 <= o.priority <= 7:
        raise ValueError(f"priority: {o.priority} is not within 0..=7")
    return ingest_pb2.PutRequest(
        data=bytes(o.data),
        metadata=attributes(o.attributes),
        priority=o.priority,
        message_id=o.message_id,
    )


def put_result(r: ingest_pb2.PutResponse) -> PutResult:
    return PutResult(node=r.id.node, seq=r.id.seq, duplicate=r.duplicate)


def stream_result(r: ingest_pb2.PutStreamResponse) -> Union[PutResult, Rejected]:
    if r.WhichOneof("result") == "ok":
        return put_result(r.ok)
    code = grpc.StatusCode.UNKNOWN
    for c in grpc.StatusCode:
        if c.value[0] == r.rejected.code:
            code = c
    return Rejected(code=code.name, message=r.rejected.message)


def subscription(
    filter: str,
    *,
    stream: Optional[str],
    grpc_url: Optional[str],
    webhook: Optional[str],
    qos: str,
    name: str,
    eventbridge: bool,
    priority: int,
    ordered: bool,
    max_attempts: int,
    ttl_ms: int,
) -> subscriptions_pb2.Subscription:
    targets = [t for t in (stream, grpc_url, webhook) if t is not None]
    if len(targets) != 1:
        raise ValueError("target: give exactly one of stream=, grpc=, webhook=")
    if qos not in QOS:
        raise ValueError(f"qos: {qos!r} is not one of {', '.join(QOS)}")
    if stream is not None:
        target = subscriptions_pb2.Target(stream=stream)
    elif grpc_url is not None:
        target = subscriptions_pb2.Target(grpc=grpc_url)
    else:
        target = subscriptions_pb2.Target(webhook=webhook)
    s = subscriptions_pb2.Subscription(
        target=target, qos=QOS[qos], name=name, priority=priority, ordered=ordered
    )
    if max_attempts or ttl_ms:
        s.retry.CopyFrom(subscriptions_pb2.RetryPolicy(max_attempts=max_attempts, ttl_ms=ttl_ms))
    if eventbridge:
        s.eventbridge = filter
    else:
        s.text = filter
    return s


def dead_letter_refs(letters: Iterable[admin_pb2.DeadLetter]) -> list:
    return [
        admin_pb2.DeadLetter(subscription_id=d.subscription_id, object_id=d.object_id)
        for d in letters
    ]


@dataclass(frozen=True)
class Delivery:
    """One delivery from a stream: ack it (``session.ack(d)``) once handled, or it comes
    again. ``attributes`` are the object's metadata as Python values."""

    delivery_id: str
    subscription_id: int
    node: int
    seq: int
    data: bytes
    attributes: Mapping[str, Value]
    priority: int
    attempt: int

    @staticmethod
    def of(d: subscriber_pb2.Delivery) -> "Delivery":
        return Delivery(
            delivery_id=d.delivery_id,
            subscription_id=d.subscription_id,
            node=d.object_id.node,
            seq=d.object_id.seq,
            data=d.data,
            attributes={a.name: from_value(a.value) for a in d.metadata},
            priority=d.priority,
            attempt=d.attempt,
        )
