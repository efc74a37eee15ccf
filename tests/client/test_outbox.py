"""The outbox (issue 17): send() returns once the message is durably queued; the relay
stores every message whose send() returned exactly once, in order, across kill -9 of the
sender or the relay. Real processes, real kill -9."""

from __future__ import annotations

import concurrent.futures
import contextlib
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from svc_sdk import outbox
from svc_sdk.errors import TransportError
from svc_sdk.relay_client import RelayError
from svc_sdk.relay_frames import Publish, Reply
from svc_sdk.relay_link import RelayLink
from svc_sdk.testing import LocalStack

from .helpers import client, lose_the_reply_to_the_next, pair, refuse_for_now_the_next, take


def queued(data_dir: Path) -> int:
    """How many outbox rows the engine's database holds."""
    with contextlib.closing(sqlite3.connect(data_dir / "mls.sqlite3")) as db:
        count: int = db.execute("SELECT COUNT(*) FROM svc_outbox").fetchone()[0]
        return count


# Bob in his own interpreter: sends KEPT messages that the relay stores but whose
# acknowledgements never retire them (as if every Reply were lost), then HELD messages
# that never leave (the pump stops sending), says "sent", and waits for kill -9.
SENDER = """
import sys, time
from svc_sdk import SvcClient, outbox
relay, data_dir, identity, key, api, name, kept, held = sys.argv[1:]
outbox.Outbox._retire = lambda self: None  # the acks are "lost"
client = SvcClient(relay, data_dir, identity.encode(), key, api)
channel = client.channel(name)
for i in range(int(kept)):
    channel.send(f"m{i}".encode())
deadline = time.monotonic() + 20
while channel._outbox._done_through < int(kept):  # stored by the relay, still on disk
    assert time.monotonic() < deadline
    time.sleep(0.01)
outbox.Outbox._send_more = lambda self, link: time.sleep(0.01)  # nothing leaves any more
for i in range(int(kept), int(kept) + int(held)):
    channel.send(f"m{i}".encode())
print("sent", flush=True)
time.sleep(60)
"""


def hold_first_publish(
    link: RelayLink, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[tuple[int, int | None]], threading.Event]:
    """Wraps ``link.send_soon``: records each Publish frame as (messages, pin), and holds
    the first one's Reply back from the outbox until the returned event is set."""
    frames: list[tuple[int, int | None]] = []
    release = threading.Event()
    send_soon = link.send_soon

    def held(request: Any, *, timeout: float, pin: int | None = None) -> Any:
        future = send_soon(request, timeout=timeout, pin=pin)
        if not isinstance(request, Publish):
            return future
        frames.append((len(request.message), pin))
        if len(frames) > 1:
            return future
        proxy: concurrent.futures.Future[Reply] = concurrent.futures.Future()

        def forward() -> None:
            release.wait(30)
            try:
                proxy.set_result(future.result(30))
            except BaseException as exc:
                proxy.set_exception(exc)

        threading.Thread(target=forward, daemon=True).start()
        return proxy

    monkeypatch.setattr(link, "send_soon", held)
    return frames, release


