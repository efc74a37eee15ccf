"""The mapping between A2A, SLIM and MCP (pure functions; docs/protocols.md)."""

from __future__ import annotations

import base64
import contextlib
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from svc_sdk import Envelope, Protocol
from svc_sdk.adapters import content
from svc_sdk.adapters.content import Content, translate

TRANSLATED = [Protocol.A2A, Protocol.SLIM, Protocol.MCP]
PAIRS = [(a, b) for a in TRANSLATED for b in TRANSLATED if a is not b]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
parts = st.lists(
    st.one_of(
        st.builds(lambda t: {"type": "text", "text": t}, st.text(max_size=50)),
        st.builds(lambda d: {"type": "data", "data": d}, json_values),
    ),
    min_size=1,
    max_size=4,
)


def envelope_of(protocol: Protocol, message_parts: list[dict[str, Any]]) -> Envelope:
    """A message of ``protocol`` carrying ``message_parts`` as natively as it can."""
    if protocol is Protocol.A2A:
        return content.to_a2a(Content(message_parts, {"a2a": {"role": "agent"}}))
    if protocol is Protocol.SLIM:
        return content.to_slim(Content(message_parts))
    return content.to_mcp(Content(message_parts))


def parts_of(envelope: Envelope) -> list[dict[str, Any]]:
    return content.READERS[envelope.protocol](envelope).parts


@pytest.mark.parametrize(("a", "b"), PAIRS, ids=lambda p: p.name)
@given(message_parts=parts)
def test_text_and_data_survive_a_round_trip(
    a: Protocol, b: Protocol, message_parts: list[dict[str, Any]]
) -> None:
    original = envelope_of(a, message_parts)
    there = translate(original, b)
    assert there.protocol is b
    back = translate(there, a)
    assert parts_of(back) == message_parts
    # Everything of the original comes back; the hop may add its own fields (provenance).
    read = content.READERS[a]
    hop = b.name.lower()
    assert {k: v for k, v in read(back).meta.items() if k != hop} == read(original).meta


@pytest.mark.parametrize("target", [Protocol.A2A, Protocol.SLIM], ids=lambda p: p.name)
def test_an_mcp_request_comes_back_byte_for_byte(target: Protocol) -> None:
    request = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "add"}}
    original = Envelope(Protocol.MCP, "application/json", json.dumps(request).encode())
    there = translate(original, target)
    assert parts_of(there) == [{"type": "data", "data": request}]
    assert json.loads(translate(there, Protocol.MCP).payload) == request


def test_a2a_fields_are_carried_through_slim_and_mcp() -> None:
    meta = {"a2a": {"messageId": "m-1", "contextId": "c", "taskId": "t", "role": "user"}}
    original = content.to_a2a(Content([{"type": "text", "text": "hi"}], meta))
    for hop in (Protocol.SLIM, Protocol.MCP):
        back = translate(translate(original, hop), Protocol.A2A)
        fields = content.a2a_to_dict(content.decode_a2a(back.payload))
        assert fields["messageId"] == "m-1" and fields["taskId"] == "t"
        assert fields["role"] == "user" and fields["contextId"] == "c"


def test_files_map_to_each_protocol() -> None:
    png = {
        "type": "file",
        "file": {
            "bytes": base64.b64encode(b"\x89PNG").decode(),
            "name": "dot.png",
            "mimeType": "image/png",
        },
    }
    link: dict[str, Any] = {
        "type": "file",
        "file": {"uri": "https://example.com/a.pdf", "name": "a.pdf"},
    }
    a2a = content.to_a2a(Content([png, link]))
    assert parts_of(a2a) == [png, link]
    slim = translate(content.to_a2a(Content([png])), Protocol.SLIM)
    assert (slim.content_type, slim.payload) == ("image/png", b"\x89PNG")
    assert slim.metadata is not None and slim.metadata["svc.filename"] == "dot.png"
    mcp = json.loads(translate(a2a, Protocol.MCP).payload)
    blocks = mcp["params"]["data"]["content"]
    assert blocks[0]["type"] == "resource" and blocks[0]["resource"]["mimeType"] == "image/png"
    assert blocks[1] == {"type": "resource_link", "uri": link["file"]["uri"], "name": "a.pdf"}
    assert parts_of(translate(a2a, Protocol.MCP)) == [png, link]


def test_slim_payloads_by_content_type() -> None:
    def read(ct: str, payload: bytes) -> list[dict[str, Any]]:
        return content.from_slim(Envelope(Protocol.SLIM, ct, payload)).parts

    assert read("text/markdown", b"# hi") == [{"type": "text", "text": "# hi"}]
    assert read("application/ld+json", b'{"a":1}') == [{"type": "data", "data": {"a": 1}}]
    (bad_text,) = read("text/plain", b"\xff\xfe")  # not UTF-8: carried as a file, not lost
    assert bad_text["type"] == "file" and base64.b64decode(bad_text["file"]["bytes"]) == b"\xff\xfe"
    # A content type that the way back would not guess is kept for it.
    back = translate(
        translate(Envelope(Protocol.SLIM, "text/markdown", b"#"), Protocol.A2A), Protocol.SLIM
    )
    assert back.content_type == "text/markdown"


