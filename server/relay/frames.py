"""The client's frames as the relay reads them, one at a time, from the
``ReceivedFrame`` objects ``RelayServer.poll`` hands over: a Publish (the one request on
every message's path) decoded by the extension — one over the relay's limits only
counted, to be refused — any other kind parsed with the generated module."""

from __future__ import annotations

from typing import NamedTuple, Protocol

from google.protobuf.message import DecodeError

from svc_sdk.protocol import relay_pb2


class Received(Protocol):
    """A frame as the transport received it: ``svc_sdk.protocol.ReceivedFrame``."""

    def publish(
        self,
    ) -> tuple[int, str, list[bytes], list[bytes]] | tuple[int, str, int, int] | None:
        """The Publish it holds, decoded (over the limits: its numbers of messages and of
        ids instead); None for any other frame."""

    def bytes(self) -> bytes:
        """Its encoded bytes."""


class PublishFrame(NamedTuple):
    """A ``ClientFrame{publish}`` the extension decoded: what the relay reads of it, with
    the names the generated module gives them."""

    request_id: int
    channel: str
    message: list[bytes]
    message_id: list[bytes]


class OversizedPublish(NamedTuple):
    """A ``ClientFrame{publish}`` of more messages or ids than the relay takes
    (``MAX_DECODED_PUBLISH``): counted by the extension, not decoded, and refused."""

    request_id: int
    channel: str
    messages: int
    message_ids: int


Frame = relay_pb2.ClientFrame | PublishFrame | OversizedPublish


def parse_frame(received: Received) -> Frame | None:
    """Never raises: a frame that does not parse becomes None and gets an error reply."""
    publish = received.publish()
    if publish is not None:
        if isinstance(publish[2], int):  # counted, not decoded: over the limits
            return OversizedPublish._make(publish)
        return PublishFrame._make(publish)
    try:
        frame: relay_pb2.ClientFrame = relay_pb2.ClientFrame.FromString(received.bytes())
    except DecodeError:
        return None
    return frame