@pytest.mark.parametrize(
    ("new_epoch", "kept", "plaintext_only"),
    [(True, 20, False), (False, 20, False), (False, 1100, False), (False, 20, True)],
    ids=[
        "commit-before-restart",
        "same-epoch",
        "same-epoch-more-than-the-ratchet-window",
        "rows-a-release-stored-without-ciphertext",
    ],
)
def test_sender_killed_with_a_full_outbox_delivers_each_message_once_in_order(
    stack: LocalStack, ids: Any, new_epoch: bool, kept: int, plaintext_only: bool
) -> None:
    """kill -9 of the sender with ``kept`` stored-but-unacknowledged and 20 unsent
    messages in its outbox. The restart sends the stored ciphertexts again: the relay
    answers the first ``kept`` as repeats (by id, before its epoch check) and stores the
    other 20 behind them and before anything sent later. After a commit the stored
    ciphertexts are of a past epoch, and the 20 are re-encrypted in the new one. In the
    same epoch, more repeats than a receiver's ratchet window (1,024 generations) must
    not cost generations: had the restart encrypted them again, every message after them
    would be too far ahead for receivers to decrypt. Rows that a release stored without
    their ciphertext are encrypted again before anything is sent."""
    channel = f"acme/tests/outbox-kill-{time.monotonic_ns()}"
    ca, chan_a, cb, _ = pair(stack, channel, ids("a"), ids("b"))
    cb.close()
    args = [stack.relay_url, str(stack.agent_dir(ids("b"))), ids("b"), stack.api_key]
    args += [stack.api_url, channel, str(kept), "20"]
    sender = subprocess.Popen([sys.executable, "-c", SENDER, *args], stdout=subprocess.PIPE)
    with ca:
        try:
            assert sender.stdout is not None
            assert sender.stdout.readline().strip() == b"sent"
        finally:
            sender.kill()
            sender.wait(10)
        assert queued(stack.agent_dir(ids("b"))) == kept + 20
        if plaintext_only:
            with contextlib.closing(
                sqlite3.connect(stack.agent_dir(ids("b")) / "mls.sqlite3")
            ) as db:
                db.execute("ALTER TABLE svc_outbox DROP COLUMN ciphertext")
        assert take(chan_a, kept) == [f"m{i}".encode() for i in range(kept)]
        if new_epoch:
            chan_a.update_keys()  # a new epoch before bob comes back
        with client(stack, ids("b")) as again:
            chan_b = again.channel(channel)
            assert chan_b.unsent <= kept + 20  # the restarted outbox may be under way already
            chan_b.send(b"after the restart")
            chan_b.wait_stored(30)
            assert chan_b.unsent == 0
            expected = [f"m{i}".encode() for i in range(kept, kept + 20)] + [b"after the restart"]
            assert take(chan_a, 21) == expected
            assert chan_a.next_message(0.5) is None, "nothing twice"


def test_relay_killed_mid_pipeline_stores_each_message_once_in_order(ids: Any) -> None:
    with LocalStack() as stack:
        channel = "acme/tests/outbox-relay-kill"
        ca, chan_a, cb, chan_b = pair(stack, channel, ids("a"), ids("b"))
        with ca, cb:
            sent = 0

            def send_many() -> None:
                nonlocal sent
                for i in range(600):
                    chan_a.send(f"m{i}".encode())
                    sent += 1

            sender = threading.Thread(target=send_many)
            sender.start()
            while sent < 100:
                time.sleep(0.001)
            stack.kill()  # SIGKILL with frames in flight
            stack.restart()
            sender.join(60)
            chan_a.wait_stored(60)
            got = take(chan_b, 600, timeout=30)
            assert got == [f"m{i}".encode() for i in range(600)]
            assert chan_b.next_message(0.5) is None


