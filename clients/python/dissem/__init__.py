"""dissem's Python client: put objects, subscribe with content filters, attach to streams
and ack deliveries, redrive dead letters; synchronous (:class:`Client`) or asyncio
(:class:`AsyncClient`). The generated stubs of the whole public API are in ``dissem.v1``.

    from dissem import Client
    with Client("http://127.0.0.1:7700") as c:
        sub = c.subscribe("temp > 30", stream="alerts")
        with c.attach("alerts") as s:
            c.put(b"hot", {"temp": 35})
            d = next(iter(s))
            s.ack(d)
"""

from dissem._common import (Delivery, DissemError, Obj, PutResult, Rejected, Value)
from dissem.aio import AsyncClient, AsyncStreamSession
from dissem.client import Client, StreamSession

__all__ = [
    "AsyncClient",
    "AsyncStreamSession",
    "Client",
    "Delivery",
    "DissemError",
    "Obj",
    "PutResult",
    "Rejected",
    "StreamSession",
    "Value",
]

__version__ = "0.1.0"
