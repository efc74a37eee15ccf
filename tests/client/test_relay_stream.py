"""The client's threaded relay stream (svc_sdk/relay_stream.py) against fake relays that
misbehave: each test drives a ``StreamConnection`` from worker threads, as the relay link
does, while the fake relay runs on this module's event loop."""

from __future__ import annotations

import asyncio
import concurrent.futures
import socket
import threading
from collections.abc import AsyncIterator
from typing import Any

import pytest

from svc_sdk._native import RelayChannel, RelayStream
from svc_sdk._relay_pb import relay_pb2 as pb
from svc_sdk.relay_frames import (
    MALFORMED,
    Code,
    Deliveries,
    Event,
    StreamError,
    Unsubscribe,
    decode,
    event,
)
from svc_sdk.relay_stream import StreamConnection

# The fixture too: one event loop for the module, for the fake relays (see its docstring).
from .test_transport import (  # noqa: F401
    deaf_until,
    echo,
    garbage,
    one_loop_for_the_module,
    refuse,
    relay_with,
    serve,
)

pytestmark = pytest.mark.anyio


def _readers() -> int:
    return sum(t.name == "svc-relay-read" for t in threading.enumerate())


def _opened(url: str, frames: list[Event] | None = None) -> StreamConnection:
    got = frames if frames is not None else []
    conn = StreamConnection(url, "token", b"agent", on_frame=got.append)
    conn.open(timeout=10)
    return conn


async def test_requests_from_many_threads_each_get_their_own_reply() -> None:
    async def test(url: str) -> None:
        conn = await asyncio.to_thread(_opened, url)

        def burst(n: int) -> list[int]:
            futures = [conn.send(Unsubscribe(channel="a/b/c")) for _ in range(n)]
            return [f.result(10).request_id for f in futures]

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            ids = await asyncio.wrap_future(
                pool.submit(lambda: [i for r in pool.map(burst, [200] * 8) for i in r])
            )
        assert sorted(ids) == list(range(1, 1601))  # each request its own Reply, none lost
        conn.close()

    await relay_with(echo, test)


