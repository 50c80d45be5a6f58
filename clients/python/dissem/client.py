"""The synchronous client: one channel to a node, the verbs a producer, a subscriber and an
operator use (put, put_stream, subscribe, attach with acks, dead letters and redrive)."""

from __future__ import annotations

import queue
import threading
from typing import Iterable, Iterator, List, Mapping, Optional, Union

import grpc

from dissem import _common as c
from dissem.v1 import (admin_pb2, admin_pb2_grpc, ingest_pb2_grpc, stream_pb2,
                       stream_pb2_grpc, subscriptions_pb2, subscriptions_pb2_grpc)


class Client:
    """A connection to one dissem node.

    ``url`` is ``http://host:port`` or ``https://host:port`` (default: ``DISSEM_NODE_URL``,
    else ``http://127.0.0.1:7700``); ``token`` is sent as ``authorization: Bearer``
    (default: ``DISSEM_TOKEN``); ``tls_ca`` is a PEM file the node's certificate is verified
    against (default: ``DISSEM_TLS_CA``; an ``https://`` url without it uses the system's
    roots). Every call waits at most ``timeout`` seconds, streams excepted. A refused call
    raises :class:`dissem.DissemError`.
    """

    def __init__(
        self,
        url: Optional[str] = None,
        *,
        token: Optional[str] = None,
        tls_ca: Optional[str] = None,
        timeout: float = 30.0,
    ):
        self._conn = c.Connection.make(url, token, tls_ca)
        if self._conn.root_certificates is None:
            self._channel = grpc.insecure_channel(self._conn.target, options=self._conn.options())
        else:
            self._channel = grpc.secure_channel(
                self._conn.target, self._conn.credentials(), options=self._conn.options()
            )
        self._timeout = timeout
        self._ingest = ingest_pb2_grpc.IngestStub(self._channel)
        self._subs = subscriptions_pb2_grpc.SubscriptionsStub(self._channel)
        self._stream = stream_pb2_grpc.StreamStub(self._channel)
        self._admin = admin_pb2_grpc.AdminStub(self._channel)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    def _call(self, method, request):
        try:
            return method(request, timeout=self._timeout, metadata=self._conn.metadata())
        except grpc.RpcError as e:
            raise c.DissemError.of(e) from None

    # producing

    def put(
        self,
        data: bytes = b"",
        attributes: Optional[Mapping[str, c.Value]] = None,
        *,
        priority: int = 0,
        message_id: str = "",
    ) -> c.PutResult:
        """Stores one object; returns once it is durable (and replicated, in a cluster)."""
        req = c.put_request(c.Obj(data, attributes or {}, priority, message_id))
        return c.put_result(self._call(self._ingest.Put, req))

    def put_stream(self, objects: Iterable[c.Obj]) -> List[Union[c.PutResult, c.Rejected]]:
        """Puts many objects over one stream (pipelined); one result per object, in order: a
        :class:`PutResult`, or a :class:`Rejected` for an object the node refused."""
        reqs = [c.put_request(o) for o in objects]
        try:
            replies = self._ingest.PutStream(iter(reqs), metadata=self._conn.metadata())
            return [c.stream_result(r) for r in replies]
        except grpc.RpcError as e:
            raise c.DissemError.of(e) from None

    # subscribing

    def subscribe(
        self,
        filter: str,
        *,
        stream: Optional[str] = None,
        grpc: Optional[str] = None,
        webhook: Optional[str] = None,
        qos: str = "at_least_once",
        name: str = "",
        eventbridge: bool = False,
        priority: int = 0,
        ordered: bool = False,
        max_attempts: int = 0,
        ttl_ms: int = 0,
    ) -> subscriptions_pb2.Subscription:
        """Creates a subscription: ``filter`` in dissem's filter language (or an EventBridge
        pattern with ``eventbridge=True``), to exactly one target: a ``stream`` name to
        :meth:`attach` to, a ``grpc`` subscriber URL or a ``webhook`` URL. ``max_attempts``
        and ``ttl_ms`` bound its retries (0: the node's defaults) before a dead letter."""
        s = c.subscription(
            filter,
            stream=stream,
            grpc_url=grpc,
            webhook=webhook,
            qos=qos,
            name=name,
            eventbridge=eventbridge,
            priority=priority,
            ordered=ordered,
            max_attempts=max_attempts,
            ttl_ms=ttl_ms,
        )
        req = subscriptions_pb2.CreateSubscriptionRequest(subscription=s)
        return self._call(self._subs.Create, req)

    def subscription(self, id: int) -> subscriptions_pb2.Subscription:
        return self._call(self._subs.Get, subscriptions_pb2.GetSubscriptionRequest(id=id))

    def subscriptions(self) -> List[subscriptions_pb2.Subscription]:
        """Every subscription the token may see, page by page."""
        out: List[subscriptions_pb2.Subscription] = []
        after = 0
        while True:
            r = self._call(
                self._subs.List,
                subscriptions_pb2.ListSubscriptionsRequest(after_id=after, limit=1000),
            )
            out.extend(r.subscriptions)
            if not r.subscriptions or r.next_after_id == 0:
                return out
            after = r.next_after_id

    def unsubscribe(self, id: int) -> None:
        self._call(self._subs.Delete, subscriptions_pb2.DeleteSubscriptionRequest(id=id))

    def attach(self, stream: str) -> "StreamSession":
        """Attaches to the stream ``stream``: iterate the session for deliveries and ack each
        one handled (``session.ack(d)``); close it (or use ``with``) when done."""
        return StreamSession(self._stream, stream, self._conn.metadata())

    # operating

    def dead_letters(self, limit: int = 100) -> List[admin_pb2.DeadLetter]:
        r = self._call(self._admin.DeadLetters, admin_pb2.DeadLettersRequest(limit=limit))
        return list(r.dead_letters)

    def redrive(
        self, dead_letters: Optional[Iterable[admin_pb2.DeadLetter]] = None, *, all: bool = False
    ) -> int:
        """Puts dead letters back to pending: those given, or every one with ``all=True``;
        returns how many."""
        if (dead_letters is None) == (not all):
            raise ValueError("redrive: give dead_letters or all=True (not both)")
        req = admin_pb2.RedriveRequest(
            dead_letters=c.dead_letter_refs(dead_letters or []), all=all
        )
        return self._call(self._admin.Redrive, req).redriven


