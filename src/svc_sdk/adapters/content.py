"""What the adapters carry, and how it maps between A2A, SLIM and MCP (docs/protocols.md).

Every protocol's message is read into one neutral :class:`Content`: a list of *parts*
in the documented dict form (``{"type": "text", "text": ...}``, ``{"type": "data", "data":
...}``, ``{"type": "file", "file": {...}}``) plus ``meta``, the protocol-specific fields
that have no place in the others (an A2A messageId, an MCP request id, SLIM metadata),
kept under the protocol's name so that the way back can restore them. Translating is
reading into Content and writing out of it; nothing that cannot map is dropped.

The A2A conversions use the real a2a-sdk types (``pip install 'svc-sdk[a2a]'``).
"""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from svc_sdk.envelope import Envelope, Protocol
from svc_sdk.extras import require

if TYPE_CHECKING:
    from a2a.types import Message as A2AMessage
    from a2a.types import Part as A2APart

Part = dict[str, Any]

A2A_MESSAGE_TYPE = "application/a2a+json"  # an A2A Message in A2A's JSON form
A2A_RPC_TYPE = "application/a2a-rpc+json"  # A2A JSON-RPC requests and responses
PARTS_TYPE = "application/vnd.svc.parts+json"  # a list of parts, when one payload is not enough
TEXT_TYPE = "text/plain; charset=utf-8"
# Also the content type of MCP envelopes (one JSON-RPC 2.0 message each): the envelope's
# protocol tag says MCP, the content type only how the payload is encoded.
JSON_TYPE = "application/json"
OCTETS = "application/octet-stream"
SLIM_FILENAME = "svc.filename"  # SLIM metadata key naming a file payload
A2A_CARRIED = "svc.carried"  # A2A Message.metadata key holding other protocols' fields
MCP_LOGGER = "svc"  # the logger of MCP notifications that carry translated messages


@dataclass
class Content:
    parts: list[Part]
    meta: dict[str, Any] = field(default_factory=dict)


# -- parts -----------------------------------------------------------------------------


def normalize_part(part: object) -> Part:
    """Checks a part dict and returns it in canonical form (``kind`` is accepted as an
    alias of ``type``, as A2A 0.3 spells it). Raises ValueError saying what is wrong."""
    if not isinstance(part, dict):
        raise ValueError(f"a part is a dict with 'type', not {type(part).__name__}")
    kind = part.get("type", part.get("kind"))
    out: Part
    if kind == "text":
        if not isinstance(part.get("text"), str):
            raise ValueError("a text part needs 'text' (str)")
        out = {"type": "text", "text": part["text"]}
    elif kind == "data":
        if "data" not in part:
            raise ValueError("a data part needs 'data' (any JSON value)")
        try:
            json.dumps(part["data"], allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"a data part's 'data' must be JSON: {exc}") from None
        out = {"type": "data", "data": part["data"]}
    elif kind == "file":
        out = {"type": "file", "file": _normalize_file(part.get("file"))}
    else:
        raise ValueError(f"unknown part type {kind!r}; expected 'text', 'data' or 'file'")
    metadata = part.get("metadata")
    if metadata is not None:
        if not isinstance(metadata, dict):
            raise ValueError("a part's 'metadata' must be a dict")
        out["metadata"] = metadata
    return out


def _normalize_file(file: object) -> dict[str, Any]:
    if not isinstance(file, dict):
        raise ValueError("a file part needs 'file': {'bytes': base64 or 'uri': str, ...}")
    out: dict[str, Any] = {}
    has_bytes, has_uri = "bytes" in file, "uri" in file
    if has_bytes == has_uri:
        raise ValueError("a file part needs exactly one of 'bytes' (base64) and 'uri'")
    if has_bytes:
        raw = file["bytes"]
        if isinstance(raw, bytes | bytearray):
            out["bytes"] = base64.b64encode(raw).decode()
        elif isinstance(raw, str):
            try:
                base64.b64decode(raw, validate=True)
            except binascii.Error:
                raise ValueError("a file part's 'bytes' must be base64") from None
            out["bytes"] = raw
        else:
            raise ValueError("a file part's 'bytes' must be base64 str or bytes")
    else:
        if not isinstance(file["uri"], str) or not file["uri"]:
            raise ValueError("a file part's 'uri' must be a non-empty str")
        out["uri"] = file["uri"]
    for key in ("name", "mimeType"):
        if file.get(key) is not None:
            if not isinstance(file[key], str):
                raise ValueError(f"a file part's {key!r} must be a str")
            out[key] = file[key]
    return out


