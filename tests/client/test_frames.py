"""The agent's frame codec (svc_sdk/relay_frames.py over native/src/frames.rs) against
the relay's: the generated protobuf module the relay parses and writes with. Every
request encodes to the bytes protobuf would write, every ServerFrame decodes to the
fields protobuf reads, and bytes that are not a frame are a ValueError, never a crash.
The relay's hot path in the extension agrees with protobuf too: a delivery and a Reply
encode to the bytes protobuf writes, and a Publish decodes to the fields protobuf reads
(anything else is left to protobuf)."""

from __future__ import annotations

import contextlib

import pytest
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st

from svc_sdk._relay_pb import relay_pb2 as pb
from svc_sdk.protocol import MAX_DECODED_PUBLISH, decode_publish, encode_delivery, encode_reply
from svc_sdk.relay_frames import (
    MAX_FRAME,
    Commit,
    CreateChannel,
    Deliveries,
    Delivery,
    JoinRequest,
    Lagged,
    Publish,
    Refresh,
    Reply,
    Subscribe,
    Unsubscribe,
    Welcome,
    decode,
    encode,
)

u64 = st.integers(0, 2**64 - 1)
text = st.text(max_size=40)
blob = st.binary(max_size=300)
ONEOF = pb.ClientFrame.DESCRIPTOR.oneofs_by_name["kind"]

requests = st.one_of(
    st.builds(CreateChannel, text, blob),
    st.builds(Subscribe, text, u64, u64),
    st.builds(Unsubscribe, text),
    st.builds(Publish, text, st.lists(blob, max_size=5), st.lists(blob, max_size=5)),
    st.builds(Commit, text, u64, blob, blob),
    st.builds(Refresh, text),
    st.builds(JoinRequest, text, text),
)


@settings(max_examples=300, deadline=None)
@given(text, u64, st.binary(max_size=20000), blob, st.booleans(), u64)
def test_a_delivery_encodes_as_protobuf_writes_it(
    channel: str, seq: int, message: bytes, sender: bytes, handshake: bool, epoch: int
) -> None:
    expected = pb.Delivery(
        channel=channel, seq=seq, message=message, sender=sender, handshake=handshake, epoch=epoch
    ).SerializeToString()
    assert encode_delivery(channel, seq, message, sender, handshake, epoch) == expected


@settings(max_examples=300, deadline=None)
@given(u64, st.integers(-(2**31), 2**31 - 1), text, u64, u64, u64, st.integers(0, 2**32 - 1))
def test_a_reply_encodes_as_protobuf_writes_it(
    request_id: int, code: int, message: str, seq: int, epoch: int, head: int, suite: int
) -> None:
    reply = pb.Reply(
        request_id=request_id,
        code=code,
        message=message,
        seq=seq,
        epoch=epoch,
        head_seq=head,
        cipher_suite=suite,
    )
    expected = pb.ServerFrame(reply=reply).SerializeToString()
    got = encode_reply(request_id, code, message, seq, epoch, head, suite)
    assert got == expected
    # As the relay calls it: the fields it does not name are zero.
    assert (
        encode_reply(request_id, code, message, seq=seq)
        == pb.ServerFrame(
            reply=pb.Reply(request_id=request_id, code=code, message=message, seq=seq)
        ).SerializeToString()
    )


def test_the_relays_codec_refuses_what_is_not_its_input() -> None:
    with pytest.raises(OverflowError):
        encode_reply(-1, 0, "")
    with pytest.raises(OverflowError):
        encode_delivery("a/b/c", 2**64, b"m", b"s", False, 0)
    with pytest.raises(TypeError):
        encode_delivery("a/b/c", 1, "not bytes", b"s", False, 0)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        decode_publish("not bytes")  # type: ignore[arg-type]


def read_publish(data: bytes) -> tuple[int, str, list[bytes], list[bytes]] | None:
    """What the relay reads of ``data`` with protobuf alone, if it is a Publish."""
    try:
        frame = pb.ClientFrame.FromString(data)
    except DecodeError:  # not a frame protobuf reads
        return None
    if frame.WhichOneof("kind") != "publish":
        return None
    p = frame.publish
    return frame.request_id, p.channel, list(p.message), list(p.message_id)


@settings(max_examples=400, deadline=None)
@given(requests, u64)
def test_a_publish_decodes_to_what_protobuf_reads(request: object, request_id: int) -> None:
    data = as_protobuf(request)
    data.request_id = request_id
    wire = data.SerializeToString()
    # Every other kind is left to protobuf.
    assert decode_publish(wire) == read_publish(wire)


@settings(max_examples=400, deadline=None)
@given(
    st.builds(Publish, text, st.lists(blob, max_size=5), st.lists(blob, max_size=5)),
    st.binary(max_size=20),
    st.integers(0, 400),
)
def test_a_mangled_publish_decodes_as_protobuf_reads_it_or_is_left_to_it(
    publish: Publish, junk: bytes, at: int
) -> None:
    wire = as_protobuf(publish).SerializeToString()
    # Two frames' bytes end to end are one frame to protobuf: it merges them.
    other = pb.ClientFrame(request_id=7, publish=pb.Publish(channel="x/y/z", message=[junk]))
    merged = wire + other.SerializeToString()
    for data in (wire[:at] + junk + wire[at:], wire[:at], junk + wire, merged):
        decoded = decode_publish(data)
        if decoded is not None:  # never a Publish protobuf would refuse or read otherwise
            assert decoded == read_publish(data)


