"""``ClientStream`` (server/relay/transport.py), the relay's side of one stream, as pure
logic over a stand-in for the native ``ServerStream``: what it hands ``Relay.connect``,
when it lets the native side read on, and that one stream's burst leaves the event loop
to the others; and how it reads each frame (server/relay/frames.py). The real server is
exercised by test_server_transport.py and the rest of the relay suite."""

from __future__ import annotations

import asyncio

import pytest

from svc_sdk._relay_pb import relay_pb2 as pb
from svc_sdk.protocol import MAX_DECODED_PUBLISH, decode_publish
from svc_server.relay.frames import OversizedPublish, PublishFrame, parse_frame
from svc_server.relay.transport import FAIR_SHARE, FULL, QUEUED, ClientStream

pytestmark = pytest.mark.anyio


class FakeStream:
    id = 7

    def __init__(self) -> None:
        self.released = 0
        self.room = True
        self.written: list[bytes] = []
        self.finished: tuple[int, str] | None = None

    def metadata(self) -> list[tuple[str, str]]:
        return [("authorization", "Bearer t")]

    def accept(self) -> None: ...

    def release(self) -> None:
        self.released += 1

    def write(self, frame: bytes) -> int:
        if not self.room:
            return FULL
        self.written.append(frame)
        return QUEUED

    def finish(self, code: int, message: str) -> None:
        self.finished = (code, message)


class Received:
    """Stands in for the native ``ReceivedFrame``: a frame's bytes, a Publish read from
    them with the extension's own decoder."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def publish(
        self,
    ) -> tuple[int, str, list[bytes], list[bytes]] | tuple[int, str, int, int] | None:
        return decode_publish(self.data)

    def bytes(self) -> bytes:
        return self.data


class Unparsed(Received):
    """A received frame whose bytes must not be needed: ``parse_frame`` reads a Publish
    only through the extension's decoder."""

    def bytes(self) -> bytes:
        raise AssertionError("parsed a second time")


def test_a_publish_over_the_limits_is_refused_without_a_second_parse() -> None:
    many = [b"m"] * (MAX_DECODED_PUBLISH + 1)
    wire = pb.ClientFrame(
        request_id=9, publish=pb.Publish(channel="a/b/c", message=many, message_id=many)
    ).SerializeToString()
    assert parse_frame(Unparsed(wire)) == OversizedPublish(9, "a/b/c", len(many), len(many))
    small = pb.ClientFrame(request_id=3, publish=pb.Publish(channel="a/b/c", message=[b"m"]))
    assert parse_frame(Unparsed(small.SerializeToString())) == PublishFrame(3, "a/b/c", [b"m"], [])


def test_a_publish_over_the_limits_is_counted_as_protobuf_reads_it() -> None:
    """Fields in any order, and a Publish repeated in one frame (protobuf merges the two):
    counted as a full parse would count them. A frame whose last kind is not a Publish
    is that kind, as protobuf has it."""
    many = [b"m"] * (MAX_DECODED_PUBLISH + 1)
    messages_first = pb.ClientFrame(publish=pb.Publish(message=many)).SerializeToString()
    then_channel = pb.ClientFrame(
        request_id=9, publish=pb.Publish(channel="a/b/c", message_id=[b"i"])
    ).SerializeToString()
    wire = messages_first + then_channel
    assert pb.ClientFrame.FromString(wire).publish.channel == "a/b/c"  # merged
    assert parse_frame(Unparsed(wire)) == OversizedPublish(9, "a/b/c", len(many), 1)
    unsubscribe = pb.ClientFrame(request_id=4, unsubscribe=pb.Unsubscribe(channel="a/b/c"))
    last = parse_frame(Received(wire + unsubscribe.SerializeToString()))
    assert isinstance(last, pb.ClientFrame) and last.WhichOneof("kind") == "unsubscribe"


def frame(request_id: int) -> Received:
    return Received(
        pb.ClientFrame(
            request_id=request_id, unsubscribe=pb.Unsubscribe(channel="a/b/c")
        ).SerializeToString()
    )


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_a_burst_of_frames_lets_the_loop_turn() -> None:
    stream = FakeStream()
    client = ClientStream(stream)
    burst = 20 * FAIR_SHARE
    client.on_event([frame(i + 1) for i in range(burst)], True, None, False)
    turns = 0

    async def other_stream() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    other = asyncio.create_task(other_stream())
    await asyncio.sleep(0)
    got = [f.request_id async for f in client.requests() if f is not None]
    other.cancel()
    assert got == list(range(1, burst + 1))
    assert turns >= burst // FAIR_SHARE  # the other task ran all along, not after
    assert stream.released >= 1  # everything handed over was released once processed


async def test_frames_that_do_not_parse_become_none_and_an_end_raises() -> None:
    client = ClientStream(FakeStream())
    garbage = Received(b"\xff\xff not protobuf")
    client.on_event([garbage, frame(3)], False, (8, "frame too large"), False)
    frames = client.requests()
    assert await anext(frames) is None
    assert (await anext(frames)).request_id == 3
    with pytest.raises(ConnectionError, match="frame too large"):
        await anext(frames)


async def test_a_full_stream_waits_for_room_and_then_writes() -> None:
    stream = FakeStream()
    client = ClientStream(stream)
    stream.room = False
    writing = asyncio.create_task(client.write(b"frame"))
    await asyncio.sleep(0.01)
    assert not writing.done() and stream.written == []
    stream.room = True
    client.on_event([], False, None, True)  # the native side reports room again
    await asyncio.wait_for(writing, 5)
    assert stream.written == [b"frame"]


async def test_the_transport_error_status_reaches_the_client() -> None:
    stream = FakeStream()
    client = ClientStream(stream)
    client.on_event([], False, (8, "decoded message length too large"), False)
    client.finish_ok()
    assert stream.finished == (8, "decoded message length too large")
    cancelled = FakeStream()
    other = ClientStream(cancelled)
    other.on_event([], False, (1, "stream closed"), False)
    other.finish_ok()
    assert cancelled.finished == (0, "")