def normalize_parts(parts: object) -> list[Part]:
    if not isinstance(parts, list | tuple) or not parts:
        raise ValueError("parts must be a non-empty list of part dicts")
    return [normalize_part(part) for part in parts]


def _file_bytes(part: Part) -> bytes:
    return base64.b64decode(part["file"]["bytes"])


def _ints(value: Any) -> Any:
    # protobuf's Value holds every number as a double: 3 comes back as 3.0. JSON does not
    # tell them apart, so integral numbers become ints again on the way out of A2A.
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, dict):
        return {k: _ints(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_ints(v) for v in value]
    return value


def _dumps(value: Any) -> bytes:
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
    except RecursionError:  # nesting that decoded, one call deeper, does not encode
        raise ValueError("the JSON value is nested too deeply") from None


def _loads(payload: bytes | str, what: str) -> Any:
    # A peer's bytes: besides malformed JSON (ValueError), nesting deeper than the
    # decoder's recursion limit is a RecursionError; both are "not valid JSON".
    try:
        return json.loads(payload)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"{what} is not valid JSON: {exc}") from None


# -- A2A -------------------------------------------------------------------------------

_ROLES = {"user": "ROLE_USER", "agent": "ROLE_AGENT"}


def a2a_message(
    parts: list[Part],
    *,
    message_id: str | None = None,
    context_id: str = "",
    task_id: str = "",
    role: str = "agent",
    metadata: dict[str, Any] | None = None,
) -> A2AMessage:
    """A real ``a2a.types.Message`` from parts in dict form."""
    types = require("a2a.types", "a2a", "A2A messages")
    json_format = require("google.protobuf.json_format", "a2a", "A2A messages")
    if role not in _ROLES:
        raise ValueError(f"role must be 'user' or 'agent', not {role!r}")
    if metadata is not None and not isinstance(metadata, dict):
        raise TypeError(f"metadata must be a dict or None, not {type(metadata).__name__}")
    try:
        message = types.Message(
            message_id=message_id or str(uuid.uuid4()),
            context_id=context_id,
            task_id=task_id,
            role=_ROLES[role],
            parts=[_to_a2a_part(part) for part in normalize_parts(parts)],
        )
        if metadata:
            message.metadata.update(metadata)
    except (json_format.ParseError, RecursionError) as exc:  # data nested past protobuf's 100
        raise ValueError(f"cannot carry this in an A2A message: {exc}") from None
    return cast("A2AMessage", message)


def _to_a2a_part(part: Part) -> A2APart:
    types = require("a2a.types", "a2a", "A2A messages")
    json_format = require("google.protobuf.json_format", "a2a", "A2A messages")
    struct_pb2 = require("google.protobuf.struct_pb2", "a2a", "A2A messages")
    out = types.Part()
    if part["type"] == "text":
        out.text = part["text"]
    elif part["type"] == "data":
        out.data.CopyFrom(json_format.ParseDict(part["data"], struct_pb2.Value()))
    else:
        file = part["file"]
        if "bytes" in file:
            out.raw = _file_bytes(part)
        else:
            out.url = file["uri"]
        out.filename = file.get("name", "")
        out.media_type = file.get("mimeType", "")
    if part.get("metadata"):
        out.metadata.update(part["metadata"])
    return cast("A2APart", out)


def _from_a2a_part(part: A2APart) -> Part:
    json_format = require("google.protobuf.json_format", "a2a", "A2A messages")
    kind = part.WhichOneof("content")
    out: Part
    if kind == "text":
        out = {"type": "text", "text": part.text}
    elif kind == "data":
        out = {"type": "data", "data": _ints(json_format.MessageToDict(part.data))}
    elif kind in ("raw", "url"):
        file: dict[str, Any] = (
            {"bytes": base64.b64encode(part.raw).decode()} if kind == "raw" else {"uri": part.url}
        )
        if part.filename:
            file["name"] = part.filename
        if part.media_type:
            file["mimeType"] = part.media_type
        out = {"type": "file", "file": file}
    else:
        raise ValueError("an A2A part without content")
    if part.HasField("metadata"):
        out["metadata"] = _ints(json_format.MessageToDict(part.metadata))
    return out


