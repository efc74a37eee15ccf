"""ProtocolBridge end to end: every translation direction through a real local stack."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from svc_sdk import Envelope, Protocol, ProtocolBridge, SvcChannelManager
from svc_sdk.adapters import content
from svc_sdk.adapters.content import Content
from svc_sdk.testing import LocalStack

from .helpers import collect, members

TRANSLATED = [Protocol.A2A, Protocol.SLIM, Protocol.MCP]
_n = itertools.count()

Setup = tuple[SvcChannelManager, SvcChannelManager, ProtocolBridge, str, str]


@pytest.fixture
def bridged(stack: LocalStack, ids: Callable[[str], str]) -> Iterator[Setup]:
    """src -> [source channel] -> bridge agent -> [target channel] -> dst."""
    n = next(_n)
    source, target = f"acme/bridge/in{n}", f"acme/bridge/out{n}"
    src, mid = members(stack, source, ids("src"), ids("bridge"))
    mid.create(target)
    dst = stack.manager(ids("dst"))
    dst.join_with_token(target, mid.invite(target), timeout=20.0)
    bridge = ProtocolBridge(mid)
    yield src, dst, bridge, source, target
    bridge.stop()


def counts(bridge: ProtocolBridge, name: str) -> tuple[int, int]:
    """(skipped, forwarded) once one message was forwarded: the count follows the
    relay's acknowledgement, which may trail the delivery."""
    deadline = time.monotonic() + 10
    while bridge.forwarded[name] < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    return bridge.skipped[name], bridge.forwarded[name]


PARTS: list[dict[str, Any]] = [
    {"type": "text", "text": "book a train"},
    {"type": "data", "data": {"seats": 2}},
]


@pytest.mark.parametrize(
    ("a", "b"),
    [(a, b) for a in TRANSLATED for b in TRANSLATED if a is not b],
    ids=lambda p: p.name,
)
def test_each_direction(bridged: Setup, a: Protocol, b: Protocol) -> None:
    src, dst, bridge, source, target = bridged
    bridge.bridge(source, target, a, b)
    sent = content.WRITERS[a](Content(PARTS))
    src.send_envelope(source, sent)
    (got,) = collect(lambda: dst.receive_envelopes(target, timeout=5.0), 1)
    assert got.protocol is b
    assert content.READERS[b](got).parts == PARTS


def test_malformed_is_skipped_and_others_are_not_forwarded(bridged: Setup) -> None:
    src, dst, bridge, source, target = bridged
    bridge.bridge(source, target, Protocol.SLIM, Protocol.MCP)
    name = f"{source}->{target}"
    src.send_envelope(source, Envelope(Protocol.SLIM, content.PARTS_TYPE, b"{not json"))
    src.send_envelope(source, Envelope(Protocol.A2A, content.A2A_MESSAGE_TYPE, b"{}"))
    src.send(source, "raw, not for the bridge")
    src.send_envelope(source, Envelope(Protocol.SLIM, "text/plain", b"still bridging"))
    (got,) = collect(lambda: dst.receive_envelopes(target, timeout=5.0), 1)
    assert content.from_mcp(got).parts == [{"type": "text", "text": "still bridging"}]
    assert counts(bridge, name) == (1, 1)
    assert dst.receive_envelopes(target, timeout=0.5) == []


def test_stop_ends_every_thread_within_a_second(bridged: Setup) -> None:
    _, _, bridge, source, target = bridged
    bridge.bridge(source, target, Protocol.A2A, Protocol.SLIM)
    bridge.bridge(source, target, Protocol.MCP, Protocol.SLIM)
    started = time.monotonic()
    bridge.stop()
    assert time.monotonic() - started < 1.0
    assert not any(t.is_alive() for t in bridge._threads)
    bridge.stop()  # idempotent


def test_bad_arguments(bridged: Setup) -> None:
    _, _, bridge, source, target = bridged
    with pytest.raises(ValueError, match="the same"):
        bridge.bridge(source, target, Protocol.SLIM, Protocol.SLIM)
    with pytest.raises(ValueError, match="not <Protocol.RAW"):
        bridge.bridge(source, target, Protocol.RAW, Protocol.SLIM)
    with pytest.raises(RuntimeError, match="not in channel"):
        bridge.bridge(source, "acme/bridge/elsewhere", Protocol.A2A, Protocol.SLIM)


def test_a_message_too_big_once_translated_is_skipped(bridged: Setup) -> None:
    src, dst, bridge, source, target = bridged
    bridge.bridge(source, target, Protocol.SLIM, Protocol.MCP)
    name = f"{source}->{target}"
    # 800 KiB of bytes fits a message; as base64 inside MCP JSON it no longer does.
    src.send_envelope(
        source, Envelope(Protocol.SLIM, "application/octet-stream", b"\x00" * 800_000)
    )
    src.send_envelope(source, Envelope(Protocol.SLIM, "text/plain", b"next"))
    (got,) = collect(lambda: dst.receive_envelopes(target, timeout=5.0), 1)
    assert content.from_mcp(got).parts == [{"type": "text", "text": "next"}]
    assert counts(bridge, name) == (1, 1)