async def test_frames_other_than_replies_go_to_the_callback_in_order() -> None:
    async def push(frames: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        for seq in range(1, 51):
            yield pb.ServerFrame(
                deliveries=pb.Deliveries(items=[pb.Delivery(channel="a/b/c", seq=seq)])
            ).SerializeToString()
        async for data in frames:
            request = pb.ClientFrame.FromString(data)
            yield pb.ServerFrame(reply=pb.Reply(request_id=request.request_id)).SerializeToString()

    async def test(url: str) -> None:
        got: list[Event] = []
        conn = await asyncio.to_thread(_opened, url, got)
        # The Reply follows the 50 deliveries on the stream: all were handed over first.
        await asyncio.to_thread(conn.send(Unsubscribe(channel="a/b/c")).result, 10)
        assert [f.items[0].seq for f in got if isinstance(f, Deliveries)] == list(range(1, 51))
        assert len(got) == 50
        conn.close()

    await relay_with(push, test)


async def test_an_unreadable_frame_ends_the_stream_and_fails_waiting_requests() -> None:
    async def test(url: str) -> None:
        conn = await asyncio.to_thread(_opened, url)
        future = conn.send(Unsubscribe(channel="a/b/c"))
        with pytest.raises(StreamError, match="unreadable frame"):
            await asyncio.to_thread(future.result, 10)
        assert conn.ended.is_set()
        assert isinstance(conn.end, StreamError) and conn.end.status == Code.INTERNAL
        with pytest.raises(ConnectionError):
            conn.send(Unsubscribe(channel="a/b/c"))

    await relay_with(garbage, test)


async def test_drained_events_are_the_frames_decoded_up_to_a_malformed_one() -> None:
    """``drain_events()`` gives each frame as ``decode`` reads it, and a malformed frame
    as the MALFORMED pair that ends the list: what the reading thread turns into
    ValueError, and so into the stream's end."""
    items = [pb.Delivery(channel="a/b/c", seq=s, message=b"m" * s) for s in (1, 2)]
    good = [
        pb.ServerFrame(reply=pb.Reply(request_id=7, seq=3)).SerializeToString(),
        pb.ServerFrame(deliveries=pb.Deliveries(items=items)).SerializeToString(),
        pb.ServerFrame(welcome=pb.Welcome(channel="a/b/c", welcome=b"w")).SerializeToString(),
    ]

    async def push(frames: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        for frame in [*good, b"\xff\xff\xff", good[0]]:
            yield frame
        async for _ in frames:
            pass

    async def test(url: str) -> None:
        stream = RelayStream(RelayChannel(url), [])
        try:
            got: list[tuple[int, Any]] = []
            for _ in range(1000):
                got += stream.drain_events()[2]
                if got and got[-1][0] == MALFORMED:
                    break
                await asyncio.sleep(0.01)
            assert [event(e) for e in got[:-1]] == [decode(f) for f in good]
            kind, message = got[-1]
            assert kind == MALFORMED and message.startswith("malformed ServerFrame")
            with pytest.raises(ValueError, match="malformed ServerFrame"):
                event(got[-1])
        finally:
            stream.close()

    await relay_with(push, test)


async def test_a_refusal_keeps_the_relays_status() -> None:
    server, port = await serve(refuse, accept=False)
    try:
        conn = StreamConnection(f"127.0.0.1:{port}", "token", b"agent", on_frame=print)
        try:  # refused before or after the headers, as the relay's timing has it
            await asyncio.to_thread(conn.open, 10)
            await asyncio.to_thread(conn.ended.wait, 10)
            error = conn.end
        except StreamError as exc:
            error = exc
        assert isinstance(error, StreamError) and error.status == Code.UNAUTHENTICATED
        assert "token expired" in error.details
    finally:
        await server.stop(None)


async def test_a_relay_that_never_answers_the_handshake_times_open_out() -> None:
    readers = _readers()
    with socket.socket() as listener:  # accepts TCP, says nothing
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        conn = StreamConnection(f"127.0.0.1:{port}", "token", b"agent", on_frame=print)
        with pytest.raises(TimeoutError, match="did not accept the stream"):
            await asyncio.to_thread(conn.open, 0.5)
    assert conn.ended.is_set()  # closed, and its reading thread with it
    await asyncio.to_thread(_wait_until, lambda: _readers() == readers)


async def test_nobody_listening_is_unavailable() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    conn = StreamConnection(f"127.0.0.1:{port}", "token", b"agent", on_frame=print)
    with pytest.raises(StreamError) as raised:
        await asyncio.to_thread(conn.open, 10)
    assert raised.value.status == Code.UNAVAILABLE


async def test_close_fails_what_waits_and_stops_the_reading_thread() -> None:
    stop = asyncio.Event()
    deaf = deaf_until(stop)

    async def test(url: str) -> None:
        readers = _readers()
        conn = await asyncio.to_thread(_opened, url)
        assert _readers() == readers + 1
        waiting = [conn.send(Unsubscribe(channel="a/b/c")) for _ in range(10)]
        conn.close()
        conn.close()  # idempotent
        for future in waiting:
            with pytest.raises(ConnectionError):
                future.result(5)
        assert conn.ended.is_set() and conn.end is None  # a local close is a clean end
        with pytest.raises(ConnectionError):
            conn.send(Unsubscribe(channel="a/b/c"))
        await asyncio.to_thread(_wait_until, lambda: _readers() == readers)
        stop.set()

    await relay_with(deaf, test)


async def test_a_request_given_up_on_is_forgotten() -> None:
    """A relay that never answers: each request whose caller cancels its future leaves
    the map of requests waiting for a Reply, so giving up costs no memory."""
    stop = asyncio.Event()

    async def test(url: str) -> None:
        conn = await asyncio.to_thread(_opened, url)
        given_up = [conn.send(Unsubscribe(channel="a/b/c")) for _ in range(100)]
        kept = conn.send(Unsubscribe(channel="a/b/c"))
        assert conn.waiting == 101
        for future in given_up:
            with pytest.raises(concurrent.futures.TimeoutError):
                future.result(0)
            assert future.cancel()
        assert conn.waiting == 1
        conn.close()
        with pytest.raises(ConnectionError):
            kept.result(5)
        assert conn.waiting == 0
        stop.set()

    await relay_with(deaf_until(stop), test)


def _wait_until(condition: Any, timeout: float = 5.0) -> None:
    done = threading.Event()
    for _ in range(int(timeout / 0.01)):
        if condition():
            return
        done.wait(0.01)
    raise AssertionError("the condition never held")