def encode_a2a(message: A2AMessage) -> bytes:
    json_format = require("google.protobuf.json_format", "a2a", "A2A messages")
    try:
        return _dumps(json_format.MessageToDict(message))
    except json_format.SerializeToJsonError as exc:  # NaN or infinity in a data part
        raise ValueError(f"cannot encode the A2A message: {exc}") from None


def decode_a2a(payload: bytes) -> A2AMessage:
    """Parses an A2A Message in A2A's JSON form; ValueError if it is not one."""
    types = require("a2a.types", "a2a", "A2A messages")
    json_format = require("google.protobuf.json_format", "a2a", "A2A messages")
    obj = _loads(payload, "A2A message")
    if not isinstance(obj, dict):
        raise ValueError("an A2A message is a JSON object")
    try:
        message = json_format.ParseDict(obj, types.Message())
    except json_format.ParseError as exc:
        raise ValueError(f"not an A2A message: {exc}") from None
    if not message.parts:
        raise ValueError("an A2A message needs at least one part")
    return cast("A2AMessage", message)


def a2a_to_dict(message: A2AMessage) -> dict[str, Any]:
    """The A2A message as the adapter's dicts: messageId, contextId, role ("user" or
    "agent"), parts, and taskId/metadata when set."""
    json_format = require("google.protobuf.json_format", "a2a", "A2A messages")
    out: dict[str, Any] = {
        "messageId": message.message_id,
        "contextId": message.context_id,
        "role": "user" if message.role == 1 else "agent",
        "parts": [_from_a2a_part(part) for part in message.parts],
    }
    if message.task_id:
        out["taskId"] = message.task_id
    if message.HasField("metadata"):
        out["metadata"] = _ints(json_format.MessageToDict(message.metadata))
    if message.extensions:
        out["extensions"] = list(message.extensions)
    if message.reference_task_ids:
        out["referenceTaskIds"] = list(message.reference_task_ids)
    return out


def from_a2a(envelope: Envelope) -> Content:
    fields = a2a_to_dict(decode_a2a(envelope.payload))
    parts = fields.pop("parts")
    metadata = fields.get("metadata") or {}
    carried = metadata.pop(A2A_CARRIED, None)
    if not metadata:
        fields.pop("metadata", None)
    meta: dict[str, Any] = dict(carried) if isinstance(carried, dict) else {}
    meta["a2a"] = fields
    return Content(parts, meta)


def to_a2a(content: Content) -> Envelope:
    fields = content.meta.get("a2a") or {}
    metadata = dict(fields.get("metadata") or {})
    carried = {k: v for k, v in content.meta.items() if k != "a2a"}
    if carried:
        metadata[A2A_CARRIED] = carried
    message = a2a_message(
        content.parts,
        message_id=fields.get("messageId"),
        context_id=fields.get("contextId", ""),
        task_id=fields.get("taskId", ""),
        # A message bridged in from elsewhere is a request to the A2A side.
        role=fields.get("role", "user"),
        metadata=metadata or None,
    )
    if fields.get("extensions"):
        message.extensions.extend(fields["extensions"])
    if fields.get("referenceTaskIds"):
        message.reference_task_ids.extend(fields["referenceTaskIds"])
    return Envelope(Protocol.A2A, A2A_MESSAGE_TYPE, encode_a2a(message))


# -- SLIM ------------------------------------------------------------------------------


def _is_json_type(content_type: str) -> bool:
    base = content_type.split(";")[0].strip().lower()
    return base == "application/json" or base.endswith("+json")


def from_slim(envelope: Envelope) -> Content:
    metadata = dict(envelope.metadata or {})
    meta: dict[str, Any] = {k: metadata.pop(k) for k in ("a2a", "mcp") if k in metadata}
    name = metadata.pop(SLIM_FILENAME, None)
    parts = _slim_parts(envelope.content_type, envelope.payload, name)
    slim: dict[str, Any] = {}
    if metadata:
        slim["metadata"] = metadata
    if envelope.content_type != _slim_type(parts, ""):
        slim["contentType"] = envelope.content_type  # kept only when to_slim would not guess it
    if slim:
        meta["slim"] = slim
    return Content(parts, meta)


