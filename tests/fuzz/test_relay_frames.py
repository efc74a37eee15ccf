"""Fuzz target: the relay's gRPC stream, fed raw ClientFrame bytes by a member of a
channel — mutations of genuine frames, and well-formed frames carrying mutated MLS
messages, so the cases reach the relay's checks of names, sizes, wire formats and its
validation of commits against the tracked group.

Every frame gets a Reply, or the stream ends with a gRPC status the protocol documents;
never UNAVAILABLE (the relay's answer when a handler raised: a bug, the backend being
healthy), never a hang, never a dead relay. Afterwards the fuzzed channel is exactly as
its owner thinks it is (a genuine commit and message are accepted) and a client on
another channel works."""

from __future__ import annotations

import queue
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from svc_sdk._relay_pb import relay_pb2 as pb
from svc_sdk.api_client import ApiClient
from svc_sdk.mls import Group
from svc_sdk.relay_client import Request, client_frame
from svc_sdk.testing import LocalStack
from svc_server.relay.denials import DENIALS_PER_SECOND

from ..client.helpers import pair, take
from ..relay.helpers import engine
from .mutate import counted, mutations, settings_for

pytestmark = pytest.mark.fuzz

CHANNEL = "acme/fuzz/relay"
DENIALS_REFILL = 2 / DENIALS_PER_SECOND
NEW_CHANNEL = "acme/fuzz/new"
METHOD = "/svc.relay.v1.Relay/Connect"
# The Reply codes the relay documents (proto/relay.proto) and uses; 8 once the fuzzing
# account has caused more refusals than its budget (server/relay/denials.py).
REPLY_CODES = {0, 3, 6, 7, 8, 9, 11, 16}
# How a fuzzed stream may end: a Refresh with a bad token, a frame over the size limit.
END_CODES = {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.RESOURCE_EXHAUSTED}


class Ended:
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self.code, self.details = code, details


class RawStream:
    """A Connect stream that writes bytes as they are and reads ServerFrames."""

    def __init__(self, target: str, token: str, identity: bytes) -> None:
        self.channel = grpc.insecure_channel(target)
        self.requests: queue.Queue[bytes | None] = queue.Queue()
        self.out: queue.Queue[bytes | Ended] = queue.Queue()
        call = self.channel.stream_stream(METHOD)  # no serializers: raw bytes both ways
        self.responses = call(
            iter(self.requests.get, None),
            metadata=[("authorization", f"Bearer {token}"), ("svc-identity", identity.hex())],
        )
        self.ended: Ended | None = None
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for item in self.responses:
                self.out.put(item)
            self.out.put(Ended(grpc.StatusCode.OK, ""))
        except grpc.RpcError as exc:
            self.out.put(Ended(exc.code(), exc.details() or ""))

    def exchange(self, frame: bytes, timeout: float = 20.0) -> pb.Reply | Ended:
        """Sends ``frame``; the next Reply, or how the stream ended."""
        return self.exchange_many([frame], timeout)[0]

    def exchange_many(self, frames: list[bytes], timeout: float = 20.0) -> list[pb.Reply | Ended]:
        """Sends ``frames`` at once (a client may pipeline); a Reply for each (in the
        order they come), or how the stream ended."""
        for frame in frames:
            self.requests.put(frame)
        results: list[pb.Reply | Ended] = []
        while len(results) < len(frames):
            try:
                item = self.out.get(timeout=timeout)
            except queue.Empty:
                pytest.fail(f"{len(results)} Replies in {timeout} s to {len(frames)} frames")
            if isinstance(item, Ended):
                self.ended = item
                results.append(item)
                break
            server_frame = pb.ServerFrame.FromString(item)
            if server_frame.WhichOneof("kind") == "reply":
                results.append(server_frame.reply)
        return results

    def close(self) -> None:
        self.requests.put(None)
        self.responses.cancel()
        self.channel.close()


