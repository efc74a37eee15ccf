"""Envelopes (docs/client.md, Envelopes): a payload tagged with the protocol it speaks, so agents of
different frameworks can share a channel.

Wire format, byte for byte what deployed agents exchange: a 4-byte little-endian header
length, the header as compact JSON ``{"p": <protocol>, "ct": <content type>, "md":
<metadata>}`` (``md`` omitted when None), then the payload.

>>> env = Envelope(Protocol.MCP, "application/json", b'{"jsonrpc":"2.0"}')
>>> data = env.serialize()
>>> data[4:4 + int.from_bytes(data[:4], "little")]
b'{"p":"mcp","ct":"application/json"}'
>>> Envelope.deserialize(data) == env
True
"""

from __future__ import annotations

import enum
import json
import struct
from dataclasses import dataclass
from typing import Any

__all__ = ["MAX_HEADER_BYTES", "Envelope", "Protocol"]

MAX_HEADER_BYTES = 64 * 1024
_LENGTH = struct.Struct("<I")


class Protocol(enum.Enum):
    """What an envelope's payload is. The value is its tag on the wire."""

    RAW = "raw"
    A2A = "a2a"
    MCP = "mcp"
    SLIM = "slim"


@dataclass(frozen=True)
class Envelope:
    protocol: Protocol
    content_type: str
    payload: bytes
    metadata: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.protocol, Protocol):
            raise TypeError(f"protocol must be a Protocol, not {type(self.protocol).__name__}")
        if not isinstance(self.content_type, str):
            raise TypeError("content_type must be a str")
        if not isinstance(self.payload, bytes | bytearray | memoryview):
            raise TypeError(f"payload must be bytes, not {type(self.payload).__name__}")
        if self.metadata is not None and not isinstance(self.metadata, dict):
            raise TypeError("metadata must be a dict or None")

    def serialize(self) -> bytes:
        """The wire format; ValueError if the metadata is not JSON or the header is too big."""
        header: dict[str, Any] = {"p": self.protocol.value, "ct": self.content_type}
        if self.metadata is not None:
            header["md"] = self.metadata
        try:
            encoded = json.dumps(header, separators=(",", ":")).encode()
        except (TypeError, ValueError) as exc:
            raise ValueError(f"envelope metadata is not JSON-serializable: {exc}") from None
        if len(encoded) > MAX_HEADER_BYTES:
            raise ValueError(f"envelope header is {len(encoded)} bytes; the limit is 65536")
        return _LENGTH.pack(len(encoded)) + encoded + bytes(self.payload)

    @classmethod
    def deserialize(cls, data: bytes) -> Envelope:
        """Parses the wire format; ValueError (with the reason) for anything invalid."""
        if not isinstance(data, bytes | bytearray | memoryview):
            raise ValueError(f"envelope must be bytes, not {type(data).__name__}")
        data = bytes(data)
        if len(data) < _LENGTH.size:
            raise ValueError(f"envelope is {len(data)} bytes; too short for its header length")
        (length,) = _LENGTH.unpack_from(data)
        if length > MAX_HEADER_BYTES:
            raise ValueError(f"envelope header length {length} is above the 65536-byte limit")
        if _LENGTH.size + length > len(data):
            raise ValueError(f"envelope header length {length} runs past the end of the data")
        try:
            header = json.loads(data[_LENGTH.size : _LENGTH.size + length])
        except (ValueError, RecursionError) as exc:  # RecursionError: nesting too deep
            raise ValueError(f"envelope header is not JSON: {exc}") from None
        if not isinstance(header, dict):
            raise ValueError("envelope header is not a JSON object")
        try:
            protocol = Protocol(header.get("p"))
        except ValueError:
            raise ValueError(f"unknown envelope protocol {header.get('p')!r}") from None
        content_type = header.get("ct")
        if not isinstance(content_type, str):
            raise ValueError("envelope header has no content type (ct) string")
        metadata = header.get("md")
        if metadata is not None and not isinstance(metadata, dict):
            raise ValueError("envelope metadata (md) is not a JSON object")
        return cls(protocol, content_type, data[_LENGTH.size + length :], metadata)