def _slim_parts(content_type: str, payload: bytes, name: object) -> list[Part]:
    ct = content_type.split(";")[0].strip().lower()
    if ct == PARTS_TYPE:
        return normalize_parts(_loads(payload, "a SLIM parts payload"))
    if ct.startswith("text/"):
        try:
            return [{"type": "text", "text": payload.decode()}]
        except UnicodeDecodeError:
            pass  # not text after all: carried as a file
    elif _is_json_type(ct):
        try:
            return [{"type": "data", "data": json.loads(payload)}]
        except (ValueError, RecursionError):
            pass  # not JSON after all: carried as a file
    file: dict[str, Any] = {"bytes": base64.b64encode(payload).decode(), "mimeType": ct or OCTETS}
    if isinstance(name, str):
        file["name"] = name
    return [{"type": "file", "file": file}]


def _slim_single(parts: list[Part]) -> Part | None:
    """The part that can be a SLIM payload by itself, if there is exactly one."""
    if len(parts) != 1 or "metadata" in parts[0]:
        return None
    part = parts[0]
    return None if part["type"] == "file" and "bytes" not in part["file"] else part


def _slim_type(parts: list[Part], original: str) -> str:
    single = _slim_single(parts)
    if single is None:
        return PARTS_TYPE
    if single["type"] == "text":
        return original if original.lower().startswith("text/") else TEXT_TYPE
    if single["type"] == "data":
        return original if _is_json_type(original) else JSON_TYPE
    return str(single["file"].get("mimeType") or OCTETS)


def to_slim(content: Content) -> Envelope:
    slim = content.meta.get("slim") or {}
    metadata: dict[str, Any] = dict(slim.get("metadata") or {})
    metadata.update({k: v for k, v in content.meta.items() if k != "slim"})
    ct = _slim_type(content.parts, slim.get("contentType", ""))
    single = _slim_single(content.parts)
    if single is None:
        payload = _dumps(content.parts)
    elif single["type"] == "text":
        payload = single["text"].encode()
    elif single["type"] == "data":
        payload = _dumps(single["data"])
    else:
        payload = _file_bytes(single)
        if "name" in single["file"]:
            metadata[SLIM_FILENAME] = single["file"]["name"]
    return Envelope(Protocol.SLIM, ct, payload, metadata or None)


# -- MCP -------------------------------------------------------------------------------


def decode_jsonrpc(payload: bytes) -> dict[str, Any]:
    """One JSON-RPC 2.0 message; ValueError if the payload is not one."""
    obj = _loads(payload, "JSON-RPC message")
    if not isinstance(obj, dict) or obj.get("jsonrpc") != "2.0":
        raise ValueError('a JSON-RPC message is an object with "jsonrpc": "2.0"')
    return obj


def _is_jsonrpc(value: Any) -> bool:
    return isinstance(value, dict) and value.get("jsonrpc") == "2.0"


def _to_block(part: Part, index: int) -> dict[str, Any]:
    block: dict[str, Any]
    if part["type"] == "text":
        block = {"type": "text", "text": part["text"]}
    elif part["type"] == "data":
        block = {
            "type": "resource",
            "resource": {
                "uri": f"svc:data/{index}",
                "mimeType": JSON_TYPE,
                "text": json.dumps(part["data"], ensure_ascii=False),
            },
        }
    else:
        file = part["file"]
        if "uri" in file:
            block = {"type": "resource_link", "uri": file["uri"], "name": file.get("name", "")}
            if "mimeType" in file:
                block["mimeType"] = file["mimeType"]
        else:
            block = {
                "type": "resource",
                "resource": {
                    "uri": f"svc:file/{index}",
                    "mimeType": file.get("mimeType", OCTETS),
                    "blob": file["bytes"],
                },
            }
            if "name" in file:
                block["_meta"] = {"svc/name": file["name"]}
    if part.get("metadata"):
        block.setdefault("_meta", {})["svc/metadata"] = part["metadata"]
    return block