def test_many_threads_send_at_once(stack: LocalStack, channel_name: str, ids: Any) -> None:
    ca, chan_a, cb, chan_b = pair(stack, channel_name, ids("a"), ids("b"))
    with ca, cb:
        threads = [
            threading.Thread(
                target=lambda t=t: [chan_a.send(f"{t}:{i}".encode()) for i in range(150)]
            )
            for t in range(8)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        chan_a.wait_stored(30)
        got = [m.decode().split(":") for m in take(chan_b, 8 * 150)]
        for t in range(8):
            assert [int(i) for s, i in got if s == str(t)] == list(range(150)), "in order"
        assert chan_b.next_message(0.3) is None


def test_messages_sent_while_a_frame_is_in_flight_leave_together(
    stack: LocalStack, channel_name: str, ids: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nagle's rule: a lone message leaves at once; what is sent while its frame waits for
    the Reply leaves in one frame after it, and full frames (1,024 messages) do not wait.
    The first frame's Reply is held back from the outbox until the test releases it."""
    ca, chan_a, cb, chan_b = pair(stack, channel_name, ids("a"), ids("b"))
    with ca, cb:
        chan_a.send(b"warm")  # the pump runs: later sends take the fast path
        chan_a.wait_stored(10)
        frames, release = hold_first_publish(ca.link, monkeypatch)
        chan_a.send(b"first")
        for i in range(2100):
            chan_a.send(b"m%d" % i)
        sizes = [n for n, _ in frames]
        assert sizes == [1, 1024, 1024], "only full frames left while one was in flight"
        release.set()
        chan_a.wait_stored(30)
        assert [n for n, _ in frames] == [1, 1024, 1024, 52]
        expected = [b"warm", b"first"] + [b"m%d" % i for i in range(2100)]
        assert take(chan_b, len(expected)) == expected


def test_no_frame_leaves_on_a_new_connection_while_one_of_the_old_is_in_flight(
    stack: LocalStack, channel_name: str, ids: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Frames are pinned to a connection. When it goes, those in flight fail and the pump
    resends from the first of them, in order; a full frame sent on the next connection
    before those failures are collected would be stored ahead of them. The first frame's
    Reply is held back, and the link's connection number moves on as a reconnect does."""
    ca, chan_a, cb, chan_b = pair(stack, channel_name, ids("a"), ids("b"))
    with ca, cb:
        chan_a.send(b"warm")
        chan_a.wait_stored(10)
        frames, release = hold_first_publish(ca.link, monkeypatch)
        chan_a.send(b"first")
        old = ca.link.generation
        ca.link.generation += 1  # what a reconnect does; the test's connection stays up
        for i in range(1100):
            chan_a.send(b"m%d" % i)
        assert frames == [(1, old)], "nothing left on the new connection"
        release.set()
        chan_a.wait_stored(30)
        assert [pin for _, pin in frames[1:]] == [old + 1] * (len(frames) - 1)
        assert sum(n for n, _ in frames) == 1101
        expected = [b"warm", b"first"] + [b"m%d" % i for i in range(1100)]
        assert take(chan_b, len(expected)) == expected


def test_a_publish_the_relay_never_answers_is_sent_again_on_a_new_connection(
    stack: LocalStack, channel_name: str, ids: Any
) -> None:
    """The stream stays up, but one Publish's Reply never comes. Every later frame waits
    behind it (the outbox keeps the relay's order), so without a way out the channel
    would send nothing more for as long as the connection lasts. After the client's
    timeout the outbox gives that connection up and resends from that frame on the next
    one; the relay had stored it, and stores each message once, in order."""
    ca, chan_a, cb, chan_b = pair(stack, channel_name, ids("a"), ids("b"))
    with ca, cb:
        chan_a.send(b"warm")
        chan_a.wait_stored(10)
        conn, generation = ca.link._conn, ca.link.generation
        assert conn is not None
        lost = lose_the_reply_to_the_next(conn, Publish)
        ca.timeout = 1.0
        chan_a.send(b"m0")
        time.sleep(0.2)  # m0's frame is out alone: the next ones wait for its Reply
        for i in range(1, 5):
            chan_a.send(b"m%d" % i)
        chan_a.wait_stored(15)
        assert len(lost) == 1
        assert ca.link.generation > generation, "the connection was given up"
        assert take(chan_b, 6) == [b"warm"] + [b"m%d" % i for i in range(5)]
        assert chan_b.next_message(0.5) is None, "a message was stored twice"


def test_a_publish_refused_for_now_is_sent_again_not_dropped(
    stack: LocalStack, channel_name: str, ids: Any
) -> None:
    """A Publish answered RESOURCE_EXHAUSTED (the account spent its budget of refused
    requests: "retry") is not a failure of the messages in it: the outbox sends them
    again after a pause, and the relay, which had stored them here, keeps one copy."""
    ca, chan_a, cb, chan_b = pair(stack, channel_name, ids("a"), ids("b"))
    with ca, cb:
        chan_a.send(b"warm")
        chan_a.wait_stored(10)
        assert ca.link._conn is not None
        refused = refuse_for_now_the_next(ca.link._conn, Publish)
        chan_a.send(b"m0")
        chan_a.wait_stored(15)
        assert len(refused) == 1
        chan_a.send(b"m1")
        assert take(chan_b, 3) == [b"warm", b"m0", b"m1"]
        assert chan_b.next_message(0.5) is None, "a message was stored twice"


def test_send_blocks_while_the_outbox_is_full(ids: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(outbox, "OUTBOX_MESSAGES", 5)
    with LocalStack() as stack:
        ca, chan_a, cb, chan_b = pair(stack, "acme/tests/outbox-full", ids("a"), ids("b"))
        with ca, cb:
            stack.kill()
            ca.timeout = 1.0
            for i in range(5):
                chan_a.send(f"m{i}".encode())  # queued while the relay is down
            with pytest.raises(TransportError, match="outbox is full"):
                chan_a.send(b"m5")
            with pytest.raises(TransportError, match="not acknowledged by the relay in time"):
                chan_a.wait_stored(0.2)
            assert chan_a.unsent == 5
            stack.restart()
            chan_a.wait_stored(30)
            chan_a.send(b"m5")
            assert take(chan_b, 6, timeout=30) == [f"m{i}".encode() for i in range(6)]


def test_bad_input_at_the_new_entry_points(stack: LocalStack, channel_name: str, ids: Any) -> None:
    ca, chan_a, cb, _ = pair(stack, channel_name, ids("a"), ids("b"))
    with ca, cb:
        with pytest.raises(TypeError, match="timeout must be seconds or None"):
            chan_a.wait_stored("1")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="timeout must be 0 or more seconds"):
            chan_a.wait_stored(-1)
        with pytest.raises(ValueError, match="timeout must be 0 or more seconds"):
            chan_a.wait_stored(float("nan"))
        with pytest.raises(TypeError, match="payload must be bytes"):
            chan_a.send_batch([b"ok", "text"])  # type: ignore[list-item]
        assert chan_a.unsent == 0, "nothing of a refused batch was queued"
        chan_a.wait_stored(0)  # nothing sent: nothing to wait for

        # The relay's side: message ids must be none or one distinct 1-32 byte id each.
        message = chan_a._group.encrypt(b"x")

        def publish(ids: list[bytes]) -> Reply:
            frame = Publish(channel=channel_name, message=[message], message_id=ids)
            try:
                return ca.link.request(frame, timeout=10)
            except RelayError as exc:
                return exc.reply

        for bad in ([b""], [b"x" * 33], [b"a", b"b"]):
            reply = publish(bad)
            assert reply.code == 3 and "message_id" in reply.message, bad
        ok = publish([b"i" * 16])
        again = publish([b"i" * 16])
        assert ok.code == again.code == 0 and ok.seq == again.seq


def test_sending_stays_ordered_across_reconnects(stack: LocalStack, ids: Any) -> None:
    """Frames in flight when the connection breaks are not resent by the link out of
    order: the outbox starts again from the oldest unacknowledged message."""
    channel = f"acme/tests/outbox-reconnect-{time.monotonic_ns()}"
    ca, chan_a, cb, chan_b = pair(stack, channel, ids("a"), ids("b"))
    with ca, cb:
        for round_ in range(3):
            for i in range(200):
                chan_a.send(f"{round_}:{i}".encode())
                if i == 100:
                    conn = ca.link._conn
                    assert conn is not None
                    conn.close()  # the stream breaks mid-pipeline
            chan_a.wait_stored(30)
        got = take(chan_b, 600)
        assert got == [f"{r}:{i}".encode() for r in range(3) for i in range(200)]
        # A frame pinned to an earlier connection never goes out on a later one.
        frame = Publish(channel=channel, message=[chan_a._group.encrypt(b"never")])
        stale = ca.link.send_soon(frame, timeout=5, pin=ca.link.generation - 1)
        with pytest.raises(TransportError, match="connection lost before sending"):
            stale.result(10)
        assert chan_b.next_message(0.3) is None


def test_a_reply_that_leaves_the_pump_nothing_to_do_does_not_need_it(
    stack: LocalStack, channel_name: str, ids: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent that waits for each message's acknowledgement does not wake the pump per
    Reply: the Reply is taken where it arrives. With a pump that does nothing at all,
    each message is still acknowledged and its waiting caller woken (its poll is an hour
    away), in order."""
    monkeypatch.setattr(outbox, "POLL_SECONDS", 3600.0)
    monkeypatch.setattr(outbox.Outbox, "_pump", lambda self: None)
    ca, chan_a, cb, chan_b = pair(stack, channel_name, ids("a"), ids("b"))
    with ca, cb:
        for i in range(20):
            chan_a.send(b"m%d" % i)
            # Not woken, each would wait out its minute: past the test's time limit.
            chan_a.wait_stored(60)
            assert chan_a.unsent == 0
        assert take(chan_b, 20) == [b"m%d" % i for i in range(20)]


def rows_left(data_dir: Path, most: int, what: str) -> None:
    """Waits (up to 20 s) until the outbox holds at most ``most`` rows."""
    deadline = time.monotonic() + 20
    while queued(data_dir) > most:
        assert time.monotonic() < deadline, f"{what}: {queued(data_dir)} rows left"
        time.sleep(0.02)


def test_a_sender_that_waits_for_each_reply_deletes_rows_every_256(
    stack: LocalStack, ids: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows go in one delete per 256 acknowledged messages even when the sender never
    pauses: a Reply taken where it arrives still wakes the pump for that delete. (The
    other rule, a pause of RETIRE_IDLE_SECONDS, is an hour away here.)"""
    monkeypatch.setattr(outbox, "RETIRE_IDLE_SECONDS", 3600.0)
    with client(stack, ids("a")) as ca:
        chan = ca.create_channel(f"acme/tests/retire-every-{time.monotonic_ns()}")
        for i in range(300):
            chan.send(b"m%d" % i)
            chan.wait_stored(10)
        rows_left(stack.agent_dir(ids("a")), 300 - outbox.RETIRE_EVERY, "no delete at 256")


def test_rows_are_deleted_after_a_pause_though_the_pump_was_asleep(
    stack: LocalStack, ids: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A message sent while the pump sleeps (its next look an hour away) leaves without
    waking it; its Reply, taken where it arrives, must wake it so that its row is
    deleted after the pause, not at the pump's next look."""
    monkeypatch.setattr(outbox, "PUMP_IDLE_SECONDS", 3600.0)
    monkeypatch.setattr(outbox, "POLL_SECONDS", 3600.0)
    monkeypatch.setattr(outbox, "RETIRE_IDLE_SECONDS", 0.01)
    with client(stack, ids("a")) as ca:
        chan = ca.create_channel(f"acme/tests/retire-idle-{time.monotonic_ns()}")
        data_dir = stack.agent_dir(ids("a"))
        for i in range(3):
            chan.send(b"m%d" % i)
            chan.wait_stored(10)
            rows_left(data_dir, 0, f"message {i} not deleted")


def test_a_waiting_sender_is_woken_when_its_messages_are_stored(
    stack: LocalStack, ids: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``send_batch`` (and ``wait_stored``) must be woken by the pump once the Reply is
    taken, not find out at its next poll: with the poll an hour away, a missed wake-up
    hangs the sender until the client's timeout."""
    monkeypatch.setattr(outbox, "POLL_SECONDS", 3600.0)
    with client(stack, ids("a"), timeout=10) as ca:
        chan = ca.create_channel(f"acme/tests/outbox-wake-{time.monotonic_ns()}")
        for _ in range(40):
            chan.send_batch([b"x" * 256] * 256)
        chan.send(b"last")
        chan.wait_stored(30)
        assert chan.unsent == 0


def test_a_pump_with_nothing_to_send_ends_its_thread(
    stack: LocalStack, ids: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent in many channels holds pump threads only for those it is sending on: an
    idle pump ends, and the next send starts one and is delivered as before."""
    monkeypatch.setattr(outbox, "PUMP_IDLE_SECONDS", 0.5)

    names = [f"acme/tests/idle-pump-{time.monotonic_ns()}-{i}" for i in range(4)]

    def pumps() -> int:  # this test's: a pump of an earlier test may end meanwhile
        ours = {f"svc-outbox-{name}" for name in names}
        return sum(t.name in ours for t in threading.enumerate())

    def until(what: str, done: Any) -> None:
        deadline = time.monotonic() + 10
        while not done():
            assert time.monotonic() < deadline, what
            time.sleep(0.02)

    with client(stack, ids("a")) as ca, client(stack, ids("b")) as cb:
        pairs = []
        for name in names:
            chan_a = ca.create_channel(name)
            pairs.append(
                (chan_a, cb.join_channel(name, chan_a.add_member(cb.generate_key_package())))
            )
        for round_ in range(2):
            for chan_a, _ in pairs:
                chan_a.send(f"r{round_}".encode())
            assert pumps() > 0, "a send starts its channel's pump"
            for chan_a, chan_b in pairs:
                chan_a.wait_stored(10)
                assert take(chan_b, 1) == [f"r{round_}".encode()]
            until("idle pumps ended", lambda: pumps() == 0)
        assert all(chan_a.unsent == 0 for chan_a, _ in pairs)


def test_a_pump_that_failed_is_started_again_by_the_next_send(
    stack: LocalStack, channel_name: str, ids: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pump that ended on a bug (logged) must not leave the channel waiting on a thread
    that is gone: the next send starts another, and everything is stored."""
    pump = outbox.Outbox._pump
    failures: list[outbox.Outbox] = []

    def failing_once(self: outbox.Outbox) -> None:
        if not failures:
            failures.append(self)
            raise RuntimeError("a bug in the pump")
        pump(self)

    monkeypatch.setattr(outbox.Outbox, "_pump", failing_once)
    ca, chan_a, cb, chan_b = pair(stack, channel_name, ids("a"), ids("b"))
    with ca, cb:
        chan_a.send(b"first")  # its pump fails at once
        deadline = time.monotonic() + 10
        while chan_a._outbox._thread is not None:
            assert time.monotonic() < deadline, "the failed pump is still the channel's"
            time.sleep(0.01)
        chan_a.send(b"second")
        chan_a.wait_stored(10)
        assert take(chan_b, 2) == [b"first", b"second"]
        assert failures == [chan_a._outbox]  # not a pump of some earlier test's
