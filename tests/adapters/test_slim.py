"""SLIMAdapter end to end through a real local stack."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from svc_sdk import ChannelClosedError, Envelope, Protocol, SLIMAdapter
from svc_sdk.testing import LocalStack

from .helpers import collect, members


def test_publish_and_receive(
    stack: LocalStack, channel_name: str, ids: Callable[[str], str]
) -> None:
    a, b = members(stack, channel_name, ids("pub"), ids("sub"))
    pub, sub = SLIMAdapter(a), SLIMAdapter(b)
    sub.subscribe(channel_name)
    pub.publish(channel_name, b"\x00raw bytes")
    pub.publish(channel_name, '{"util": 0.93}', content_type="application/json")
    got = collect(lambda: sub.receive(channel_name, timeout=5.0), 2)
    assert got == [b"\x00raw bytes", b'{"util": 0.93}']
    assert sub.receive(channel_name, timeout=0.2) == []


def test_envelopes_keep_content_type_and_metadata(
    stack: LocalStack, channel_name: str, ids: Callable[[str], str]
) -> None:
    a, b = members(stack, channel_name, ids("pub"), ids("sub"))
    SLIMAdapter(a).publish(channel_name, b"x", content_type="text/csv", metadata={"k": [1, 2]})
    (envelope,) = collect(lambda: SLIMAdapter(b).receive_envelopes(channel_name), 1)
    assert envelope == Envelope(Protocol.SLIM, "text/csv", b"x", {"k": [1, 2]})


def test_other_protocols_are_left_alone(
    stack: LocalStack, channel_name: str, ids: Callable[[str], str]
) -> None:
    a, b = members(stack, channel_name, ids("pub"), ids("sub"))
    a.send(channel_name, "plain one")
    SLIMAdapter(a).publish(channel_name, b"slim")
    a.send_envelope(channel_name, Envelope(Protocol.MCP, "application/json", b"{}"))
    a.send(channel_name, "plain two")
    sub = SLIMAdapter(b)
    assert collect(lambda: sub.receive(channel_name), 1) == [b"slim"]
    # The others are still there, in order, for the manager's own readers.
    rest = collect(lambda: b.receive_envelopes(channel_name), 3)
    assert [e.protocol for e in rest] == [Protocol.RAW, Protocol.MCP, Protocol.RAW]
    assert [rest[0].payload, rest[2].payload] == [b"plain one", b"plain two"]


def test_subscribe_needs_membership(stack: LocalStack, ids: Callable[[str], str]) -> None:
    slim = SLIMAdapter(stack.manager(ids("lonely")))
    with pytest.raises(ChannelClosedError, match="not in channel"):
        slim.subscribe("acme/nowhere/at-all")
    with pytest.raises(RuntimeError, match="invalid channel name"):
        slim.publish("not a channel", b"x")