def _from_block(block: Any) -> Part | None:
    if not isinstance(block, dict):
        return None
    kind = block.get("type")
    found = block.get("_meta")
    meta: dict[str, Any] = found if isinstance(found, dict) else {}
    part: Part | None = None
    if kind == "text" and isinstance(block.get("text"), str):
        part = {"type": "text", "text": block["text"]}
    elif kind == "resource" and isinstance(block.get("resource"), dict):
        res = block["resource"]
        uri = str(res.get("uri", ""))
        if uri.startswith("svc:data/") and isinstance(res.get("text"), str):
            part = {"type": "data", "data": _loads(res["text"], "an MCP data resource")}
        elif isinstance(res.get("blob"), str):
            file = {"bytes": res["blob"], "mimeType": res.get("mimeType", OCTETS)}
            if isinstance(meta.get("svc/name"), str):
                file["name"] = meta["svc/name"]
            part = {"type": "file", "file": file}
        elif isinstance(res.get("text"), str):
            part = {"type": "text", "text": res["text"]}
    elif kind == "resource_link" and isinstance(block.get("uri"), str):
        file = {"uri": block["uri"]}
        for key in ("name", "mimeType"):
            if block.get(key):
                file[key] = block[key]
        part = {"type": "file", "file": file}
    elif kind in ("image", "audio") and isinstance(block.get("data"), str):
        mime = block.get("mimeType") or OCTETS
        part = {"type": "file", "file": {"bytes": block["data"], "mimeType": mime}}
    if part is not None and isinstance(meta.get("svc/metadata"), dict):
        part["metadata"] = meta["svc/metadata"]
    return normalize_part(part) if part is not None else None


def from_mcp(envelope: Envelope) -> Content:
    obj = decode_jsonrpc(envelope.payload)
    params = obj.get("params")
    data = params.get("data") if isinstance(params, dict) else None
    if (
        obj.get("method") == "notifications/message"
        and isinstance(params, dict)
        and params.get("logger") == MCP_LOGGER
        and isinstance(data, dict)
        and isinstance(data.get("content"), list)
    ):
        parts: list[Part] = []
        unmapped: list[Any] = []
        for block in data["content"]:
            part = _from_block(block)
            if part is None:
                unmapped.append(block)
            else:
                parts.append(part)
        meta = dict(data.get("meta") or {})
        if unmapped:
            meta.setdefault("mcp", {})["unmapped"] = unmapped
        if not parts:
            parts = [{"type": "data", "data": {"content": unmapped}}]
        return Content(parts, meta)
    # Any other JSON-RPC message (request, response, notification) travels whole.
    info = {k: obj[k] for k in ("method", "id") if k in obj}
    return Content([{"type": "data", "data": obj}], {"mcp": info})


def to_mcp(content: Content) -> Envelope:
    parts = content.parts
    if len(parts) == 1 and parts[0]["type"] == "data" and _is_jsonrpc(parts[0]["data"]):
        # A JSON-RPC message that went through another protocol: unwrapped as it was.
        return Envelope(Protocol.MCP, JSON_TYPE, _dumps(parts[0]["data"]))
    meta = {k: v for k, v in content.meta.items() if k != "mcp"}
    data: dict[str, Any] = {"content": [_to_block(p, i) for i, p in enumerate(parts)]}
    if meta:
        data["meta"] = meta
    notification = {
        "jsonrpc": "2.0",
        "method": "notifications/message",
        "params": {"level": "info", "logger": MCP_LOGGER, "data": data},
    }
    return Envelope(Protocol.MCP, JSON_TYPE, _dumps(notification))


READERS = {Protocol.A2A: from_a2a, Protocol.SLIM: from_slim, Protocol.MCP: from_mcp}
WRITERS = {Protocol.A2A: to_a2a, Protocol.SLIM: to_slim, Protocol.MCP: to_mcp}


def carries(protocol: Protocol, envelope: Envelope) -> bool:
    """Whether ``envelope`` is a message of ``protocol`` that the bridge translates (A2A
    RPC frames are not messages; they belong to the A2A transport)."""
    if envelope.protocol is not protocol:
        return False
    return protocol is not Protocol.A2A or envelope.content_type == A2A_MESSAGE_TYPE


def translate(envelope: Envelope, target: Protocol) -> Envelope:
    """``envelope`` rewritten for ``target``; ValueError if it is malformed."""
    if envelope.protocol not in READERS or target not in WRITERS:
        raise ValueError(f"no translation from {envelope.protocol.name} to {target.name}")
    try:
        return WRITERS[target](READERS[envelope.protocol](envelope))
    except (TypeError, AttributeError, KeyError) as exc:
        # A peer's fields of the wrong shape (a list where the A2A fields go, a number
        # as a message id) deep in a reader or writer: malformed input all the same.
        raise ValueError(f"cannot translate this {envelope.protocol.name} message: {exc}") from None
