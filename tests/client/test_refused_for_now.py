"""The relay refusing a request for now, seen from a client: RESOURCE_EXHAUSTED for an
account that caused too many refused access checks (server/relay/denials.py). The relay
then refuses every later request of that stream for the channel, so that nothing
pipelined behind the refused request overtakes it; the client sends it again on a new
stream. Here another agent of the account spends the budget, as a buggy or hostile one
would, and a commit makes every stream check the channel again."""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

import pytest

from svc_sdk import Channel, SvcClient
from svc_sdk import channel as channel_module
from svc_sdk.relay_frames import Code, RelayError, Subscribe
from svc_sdk.relay_link import RelayLink, _Sub
from svc_sdk.testing import LocalStack

from .helpers import client, wait_for

# A stream is closed past this many channels it was throttled on (server/relay/session.py);
# the refusing agent starts a new one before.
HELD_BACK_PER_STREAM = 800


class Refusals:
    """Threads of one agent asking for channels its account may not use, each for a new
    one (a channel the stream was throttled on is refused without a check, which spends
    nothing): they keep the account's budget spent while they run."""

    def __init__(self, agent: SvcClient, threads: int = 4) -> None:
        self.agent = agent
        self.names = itertools.count()
        self.stop = threading.Event()
        self.exhausted = threading.Event()  # a refusal came for the budget
        self.threads = [threading.Thread(target=self._run) for _ in range(threads)]

    def _run(self) -> None:
        link = self.agent.link
        while not self.stop.is_set():
            n = next(self.names)
            if n % HELD_BACK_PER_STREAM == HELD_BACK_PER_STREAM - 1:
                link.abandon(link.generation, "a fresh stream for more refusals")
            try:
                link.request(Subscribe(channel=f"acme/tests/not-{n}"), timeout=10)
            except RelayError as exc:
                if exc.code == Code.RESOURCE_EXHAUSTED:
                    self.exhausted.set()
            self.stop.wait(0.01)

    def __enter__(self) -> Refusals:
        for thread in self.threads:
            thread.start()
        wait_for(self.exhausted.is_set)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(30)


def members(
    stack: LocalStack, ids: Any, sender_key: str, receiver_key: str
) -> tuple[SvcClient, Channel, SvcClient, Channel]:
    """A sender and a receiver in a new channel, each of the account its key is for."""
    channel = f"acme/tests/refused-{ids('c')}"
    ca = client(stack, ids("a"), api_key=sender_key)
    cb = client(stack, ids("b"), api_key=receiver_key)
    chan_a = ca.create_channel(channel)
    chan_b = cb.join_channel(channel, chan_a.add_member(cb.generate_key_package()))
    return ca, chan_a, cb, chan_b


def read(channel: Channel, count: int, limit: int = 32) -> list[bytes]:
    got: list[bytes] = []
    while len(got) < count:
        batch = channel.next_messages(timeout=30, limit=limit)
        assert batch, f"got {len(got)} of {count}; last {got[-3:]}"
        got += [m.data for m in batch]
    return got


def payloads(start: int, count: int) -> list[bytes]:
    return [f"m{i}:".encode() for i in range(start, start + count)]


def test_a_resume_refused_for_now_subscribes_again_on_a_new_connection(
    stack: LocalStack, ids: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The receiver's backlog was full (its subscription paused); the Subscribe of its
    resume is refused for now. The link drops that connection and subscribes every
    channel again on the next one: the channel neither closes nor goes quiet, and
    nothing is lost or repeated."""
    monkeypatch.setattr(channel_module, "BACKLOG_MESSAGES", 64)
    refused = threading.Event()
    on_resubscribed = RelayLink._on_resubscribed

    def watching(self: RelayLink, sub: _Sub, channel: str, generation: int, done: Any) -> None:
        throttled = Code.RESOURCE_EXHAUSTED
        if not done.cancelled() and done.exception() is None and done.result().code == throttled:
            refused.set()
        on_resubscribed(self, sub, channel, generation, done)

    monkeypatch.setattr(RelayLink, "_on_resubscribed", watching)
    other = stack.signup()["api_key"]["key"]  # the sender's account is not throttled
    ca, chan_a, cb, chan_b = members(stack, ids, other, stack.api_key)
    cc = client(stack, ids("c"))  # another agent of the receiver's account
    sent = payloads(0, 3000)
    got: list[bytes] = []
    with ca, cb, cc:
        with Refusals(cc):
            # A resume may still come between a refill and the refusal that spends it;
            # it is then checked, and counts as such: the next try needs another pause
            # and another commit.
            sub = cb.link._subs[chan_b.name]
            for first in range(0, 2500, 500):
                chan_a.send_batch(sent[first : first + 500])
                wait_for(lambda: sub.paused)
                chan_a.update_keys()  # a commit: every stream's access is checked anew
                got += read(chan_b, 100)
                if refused.wait(2.0):
                    break
            assert refused.is_set()
        chan_a.send_batch(sent[first + 500 :])
        got += read(chan_b, len(sent) - len(got))
        assert got == sent
        assert chan_b.next_message(0.3) is None
        assert cb.link.reconnects >= 1
        assert not chan_b.closed


def test_publishes_refused_for_now_are_stored_in_the_order_they_were_sent(
    stack: LocalStack, ids: Any
) -> None:
    """The sender's frames are pipelined: the first is refused for now, and the budget
    may refill before the next arrive. They are refused too, on that stream, and the
    outbox sends them all again, in order, on a new one once the refusals stop."""
    other = stack.signup()["api_key"]["key"]  # the receiver's account is not throttled
    ca, chan_a, cb, chan_b = members(stack, ids, stack.api_key, other)
    cc = client(stack, ids("c"))  # another agent of the sender's account
    sent: list[bytes] = []
    with ca, cb, cc:
        # The first Publish after a commit may still come between a refill and the
        # refusal that spends it; it is then checked, and so is the rest of the stream's:
        # the next try needs another commit.
        for _ in range(5):
            chan_a.update_keys()  # every stream checks the channel again, the sender's too
            batch = payloads(len(sent), 1000)
            with Refusals(cc):
                for payload in batch:  # pipelined, in frames of up to 1,024 messages
                    chan_a.send(payload)
                deadline = time.monotonic() + 2
                while not ca.link.reconnects and time.monotonic() < deadline:
                    time.sleep(0.01)
            sent += batch
            chan_a.wait_stored(60)
            if ca.link.reconnects:
                break
        assert ca.link.reconnects >= 1, "no Publish was refused for now"
        assert read(chan_b, len(sent), limit=1000) == sent
        assert chan_b.next_message(0.3) is None
