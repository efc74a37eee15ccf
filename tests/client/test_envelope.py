"""Envelope wire format byte for byte, and strict parsing."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from svc_sdk import Envelope, Protocol


def test_wire_format_is_exact() -> None:
    env = Envelope(Protocol.A2A, "application/json", b"PAYLOAD", {"k": [1, "v"]})
    header = b'{"p":"a2a","ct":"application/json","md":{"k":[1,"v"]}}'
    assert env.serialize() == struct.pack("<I", len(header)) + header + b"PAYLOAD"
    plain = Envelope(Protocol.RAW, "text/plain", b"")
    assert plain.serialize() == b"\x1d\x00\x00\x00" + b'{"p":"raw","ct":"text/plain"}'
    assert plain.metadata is None


@pytest.mark.parametrize("protocol", list(Protocol))
def test_every_protocol_round_trips(protocol: Protocol) -> None:
    env = Envelope(protocol, "application/octet-stream", bytes(range(256)))
    assert Envelope.deserialize(env.serialize()) == env
    assert protocol.value in {"raw", "a2a", "mcp", "slim"}


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "too short"),
        (b"\x01\x00", "too short"),
        (struct.pack("<I", 10) + b"{}", "runs past the end"),
        (struct.pack("<I", 70_000) + b"x" * 70_000, "above the 65536-byte limit"),
        (struct.pack("<I", 3) + b"{x}", "not JSON"),
        (struct.pack("<I", 2) + b"[]", "not a JSON object"),
        (struct.pack("<I", 2) + b"\xff\xfe", "not JSON"),
        (struct.pack("<I", 21) + b'{"p":"xml","ct":"a/b"}'[:21], "not JSON"),
        (struct.pack("<I", 22) + b'{"p":"xml","ct":"a/b"}', "unknown envelope protocol"),
        (struct.pack("<I", 12) + b'{"p":"raw"}', "runs past"),
        (struct.pack("<I", 11) + b'{"p":"raw"}', "no content type"),
        (struct.pack("<I", 28) + b'{"p":"raw","ct":"a","md":[]}', "not a JSON object"),
    ],
)
def test_invalid_data_is_a_value_error(data: bytes, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        Envelope.deserialize(data)


def test_constructor_checks_types() -> None:
    with pytest.raises(TypeError):
        Envelope("raw", "text/plain", b"")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Envelope(Protocol.RAW, "text/plain", "not bytes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not JSON-serializable"):
        Envelope(Protocol.RAW, "t", b"", {"x": object()}).serialize()


@given(
    protocol=st.sampled_from(list(Protocol)),
    content_type=st.text(max_size=50),
    payload=st.binary(max_size=2000),
    metadata=st.none()
    | st.dictionaries(st.text(max_size=10), st.integers() | st.text(max_size=10), max_size=5),
)
def test_round_trip_property(
    protocol: Protocol, content_type: str, payload: bytes, metadata: dict[str, object] | None
) -> None:
    env = Envelope(protocol, content_type, payload, metadata)
    assert Envelope.deserialize(env.serialize()) == env


@given(st.binary(max_size=300))
def test_arbitrary_bytes_parse_or_raise_value_error(data: bytes) -> None:
    try:
        env = Envelope.deserialize(data)
    except ValueError:
        return
    # Whatever parses is a well-formed envelope that survives its own round trip.
    assert Envelope.deserialize(env.serialize()) == env