class StreamSession:
    """One attached stream: an iterator of :class:`dissem.Delivery`. A delivery not acked
    comes again (after the node's retry backoff, or to the next session)."""

    def __init__(self, stub: stream_pb2_grpc.StreamStub, stream: str, metadata):
        self._outbox: "queue.Queue[Optional[stream_pb2.StreamClientMessage]]" = queue.Queue()
        self._outbox.put(stream_pb2.StreamClientMessage(attach=stream))
        self._lock = threading.Lock()
        self._closed = False
        self._call = stub.Open(iter(self._outbox.get, None), metadata=metadata)

    def __enter__(self) -> "StreamSession":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[c.Delivery]:
        return self

    def __next__(self) -> c.Delivery:
        try:
            return c.Delivery.of(next(self._call))
        except grpc.RpcError as e:
            if self._closed and e.code() == grpc.StatusCode.CANCELLED:
                raise StopIteration from None
            raise c.DissemError.of(e) from None

    def ack(self, delivery: Union[c.Delivery, str]) -> None:
        """Acknowledges a delivery (or its id): the node does not send it again."""
        d = delivery if isinstance(delivery, str) else delivery.delivery_id
        with self._lock:
            if self._closed:
                raise ValueError("ack: the stream session is closed")
            self._outbox.put(stream_pb2.StreamClientMessage(ack=d))

    def close(self) -> None:
        """Ends the call (unacked deliveries come again)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._outbox.put(None)
        self._call.cancel()
