"""Drives the Python client against a running dissem node (the repository's test
`the_python_client_works_against_dissem_up` starts one): every verb, sync and asyncio, and
the errors a user meets. Usage: check_client.py URL ADMIN_TOKEN. Prints "ok" at the end."""

import asyncio
import sys
import time

from dissem import AsyncClient, Client, DissemError, Obj, PutResult, Rejected

url, token = sys.argv[1], sys.argv[2]


def expect_error(code, f):
    try:
        f()
    except DissemError as e:
        assert e.code == code, f"{code} expected, got {e}"
        return e
    raise AssertionError(f"{code} expected, the call succeeded")


def sync_part():
    with Client(url, token=token, timeout=10) as c:
        sub = c.subscribe("temp > 30", stream="py-sync", name="hot")
        assert sub.id > 0 and sub.name == "hot", sub
        with c.attach("py-sync") as session:
            put = c.put(b"hot", {"temp": 35, "room": "a1", "load": 0.5})
            assert isinstance(put, PutResult) and put.seq > 0, put
            again = c.put(b"hot", {"temp": 35}, message_id="m-1")
            assert c.put(b"hot", {"temp": 35}, message_id="m-1") == PutResult(
                again.node, again.seq, True
            )
            got = []
            for d in session:
                assert d.subscription_id == sub.id and d.data == b"hot", d
                session.ack(d)
                got.append(d)
                if len(got) == 2:
                    break
            # a stream does not promise put order: find the first put's delivery
            first = [d for d in got if (d.node, d.seq) == (put.node, put.seq)]
            assert first and first[0].attributes == {"temp": 35, "room": "a1", "load": 0.5}, got
            assert {(d.node, d.seq) for d in got} == {(put.node, put.seq), (again.node, again.seq)}
        # a put stream: one result per object, a refused one named and the rest stored
        rs = c.put_stream([Obj(b"a", {"temp": 40}), Obj(b"b", {"": 1}), Obj(b"c", {"temp": 1})])
        assert isinstance(rs[0], PutResult) and isinstance(rs[2], PutResult), rs
        assert isinstance(rs[1], Rejected) and rs[1].code == "INVALID_ARGUMENT", rs
        # errors a user meets, named
        e = expect_error("NOT_FOUND", lambda: c.subscription(987654))
        assert "987654" in e.message, e
        expect_error("INVALID_ARGUMENT", lambda: c.subscribe("temp >", stream="x"))
        try:
            c.put(b"", {"flag": True})
            raise AssertionError("a bool attribute was taken")
        except TypeError as e:
            assert "'flag'" in str(e), e
        # a delivery given up on, then redriven
        dead = c.subscribe("temp > 100", grpc="http://127.0.0.1:1", max_attempts=1)
        c.put(b"too hot", {"temp": 101})
        deadline = time.monotonic() + 30
        letters = []
        while not letters:
            assert time.monotonic() < deadline, "no dead letter within 30 s"
            letters = [d for d in c.dead_letters() if d.subscription_id == dead.id]
            time.sleep(0.1)
        assert c.redrive(letters) == 1
        c.unsubscribe(dead.id)
        expect_error("NOT_FOUND", lambda: c.subscription(dead.id))
    with Client(url, timeout=10) as anonymous:
        expect_error("UNAUTHENTICATED", lambda: anonymous.put(b"x"))


async def async_part():
    async with AsyncClient(url, token=token, timeout=10) as c:
        sub = await c.subscribe("temp > 30", stream="py-async")
        async with c.attach("py-async") as session:
            put = await c.put(b"warm", {"temp": 31})
            async for d in session:
                assert d.subscription_id == sub.id and (d.node, d.seq) == (put.node, put.seq), d
                await session.ack(d)
                break
        rs = await c.put_stream([Obj(b"x", {"temp": 50}), Obj(b"y", {"temp": 51})])
        assert all(isinstance(r, PutResult) for r in rs), rs
        ids = {s.id for s in await c.subscriptions()}
        assert sub.id in ids, ids
        try:
            await c.subscription(987654)
            raise AssertionError("NOT_FOUND expected")
        except DissemError as e:
            assert e.code == "NOT_FOUND", e


sync_part()
asyncio.run(async_part())
print("ok")