def test_unmapped_mcp_content_is_kept_in_metadata() -> None:
    note = {
        "jsonrpc": "2.0",
        "method": "notifications/message",
        "params": {
            "level": "info",
            "logger": "svc",
            "data": {
                "content": [{"type": "text", "text": "hello"}, {"type": "hologram", "depth": 3}]
            },
        },
    }
    read = content.from_mcp(Envelope(Protocol.MCP, "application/json", json.dumps(note).encode()))
    assert read.parts == [{"type": "text", "text": "hello"}]
    assert read.meta["mcp"]["unmapped"] == [{"type": "hologram", "depth": 3}]


@pytest.mark.parametrize(
    ("protocol", "payload"),
    [
        (Protocol.A2A, b"not json"),
        (Protocol.A2A, b'{"messageId": "x", "parts": []}'),
        (Protocol.A2A, b'{"unknownField": 1}'),
        (Protocol.A2A, b"[1, 2]"),
        (Protocol.MCP, b'{"id": 1}'),
        (Protocol.MCP, b"\xff"),
        (Protocol.MCP, b"[]"),
    ],
)
def test_malformed_payloads_raise_value_error(protocol: Protocol, payload: bytes) -> None:
    ct = content.A2A_MESSAGE_TYPE if protocol is Protocol.A2A else "application/json"
    with pytest.raises(ValueError):
        translate(Envelope(protocol, ct, payload), Protocol.SLIM)
    with pytest.raises(ValueError):
        translate(Envelope(Protocol.SLIM, content.PARTS_TYPE, payload), protocol)


@pytest.mark.parametrize(
    ("part", "message"),
    [
        ("text", "a part is a dict"),
        ({"type": "text"}, "needs 'text'"),
        ({"type": "video", "video": 1}, "unknown part type 'video'"),
        ({"type": "data", "data": float("nan")}, "must be JSON"),
        ({"type": "file", "file": {}}, "exactly one of"),
        ({"type": "file", "file": {"bytes": "***"}}, "must be base64"),
        ({"type": "text", "text": "x", "metadata": 3}, "'metadata' must be a dict"),
    ],
)
def test_bad_parts_say_what_is_wrong(part: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        content.normalize_part(part)


def test_kind_is_accepted_as_type() -> None:
    assert content.normalize_part({"kind": "text", "text": "x"}) == {"type": "text", "text": "x"}


def test_raw_is_not_translated() -> None:
    with pytest.raises(ValueError, match="no translation from RAW"):
        translate(Envelope(Protocol.RAW, "text/plain", b"x"), Protocol.SLIM)


@pytest.mark.parametrize(
    "envelope",
    [
        # JSON nested past the decoder's recursion limit (was RecursionError).
        Envelope(Protocol.SLIM, content.JSON_TYPE, b"[" * 5000 + b"]" * 5000),
        Envelope(Protocol.SLIM, content.PARTS_TYPE, b"[" * 5000 + b"]" * 5000),
        Envelope(Protocol.MCP, content.JSON_TYPE, b"[" * 5000 + b"]" * 5000),
        # Data nested past protobuf's limit of 100, into A2A (was ParseError).
        Envelope(
            Protocol.SLIM,
            content.PARTS_TYPE,
            b'[{"type":"data","data":' + b"[" * 150 + b"]" * 150 + b"}]",
        ),
        # Infinity in peer metadata, into A2A (was SerializeToJsonError).
        Envelope(Protocol.SLIM, content.TEXT_TYPE, b"hi", {"x": float("inf")}),
        # Carried fields of the wrong shape (were AttributeError and TypeError); found by
        # a SVC_FUZZ_RANDOM=1 run of tests/fuzz/test_envelopes.py.
        Envelope(Protocol.SLIM, content.TEXT_TYPE, b"hi", {"a2a": [None]}),
        Envelope(Protocol.SLIM, content.TEXT_TYPE, b"hi", {"a2a": {"messageId": 5}}),
        Envelope(Protocol.SLIM, content.TEXT_TYPE, b"hi", {"a2a": {"metadata": [1]}}),
        Envelope(Protocol.SLIM, content.TEXT_TYPE, b"hi", {"a2a": {"extensions": [None]}}),
        Envelope(Protocol.SLIM, content.TEXT_TYPE, b"hi", {"mcp": [None]}),
        Envelope(Protocol.SLIM, content.TEXT_TYPE, b"hi", {"mcp": {"id": [], "method": 5}}),
    ],
)
def test_hostile_payloads_are_a_value_error(envelope: Envelope) -> None:
    """translate's contract is ValueError for what it cannot read or carry; these escaped
    as other exceptions (tests/fuzz/test_envelopes.py found them)."""
    for target in content.WRITERS:
        with contextlib.suppress(ValueError):
            translate(envelope, target)
