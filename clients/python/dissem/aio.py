"""The asyncio client (``grpc.aio``): the same verbs as :class:`dissem.Client`, awaited."""

from __future__ import annotations

import asyncio
from typing import AsyncIterator, Iterable, List, Mapping, Optional, Union

import grpc
import grpc.aio

from dissem import _common as c
from dissem.v1 import (admin_pb2, admin_pb2_grpc, ingest_pb2_grpc, stream_pb2,
                       stream_pb2_grpc, subscriptions_pb2, subscriptions_pb2_grpc)


class AsyncClient:
    """A connection to one dissem node for asyncio code; arguments as :class:`dissem.Client`.
    Use ``async with AsyncClient(...) as client:`` or ``await client.close()``."""

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
            self._channel = grpc.aio.insecure_channel(
                self._conn.target, options=self._conn.options()
            )
        else:
            self._channel = grpc.aio.secure_channel(
                self._conn.target, self._conn.credentials(), options=self._conn.options()
            )
        self._timeout = timeout
        self._ingest = ingest_pb2_grpc.IngestStub(self._channel)
        self._subs = subscriptions_pb2_grpc.SubscriptionsStub(self._channel)
        self._stream = stream_pb2_grpc.StreamStub(self._channel)
        self._admin = admin_pb2_grpc.AdminStub(self._channel)

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    async def _call(self, method, request):
        try:
            return await method(request, timeout=self._timeout, metadata=self._conn.metadata())
        except grpc.RpcError as e:
            raise c.DissemError.of(e) from None

    async def put(
        self,
        data: bytes = b"",
        attributes: Optional[Mapping[str, c.Value]] = None,
        *,
        priority: int = 0,
        message_id: str = "",
    ) -> c.PutResult:
        req = c.put_request(c.Obj(data, attributes or {}, priority, message_id))
        return c.put_result(await self._call(self._ingest.Put, req))

    async def put_stream(self, objects: Iterable[c.Obj]) -> List[Union[c.PutResult, c.Rejected]]:
        reqs = [c.put_request(o) for o in objects]
        try:
            call = self._ingest.PutStream(iter(reqs), metadata=self._conn.metadata())
            return [c.stream_result(r) async for r in call]
        except grpc.RpcError as e:
            raise c.DissemError.of(e) from None

    async def subscribe(
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
        return await self._call(self._subs.Create, req)

    async def subscription(self, id: int) -> subscriptions_pb2.Subscription:
        return await self._call(self._subs.Get, subscriptions_pb2.GetSubscriptionRequest(id=id))

    async def subscriptions(self) -> List[subscriptions_pb2.Subscription]:
        out: List[subscriptions_pb2.Subscription] = []
        after = 0
        while True:
            r = await self._call(
                self._subs.List,
                subscriptions_pb2.ListSubscriptionsRequest(after_id=after, limit=1000),
            )
            out.extend(r.subscriptions)
            if not r.subscriptions or r.next_after_id == 0:
                return out
            after = r.next_after_id

    async def unsubscribe(self, id: int) -> None:
        await self._call(self._subs.Delete, subscriptions_pb2.DeleteSubscriptionRequest(id=id))

    def attach(self, stream: str) -> "AsyncStreamSession":
        """Attaches to ``stream``: ``async for d in session`` and ``await session.ack(d)``."""
        return AsyncStreamSession(self._stream, stream, self._conn.metadata())

    async def dead_letters(self, limit: int = 100) -> List[admin_pb2.DeadLetter]:
        r = await self._call(self._admin.DeadLetters, admin_pb2.DeadLettersRequest(limit=limit))
        return list(r.dead_letters)

    async def redrive(
        self, dead_letters: Optional[Iterable[admin_pb2.DeadLetter]] = None, *, all: bool = False
    ) -> int:
        if (dead_letters is None) == (not all):
            raise ValueError("redrive: give dead_letters or all=True (not both)")
        req = admin_pb2.RedriveRequest(
            dead_letters=c.dead_letter_refs(dead_letters or []), all=all
        )
        return (await self._call(self._admin.Redrive, req)).redriven


class AsyncStreamSession:
    """One attached stream for asyncio code: an async iterator of :class:`dissem.Delivery`."""

    def __init__(self, stub: stream_pb2_grpc.StreamStub, stream: str, metadata):
        self._outbox: "asyncio.Queue[Optional[stream_pb2.StreamClientMessage]]" = asyncio.Queue()
        self._outbox.put_nowait(stream_pb2.StreamClientMessage(attach=stream))
        self._closed = False
        self._call = stub.Open(self._requests(), metadata=metadata)

    async def _requests(self):
        while True:
            m = await self._outbox.get()
            if m is None:
                return
            yield m

    async def __aenter__(self) -> "AsyncStreamSession":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __aiter__(self) -> AsyncIterator[c.Delivery]:
        return self

    async def __anext__(self) -> c.Delivery:
        try:
            d = await self._call.read()
        except grpc.RpcError as e:
            if self._closed and e.code() == grpc.StatusCode.CANCELLED:
                raise StopAsyncIteration from None
            raise c.DissemError.of(e) from None
        except asyncio.CancelledError:
            if self._closed:
                raise StopAsyncIteration from None
            raise
        if d is grpc.aio.EOF:
            raise StopAsyncIteration
        return c.Delivery.of(d)

    async def ack(self, delivery: Union[c.Delivery, str]) -> None:
        d = delivery if isinstance(delivery, str) else delivery.delivery_id
        if self._closed:
            raise ValueError("ack: the stream session is closed")
        await self._outbox.put(stream_pb2.StreamClientMessage(ack=d))

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._outbox.put(None)
        self._call.cancel()
