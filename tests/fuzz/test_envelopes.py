"""Fuzz target: the envelope wire format, as every receiving agent parses what a peer
sent. ValueError is the only failure (docs/client.md, Envelopes); whatever parses
re-serializes to a stable form; the receive path turns anything into an envelope."""

from __future__ import annotations

import contextlib
import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from svc_sdk import Envelope, Protocol
from svc_sdk.adapters import content
from svc_sdk.adapters._reader import parse
from svc_sdk.agent_id import AgentId
from svc_sdk.channel import Message
from svc_sdk.manager import to_envelope

from .mutate import BATCH, EXAMPLES, FUZZ, batches, counted, settings_for

pytestmark = pytest.mark.fuzz

SENDER = AgentId("00000000-0000-0000-0000-000000000000", b"peer")


def _header(value: object) -> bytes:
    encoded = json.dumps(value, separators=(",", ":")).encode()
    return struct.pack("<I", len(encoded)) + encoded


SEEDS = [
    content.to_slim(
        content.from_mcp(
            Envelope(
                Protocol.MCP,
                "application/json",
                b'{"jsonrpc":"2.0","method":"m","params":{"a":[1,{"b":2}]},"id":3}',
            )
        )
    ).serialize(),
    content.to_a2a(
        content.Content([{"type": "text", "text": "hi"}, {"type": "data", "data": {"x": [1]}}])
    ).serialize(),
    content.to_mcp(
        content.Content([{"type": "data", "data": {"k": [1, 2]}}, {"type": "text", "text": "t"}])
    ).serialize(),
    content.to_slim(
        content.Content(
            [
                {"type": "data", "data": [[[1]]]},
                {"type": "file", "file": {"bytes": "AAAA", "mimeType": "x/y"}},
            ]
        )
    ).serialize(),
    Envelope(Protocol.RAW, "application/octet-stream", b"").serialize(),
    Envelope(Protocol.A2A, "application/json", b'{"role":"user"}', {"k": [1, "v"]}).serialize(),
    Envelope(Protocol.MCP, "application/json", b'{"jsonrpc":"2.0","id":1}').serialize(),
    Envelope(Protocol.SLIM, "text/plain; charset=utf-8", b"hi", {"a": {"b": None}}).serialize(),
    _header({"p": "raw", "ct": "x", "md": {"n": [[[[1.5e300, -0.0, True]]]]}}) + b"tail",
    # Deep nesting that fits the 64 KiB header limit.
    _header({"p": "a2a", "ct": "x"})[:4]
    + b'{"p":"a2a","ct":"x","md":{"x":'
    + b"[" * 40
    + b"]" * 40
    + b"}}",
]
# The seed above carries a made-up length: give it the right one.
SEEDS[-1] = struct.pack("<I", len(SEEDS[-1]) - 4) + SEEDS[-1][4:]


def check(data: bytes) -> None:
    try:
        env = Envelope.deserialize(data)
    except ValueError:
        env = None
    if env is not None:
        again = env.serialize()
        assert Envelope.deserialize(again).serialize() == again
        # What the bridge does with it: a translation, or ValueError (content.translate).
        for target in content.WRITERS:
            with contextlib.suppress(ValueError):
                content.translate(env, target)
    # What a receiving agent does with a peer's message: never raises.
    message = Message("acme/fuzz/env", 1, SENDER, data)
    wrapped = to_envelope(message)
    assert isinstance(wrapped, Envelope)
    assert (parse(message) is None) == (env is None)


def test_mutated_envelopes() -> None:
    with counted("envelopes (mutated)") as case:

        @settings_for(BATCH)
        @given(batch=batches(SEEDS))
        def run(batch: list[bytes]) -> None:
            for data in batch:
                case()
                check(data)

        run()


def test_nested_headers_are_a_value_error() -> None:
    """A header of nested arrays or objects, well under 64 KiB, once overflowed the JSON
    decoder's recursion limit: a RecursionError out of deserialize, and out of every
    receive path that parses a peer's envelope."""
    for opener, closer in ((b"[", b"]"), (b'{"a":', b"}")):
        body = b'{"p":"raw","ct":"x","md":' + opener * 20_000 + b"1" + closer * 20_000 + b"}"
        if len(body) > 65_536:
            body = b'{"p":"raw","ct":"x","md":' + opener * 6_000 + b"1" + closer * 6_000 + b"}"
        data = struct.pack("<I", len(body)) + body
        with pytest.raises(ValueError, match="not JSON"):
            Envelope.deserialize(data)
        check(data)


@st.composite
def headers(draw: st.DrawFn) -> bytes:
    """Structurally plausible headers: JSON values in every field, or nesting bombs."""
    json_values = st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
        ),
        max_leaves=8,
    )
    header: dict[str, object] = {}
    types = st.sampled_from(
        [
            content.JSON_TYPE,
            content.PARTS_TYPE,
            content.A2A_MESSAGE_TYPE,
            content.A2A_RPC_TYPE,
            content.TEXT_TYPE,
        ]
    )
    for key, good in (
        ("p", st.sampled_from([p.value for p in Protocol])),
        ("ct", types | st.text()),
        ("md", st.dictionaries(st.text(max_size=4), json_values, max_size=3)),
    ):
        choice = draw(st.integers(0, 3))
        if choice == 0:
            continue
        header[key] = draw(good if choice < 3 else json_values)
    encoded = json.dumps(header, separators=(",", ":")).encode()
    if draw(st.booleans()):
        depth = draw(st.integers(1, 30_000))
        encoded = (
            encoded[:-1] + b',"z":' + b"[" * depth + b"]" * depth + b"}"
            if len(encoded) > 2
            else encoded
        )
    length = len(encoded) if draw(st.integers(0, 9)) else draw(st.integers(0, 2**32 - 1))
    depth = draw(st.integers(1, 5_000))
    payload = draw(
        st.one_of(
            st.binary(max_size=32),
            st.just(b"[" * depth + b"]" * depth),
            json_values.map(
                lambda v: json.dumps({"jsonrpc": "2.0", "method": "m", "params": v}).encode()
            ),
            json_values.map(lambda v: json.dumps([{"type": "data", "data": v}]).encode()),
            st.just(
                json.dumps({"jsonrpc": "2.0", "id": 1, "params": {"x": 1}})[:-2].encode()
                + b"[" * depth
                + b"1"
                + b"]" * depth
                + b"}}"
            ),
            st.just(
                b'{"messageId":"m","role":"ROLE_USER","parts":[{"data":'
                + b"[" * depth
                + b"]" * depth
                + b"}]}"
            ),
        )
    )
    return struct.pack("<I", length) + encoded + payload


def test_structured_headers() -> None:
    """Beside the 10,000 mutations above, a fifth as many generated headers and payloads
    (JSON of every shape, nesting bombs, the adapters' content types): each runs every
    translation, several ms a case."""
    with counted("envelopes (structured)", EXAMPLES // 5) as case:

        @settings(FUZZ, max_examples=EXAMPLES // 5)
        @given(data=headers())
        def run(data: bytes) -> None:
            case()
            check(data)

        run()