def test_a_publish_of_more_messages_than_the_relay_takes_is_counted_not_decoded() -> None:
    many = [b"m"] * (MAX_DECODED_PUBLISH + 1)
    for publish, counts in (
        (pb.Publish(channel="a/b/c", message=many), ("a/b/c", len(many), 0)),
        (pb.Publish(message=[b"m"], message_id=many), ("", 1, len(many))),
    ):
        wire = pb.ClientFrame(request_id=1, publish=publish).SerializeToString()
        assert decode_publish(wire) == (1, *counts)
    wire = pb.ClientFrame(
        request_id=1, publish=pb.Publish(message=many[:-1], message_id=many[:-1])
    ).SerializeToString()
    assert decode_publish(wire) == (1, "", many[:-1], many[:-1])


def as_protobuf(request: object) -> pb.ClientFrame:
    """The same request as the relay's generated module builds it."""
    name = type(request).__name__
    field = next(f.name for f in ONEOF.fields if f.message_type.name == name)
    message = getattr(pb, name)(**request._asdict())  # type: ignore[attr-defined]
    return pb.ClientFrame(**{field: message})


def test_there_is_one_request_type_per_kind_of_client_frame() -> None:
    names = {f.message_type.name for f in ONEOF.fields}
    assert names == {
        t.__name__
        for t in (CreateChannel, Subscribe, Unsubscribe, Publish, Commit, Refresh, JoinRequest)
    }


@settings(max_examples=400, deadline=None)
@given(requests, u64)
def test_a_request_encodes_as_protobuf_writes_it(request: object, request_id: int) -> None:
    expected = as_protobuf(request)
    expected.request_id = request_id
    wire = encode(request, request_id)  # type: ignore[arg-type]
    assert wire == expected.SerializeToString()
    assert pb.ClientFrame.FromString(wire) == expected


deliveries = st.lists(
    st.builds(
        pb.Delivery,
        channel=text,
        seq=u64,
        message=blob,
        sender=blob,
        handshake=st.booleans(),
        epoch=u64,
        subscription=u64,
    ),
    max_size=5,
)
server_frames = st.one_of(
    st.builds(
        lambda *f: pb.ServerFrame(reply=pb.Reply(**dict(zip(Reply._fields, f, strict=True)))),
        u64,
        st.integers(-(2**31), 2**31 - 1),
        text,
        u64,
        u64,
        u64,
        st.integers(0, 2**32 - 1),
    ),
    st.builds(lambda items: pb.ServerFrame(deliveries=pb.Deliveries(items=items)), deliveries),
    st.builds(
        lambda c, w, s, e: pb.ServerFrame(welcome=pb.Welcome(channel=c, welcome=w, seq=s, epoch=e)),
        text,
        blob,
        u64,
        u64,
    ),
    st.builds(lambda c: pb.ServerFrame(lagged=pb.Lagged(channel=c)), text),
)


@settings(max_examples=400, deadline=None)
@given(server_frames)
def test_a_server_frame_decodes_to_what_protobuf_reads(frame: pb.ServerFrame) -> None:
    event = decode(frame.SerializeToString())
    kind = frame.WhichOneof("kind")
    if kind == "reply":
        r = frame.reply
        assert event == Reply(
            r.request_id, r.code, r.message, r.seq, r.epoch, r.head_seq, r.cipher_suite
        )
    elif kind == "deliveries":
        assert event == Deliveries(
            [
                Delivery(
                    d.channel, d.seq, d.message, d.sender, d.handshake, d.epoch, d.subscription
                )
                for d in frame.deliveries.items
            ]
        )
    elif kind == "welcome":
        w = frame.welcome
        assert event == Welcome(w.channel, w.welcome, w.seq, w.epoch)
    else:
        assert event == Lagged(frame.lagged.channel)


def test_a_newer_relays_fields_and_kinds_are_passed_over() -> None:
    """Forward compatibility, as protobuf has it: an unknown field is skipped, and a
    frame of an unknown kind is None (the stream goes on)."""
    reply = pb.ServerFrame(reply=pb.Reply(request_id=7, seq=3)).SerializeToString()
    # Field 15 (varint 1) appended inside the Reply: its length grows by two.
    inner = pb.Reply(request_id=7, seq=3).SerializeToString() + b"\x78\x01"
    with_unknown = b"\x0a" + bytes([len(inner)]) + inner
    assert decode(with_unknown) == decode(reply) == Reply(request_id=7, seq=3)
    assert decode(b"\x4a\x00") is None  # field 9, an empty message: a kind not known here
    assert decode(b"") is None


@pytest.mark.parametrize(
    "data",
    [
        b"\x0a\x05ab",  # a Reply whose length runs past the frame
        b"\x0a\x02\x1a\x01\xff",  # a Reply whose message is not UTF-8
        b"\x12\x03\x0a\x01",  # deliveries cut inside an item
        b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",  # a varint over 64 bits
        b"\x0b",  # a start-group wire type
    ],
)
def test_bytes_that_are_not_a_server_frame_are_a_value_error(data: bytes) -> None:
    with pytest.raises(ValueError, match="malformed ServerFrame"):
        decode(data)


@settings(max_examples=2000, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_decode_or_raise_value_error(data: bytes) -> None:
    with contextlib.suppress(ValueError):
        decode(data)


def test_what_is_not_a_request_or_is_too_large_is_refused() -> None:
    with pytest.raises(TypeError, match="not a relay request: Reply"):
        encode(Reply(), 1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not a relay request: ClientFrame"):
        encode(pb.ClientFrame(), 1)
    with pytest.raises(ValueError, match="over the"):
        encode(Publish("a/b/c", [bytes(MAX_FRAME)]), 1)
    with pytest.raises(TypeError):
        encode(Publish("a/b/c", ["text"]), 1)  # type: ignore[list-item]
    with pytest.raises(OverflowError):
        encode(Subscribe("a/b/c", after_seq=-1), 1)