@dataclass
class Target:
    stack: LocalStack
    api: ApiClient
    identity: bytes
    group: Group
    frames: list[bytes]  # genuine frames, serialized
    mls: list[bytes]  # genuine MLS messages of every kind
    stream: RawStream | None = None

    def connect(self) -> RawStream:
        if self.stream is not None:
            self.stream.close()
        target = self.stack.relay_url.split("://", 1)[1]
        self.stream = RawStream(target, self.api.token(), self.identity)
        return self.stream

    def send(self, frame: bytes) -> pb.Reply | Ended:
        stream = self.stream if self.stream is not None and self.stream.ended is None else None
        result = (stream or self.connect()).exchange(frame)
        if isinstance(result, pb.Reply) and result.code == 16:  # a refused Refresh ends it
            self.connect()
        return result

    def send_many(self, frames: list[bytes]) -> list[pb.Reply | Ended]:
        stream = self.stream if self.stream is not None and self.stream.ended is None else None
        results = (stream or self.connect()).exchange_many(frames)
        if any(isinstance(r, pb.Reply) and r.code == 16 for r in results):
            self.connect()  # a refused Refresh ended the stream after its Reply
        return results


def frame(request: Request, request_id: int = 1) -> bytes:
    data: bytes = client_frame(request, request_id).SerializeToString()
    return data


