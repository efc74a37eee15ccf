"""svc_sdk.relay_client's request boundary: which message goes in which frame field."""

from __future__ import annotations

import typing

import pytest

from svc_sdk._relay_pb import relay_pb2 as pb
from svc_sdk.relay_client import Request, client_frame, reply_of
from svc_sdk.relay_frames import Reply

ONEOF = pb.ClientFrame.DESCRIPTOR.oneofs_by_name["kind"]

# One filled-in message per field of the oneof, so a copy that dropped content shows.
SAMPLES: dict[str, Request] = {
    "create": pb.CreateChannel(channel="acme/ns/svc", group_info=b"info"),
    "subscribe": pb.Subscribe(channel="acme/ns/svc", after_seq=41),
    "unsubscribe": pb.Unsubscribe(channel="acme/ns/svc"),
    "publish": pb.Publish(channel="acme/ns/svc", message=[b"a", b"b"], message_id=[b"1", b"2"]),
    "commit": pb.Commit(channel="acme/ns/svc", epoch=3, commit=b"c", welcome=b"w"),
    "refresh": pb.Refresh(token="t"),
    "join": pb.JoinRequest(channel="acme/ns/svc", join_id="j"),
}


def test_the_request_type_is_the_oneof() -> None:
    """``Request`` is written out for type checkers; it must name exactly the oneof's
    message types, so a field added to the proto fails here until the alias has it."""
    assert {t.DESCRIPTOR.full_name for t in typing.get_args(Request)} == {
        f.message_type.full_name for f in ONEOF.fields
    }
    assert set(SAMPLES) == {f.name for f in ONEOF.fields}


@pytest.mark.parametrize("field", sorted(SAMPLES))
def test_each_request_goes_in_its_own_field(field: str) -> None:
    request = SAMPLES[field]
    frame = client_frame(request, 2**64 - 1)
    assert frame.request_id == 2**64 - 1
    assert frame.WhichOneof("kind") == field
    assert getattr(frame, field) == request
    # What goes on the wire is what the generated constructor makes of the same request.
    wire = frame.SerializeToString()
    assert wire == pb.ClientFrame(request_id=2**64 - 1, **{field: request}).SerializeToString()
    assert pb.ClientFrame.FromString(wire) == frame


def test_an_empty_request_still_selects_its_field() -> None:
    frame = client_frame(pb.Refresh(), 1)
    assert frame.WhichOneof("kind") == "refresh"
    assert pb.ClientFrame.FromString(frame.SerializeToString()).WhichOneof("kind") == "refresh"


def test_the_frame_holds_a_copy() -> None:
    request = pb.Subscribe(channel="acme/ns/svc", after_seq=1)
    frame = client_frame(request, 1)
    request.after_seq = 2
    assert frame.subscribe.after_seq == 1


@pytest.mark.parametrize(
    "message",
    [pb.Reply(request_id=1), pb.Delivery(channel="acme/ns/svc"), pb.ClientFrame(), b"bytes"],
    ids=["Reply", "Delivery", "ClientFrame", "bytes"],
)
def test_a_message_that_is_not_a_request_raises_type_error(message: object) -> None:
    with pytest.raises(TypeError, match="not a relay request"):
        client_frame(message, 1)  # type: ignore[arg-type]


def test_a_refusal_carries_every_field_of_the_relays_reply() -> None:
    """``RelayConnection.request`` raises RelayError with the agents' Reply: each field of
    the generated message is carried over, none left at its default."""
    fields: dict[str, typing.Any] = {
        "request_id": 2**64 - 1,
        "code": 9,
        "message": "stale",
        "seq": 4,
        "epoch": 7,
    }
    fields |= {"head_seq": 12, "cipher_suite": 65100}
    assert set(fields) == {f.name for f in pb.Reply.DESCRIPTOR.fields}
    assert reply_of(pb.Reply(**fields)) == Reply(**fields)