@pytest.fixture(scope="module")
def target(stack: LocalStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    root: Path = tmp_path_factory.mktemp("fuzz-relay")
    identity = b"fuzz-owner"
    owner = engine(root, identity.decode(), (stack.api_url, stack.api_key))
    api = ApiClient(stack.api_url, stack.api_key)
    group = owner.create_group(CHANNEL.encode())
    t = Target(stack, api, identity, group, [], [])
    reply = t.connect().exchange(
        frame(pb.CreateChannel(channel=CHANNEL, group_info=group.group_info()))
    )
    assert isinstance(reply, pb.Reply) and reply.code == 0, reply
    new_group_info = owner.create_group(NEW_CHANNEL.encode()).group_info()
    joiner = engine(root, "fuzz-joiner", (stack.api_url, stack.api_key))
    # One pending commit, kept until the end: the relay may accept it (a mutation of its
    # frame that leaves the commit intact), and the owner then applies it.
    pending = group.add_members([joiner.generate_key_package()])
    assert pending.welcome is not None
    messages = [group.encrypt(b"genuine"), group.encrypt(b"y" * 200)]
    t.mls = [pending.commit, pending.welcome, *messages, new_group_info, group.group_info()]
    t.frames = [
        frame(pb.CreateChannel(channel=CHANNEL)),
        frame(pb.CreateChannel(channel=NEW_CHANNEL, group_info=new_group_info)),
        frame(pb.Subscribe(channel=CHANNEL, after_seq=1 << 40)),
        frame(pb.Unsubscribe(channel=CHANNEL)),
        frame(pb.Publish(channel=CHANNEL, message=messages[:1])),
        frame(pb.Publish(channel=CHANNEL, message=messages)),
        frame(pb.Commit(channel=CHANNEL, epoch=0, commit=pending.commit, welcome=pending.welcome)),
        frame(pb.Refresh(token=api.token())),
        frame(pb.JoinRequest(channel=CHANNEL, join_id=str(uuid.uuid4()))),
    ]
    yield t
    if t.stream is not None:
        t.stream.close()
    api.close()


CHANNELS = st.sampled_from(
    [
        CHANNEL,
        NEW_CHANNEL,
        "acme/fuzz/other",
        "not a name",
        "",
        "a/b/" + "c" * 65,
        "acme/fuzz/relay\x00",
    ]
)


@st.composite
def structured(draw: st.DrawFn, mls: list[bytes]) -> bytes:
    """A well-formed frame of any kind whose MLS fields are mutated (or genuine)."""
    blob = st.one_of(mutations(mls), st.sampled_from(mls), st.binary(max_size=64))
    channel = draw(CHANNELS)
    request_id = draw(st.one_of(st.just(7), st.integers(0, 2**64 - 1)))
    kind = draw(
        st.sampled_from(
            ["create", "subscribe", "unsubscribe", "publish", "commit", "refresh", "join"]
        )
    )
    if kind == "create":
        body: Request = pb.CreateChannel(channel=channel, group_info=draw(blob))
    elif kind == "subscribe":
        body = pb.Subscribe(channel=channel, after_seq=draw(st.integers(1 << 30, 2**64 - 1)))
    elif kind == "unsubscribe":
        body = pb.Unsubscribe(channel=channel)
    elif kind == "publish":
        body = pb.Publish(channel=channel, message=draw(st.lists(blob, max_size=4)))
    elif kind == "commit":
        body = pb.Commit(
            channel=channel,
            epoch=draw(st.sampled_from([0, 1, 2, 2**64 - 1])),
            commit=draw(blob),
            welcome=draw(st.one_of(st.just(b""), blob)),
        )
    elif kind == "refresh":
        body = pb.Refresh(token=draw(st.text(max_size=64)))
    else:
        body = pb.JoinRequest(
            channel=channel, join_id=draw(st.one_of(st.uuids().map(str), st.text(max_size=40)))
        )
    return frame(body, request_id)


# Frames per example: sent at once, as a pipelining client does, so one round trip
# and one Hypothesis example carry several cases (10,000 one by one took ~70 s).
BATCH = (4, 8)


def test_relay_frames(target: Target) -> None:
    ends: dict[str, int] = {}
    frames = st.one_of(mutations(target.frames), structured(target.mls))
    with counted("relay frames") as case:

        @settings_for(BATCH[0])
        @given(batch=st.lists(frames, min_size=BATCH[0], max_size=BATCH[1]))
        def run(batch: list[bytes]) -> None:
            for result in target.send_many(batch):
                case.cases += isinstance(result, pb.Reply)  # frames the relay answered
                if isinstance(result, Ended):
                    assert result.code in END_CODES, (result.code, result.details)
                    name = result.code.name  # type: ignore[union-attr]
                    ends[name] = ends.get(name, 0) + 1
                else:
                    assert result.code in REPLY_CODES, (result.code, result.message, batch)

        run()
    print("streams ended:", ends)
    proc = target.stack._proc
    assert proc is not None and proc.poll() is None, "the relay process died"
    # The fuzzing spent the account's budget of refused requests; it refills a request
    # that needs a check every 0.1 s, and checks that pass spend nothing. A stream keeps
    # refusing a channel it was throttled on: the genuine requests go on a new one.
    time.sleep(DENIALS_REFILL)
    target.connect()

    # The fuzzed channel is what its owner thinks: reconcile the one pending commit.
    head = target.send(frame(pb.CreateChannel(channel=CHANNEL)))
    assert isinstance(head, pb.Reply) and head.code == 0, head
    if head.epoch == 1:
        target.group.apply_pending_commit()
    else:
        assert head.epoch == 0, head
        target.group.clear_pending_commit()
    update = target.group.self_update()
    reply = target.send(frame(pb.Commit(channel=CHANNEL, epoch=update.epoch, commit=update.commit)))
    assert isinstance(reply, pb.Reply) and reply.code == 0, reply
    target.group.apply_pending_commit()
    reply = target.send(
        frame(pb.Publish(channel=CHANNEL, message=[target.group.encrypt(b"after")]))
    )
    assert isinstance(reply, pb.Reply) and reply.code == 0, reply


def test_other_channels_still_work(stack: LocalStack, target: Target) -> None:
    """Run after the fuzzing (same module, same relay): a normal pair of clients."""
    ca, chan_a, cb, chan_b = pair(stack, "acme/fuzz/after", "fz-a", "fz-b")
    with ca, cb:
        chan_a.send(b"hello after fuzzing")
        assert take(chan_b, 1) == [b"hello after fuzzing"]
