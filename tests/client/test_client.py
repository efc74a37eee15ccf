"""SvcClient and Channel against a real local stack: API, relay, MLS."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from svc_sdk import (
    AuthError,
    Channel,
    ChannelNameError,
    MlsError,
    SvcClient,
    TransportError,
)
from svc_sdk.relay_frames import Code, Commit, RelayError, Reply
from svc_sdk.relay_stream import StreamConnection
from svc_sdk.testing import LocalStack

from ..support import free_port
from .helpers import (
    client,
    hold_the_reply_to_the_next,
    listening,
    lose_the_reply_to_the_next,
    pair,
    take,
    update_held_at_its_reply,
    wait_for,
    withhold_deliveries,
)


def test_two_agents_exchange_both_ways(stack: LocalStack, channel_name: str, ids: Any) -> None:
    ca, chan_a, cb, chan_b = pair(stack, channel_name, ids("alice"), ids("bob"))
    with ca, cb:
        chan_a.send(b"hello bob")
        chan_b.send(b"hello alice")
        assert take(chan_b, 1) == [b"hello bob"]
        assert take(chan_a, 1) == [b"hello alice"]
        # Own messages are not echoed back.
        assert chan_a.next_message(0.3) is None
        members = chan_a.members()
        assert sorted(m.identity for m in members) == [ids("alice").encode(), ids("bob").encode()]
        assert {m.account for m in members} == {ca.agent_id.account} == {cb.agent_id.account}
        assert chan_a.epoch == chan_b.epoch == 1


def test_three_agents_in_one_channel(stack: LocalStack, channel_name: str, ids: Any) -> None:
    ca, chan_a, cb, chan_b = pair(stack, channel_name, ids("a"), ids("b"))
    cc = client(stack, ids("c"))
    with ca, cb, cc:
        chan_a.set_role(cb.agent_id, "admin")  # only the owner and admins add members
        chan_c = cc.join_channel(channel_name, chan_b.add_member(cc.generate_key_package()))
        chan_a.send(b"from a")
        chan_c.send(b"from c")
        assert sorted(take(chan_b, 2)) == [b"from a", b"from c"]
        assert take(chan_c, 1) == [b"from a"]
        assert take(chan_a, 1) == [b"from c"]  # a applied b's commit on the way
        assert len(chan_a.members()) == 3


def test_messages_iterator_blocks_keeps_order_and_resumes(
    stack: LocalStack, channel_name: str, ids: Any
) -> None:
    ca, chan_a, cb, chan_b = pair(stack, channel_name, ids("a"), ids("b"))
    with ca, cb:
        received: list[bytes] = []

        def read(n: int) -> None:
            for payload in chan_b.messages():  # blocks until messages arrive
                received.append(payload)
                if len(received) == n:
                    return

        reader = threading.Thread(target=read, args=(5,))
        reader.start()
        for i in range(10):
            chan_a.send(f"m{i}".encode())
        reader.join(20)
        # The first iterator was dropped after five; a second one goes on from there.
        rest = [next(iter(chan_b.messages())) for _ in range(5)]
        assert received + rest == [f"m{i}".encode() for i in range(10)]


def test_a_waiting_reader_gets_its_message_without_the_inbox(
    stack: LocalStack, channel_name: str, ids: Any
) -> None:
    ca, chan_a, cb, chan_b = pair(stack, channel_name, ids("a"), ids("b"))
    with ca, cb:
        chan_a.send(b"direct")
        assert take(chan_b, 1) == [b"direct"]
        assert cb.state.inbox(channel_name) == []  # handed over, never stored
        chan_a.send_batch([b"first", b"second", b"third"])
        assert take(chan_b, 1) == [b"first"]
        # What the reader did not take yet waits in the inbox, durable.
        stored = [payload for _, _, payload in cb.state.inbox(channel_name)]
        assert stored == [b"second", b"third"]
        assert take(chan_b, 2) == [b"second", b"third"]
        # A reader that waits records how far it got, so the cursor catches up.
        assert chan_b.next_message(0.2) is None
        ((_, cursor, _),) = [c for c in cb.state.channels() if c[0] == channel_name]
        assert cursor == chan_b._inbox.cursor > 0


def test_next_messages_takes_what_is_there_in_order(
    stack: LocalStack, channel_name: str, ids: Any
) -> None:
    ca, chan_a, cb, chan_b = pair(stack, channel_name, ids("a"), ids("b"))
    with ca, cb:
        assert chan_b.next_messages(0.1) == []  # timeout: nothing
        with pytest.raises(ValueError, match="limit"):
            chan_b.next_messages(0.1, limit=0)
        chan_a.send_batch([f"m{i}".encode() for i in range(10)])
        got = [m.data for m in chan_b.next_messages(10, limit=3)]
        assert got == [b"m0", b"m1", b"m2"]
        odd = [m.data for m in chan_b.next_messages(10, accept=lambda m: m.data[-1] % 2 == 1)]
        assert odd == [b"m3", b"m5", b"m7", b"m9"]
        rest = [m.data for m in chan_b.next_messages(10)]
        assert rest == [b"m4", b"m6", b"m8"]
        chan_a.send_batch([b"x", b"y"])
        deadline = time.monotonic() + 10
        batch: list[bytes] = []
        while len(batch) < 2 and time.monotonic() < deadline:
            batch += [m.data for m in chan_b.next_messages(10)]
        assert batch == [b"x", b"y"]
        stored = {payload for _, _, payload in cb.state.inbox(channel_name)}
        assert not stored & {b"x", b"y"}  # handed over whole, never stored
        # m3..m9 were stored (the limit=3 read left them); an idle reader records them read.
        assert chan_b.next_messages(0.1) == []
        assert cb.state.inbox(channel_name) == []
        cb.close()
        assert chan_b.next_messages(0.1) == []  # closed: nothing, at once


def test_next_messages_with_timeout_zero_returns_what_is_there_without_waiting(
    stack: LocalStack, channel_name: str, ids: Any
) -> None:
    ca, chan_a, cb, chan_b = pair(stack, channel_name, ids("a"), ids("b"))
    with ca, cb:
        chan_a.send_batch([b"a", b"b", b"c"])
        got: list[bytes] = []
        deadline = time.monotonic() + 10
        while len(got) < 3 and time.monotonic() < deadline:
            got += [m.data for m in chan_b.next_messages(timeout=0)]
            time.sleep(0.01)
        assert got == [b"a", b"b", b"c"]
        started = time.monotonic()
        assert chan_b.next_messages(timeout=0) == []  # nothing left, and it does not wait
        assert time.monotonic() - started < 1


def test_send_from_threads_while_another_thread_iterates(
    stack: LocalStack, channel_name: str, ids: Any
) -> None:
    ca, chan_a, cb, chan_b = pair(stack, channel_name, ids("a"), ids("b"))
    with ca, cb:
        got: list[bytes] = []
        reader = threading.Thread(target=lambda: got.extend(take(chan_b, 300)))
        reader.start()
        senders = [
            threading.Thread(
                target=lambda t=t: [chan_a.send(f"{t}:{i}".encode()) for i in range(100)]
            )
            for t in range(3)
        ]
        for s in senders:
            s.start()
        for s in senders:
            s.join(60)
        reader.join(60)
        assert len(got) == 300 and len(set(got)) == 300
        for t in range(3):  # each thread's messages arrive in the order it sent them
            mine = [g for g in got if g.startswith(f"{t}:".encode())]
            assert mine == [f"{t}:{i}".encode() for i in range(100)]


def test_send_batch_keeps_order(stack: LocalStack, channel_name: str, ids: Any) -> None:
    ca, chan_a, cb, chan_b = pair(stack, channel_name, ids("a"), ids("b"))
    with ca, cb:
        payloads = [f"b{i}".encode() for i in range(2500)]  # more than one frame
        chan_a.send_batch(payloads)
        assert take(chan_b, 2500) == payloads


def test_concurrent_add_member_retries_after_losing_the_epoch(
    stack: LocalStack, channel_name: str, ids: Any
) -> None:
    ca, chan_a, cb, chan_b = pair(stack, channel_name, ids("a"), ids("b"))
    cc, cd = client(stack, ids("c")), client(stack, ids("d"))
    with ca, cb, cc, cd:
        chan_a.set_role(cb.agent_id, "admin")  # only the owner and admins add members
        deadline = time.monotonic() + 20
        while chan_b.roles().get(cb.agent_id) != "admin" and time.monotonic() < deadline:
            time.sleep(0.05)
        kps = {"c": cc.generate_key_package(), "d": cd.generate_key_package()}
        welcomes: dict[str, bytes] = {}
        start = threading.Barrier(2)

        def add(chan: Any, who: str) -> None:
            start.wait()
            welcomes[who] = chan.add_member(kps[who])

        threads = [
            threading.Thread(target=add, args=(chan_a, "c")),
            threading.Thread(target=add, args=(chan_b, "d")),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert set(welcomes) == {"c", "d"}
        chan_c = cc.join_channel(channel_name, welcomes["c"])
        chan_d = cd.join_channel(channel_name, welcomes["d"])
        chan_a.send(b"everyone")
        for chan in (chan_b, chan_c, chan_d):
            assert take(chan, 1) == [b"everyone"]
        assert chan_a.epoch == 4


def test_remove_member_ends_its_iterator(stack: LocalStack, channel_name: str, ids: Any) -> None:
    ca, chan_a, cb, chan_b = pair(stack, channel_name, ids("a"), ids("b"))
    with ca, cb:
        chan_a.remove_member(ids("b"))
        assert list(chan_b.messages(timeout=10)) == []  # ends: b was removed
        assert chan_b.closed and channel_name not in cb.channels()
        chan_a.send(b"after removal")
        assert chan_a.members() == [ca.agent_id]


def test_leave_is_committed_by_another_member(
    stack: LocalStack, channel_name: str, ids: Any
) -> None:
    ca, chan_a, cb, chan_b = pair(stack, channel_name, ids("a"), ids("b"))
    with ca, cb:
        with listening(chan_a):  # a member must be online to commit the removal
            chan_b.leave()
        # Read once the listener is done: b may see its removal before a applies it.
        assert chan_b.closed and cb.channels() == []
        assert chan_a.members() == [ca.agent_id]


@pytest.mark.parametrize(
    "name",
    [
        "acme",
        "acme/ops",
        "acme/ops/x/y",
        "acme//x",
        "/ops/x",
        "acme/ops/",
        "a b/c/d",
        "a/b/c\n",
        "ü/b/c",
        "x" * 65 + "/b/c",
        "",
    ],
)
def test_invalid_channel_name_repeats_it_and_states_the_format(
    stack: LocalStack, ids: Any, name: str
) -> None:
    with client(stack, ids("a")) as c:
        for call in (c.create_channel, lambda n: c.join_channel(n, b"x"), c.invite):
            with pytest.raises(ChannelNameError) as info:
                call(name)
            message = str(info.value)
            assert message.startswith("invalid channel name: ")
            assert repr(name) in message and "org/namespace/service" in message
            assert isinstance(info.value, RuntimeError)


def test_bad_welcome_and_key_package_are_mls_errors(
    stack: LocalStack, channel_name: str, ids: Any
) -> None:
    ca, chan_a, cb, chan_b = pair(stack, channel_name, ids("a"), ids("b"))
    cc = client(stack, ids("c"))
    with ca, cb, cc:
        with pytest.raises(MlsError, match="^MLS engine error: "):
            cc.join_channel("acme/tests/other", b"\x00\x01garbage")
        with pytest.raises(MlsError, match="^MLS engine error: "):
            chan_a.add_member(b"not a key package")
        # A Welcome for one channel cannot join another.
        welcome = chan_a.add_member(cc.generate_key_package())
        with pytest.raises(MlsError, match="is for channel"):
            cc.join_channel("acme/tests/elsewhere", welcome)
        assert cc.channels() == []
        # Nothing was corrupted: the channel goes on.
        chan_a.send(b"still fine")
        assert take(chan_b, 1) == [b"still fine"]


def test_auth_errors(stack: LocalStack, ids: Any, tmp_path: Any) -> None:
    common = (stack.relay_url, tmp_path / "x", b"x")
    with pytest.raises(AuthError, match="^auth error: api_url is required"):
        SvcClient(*common, api_key=stack.api_key)
    with pytest.raises(AuthError, match="^auth error: "):
        SvcClient(*common, api_key="sk_live_" + "0" * 49, api_url=stack.api_url)
    with pytest.raises(AuthError, match="^auth error: no API key"):
        SvcClient(*common)
    # A revoked key stops working for new clients at once.
    key = stack.signup()["api_key"]["key"]
    headers = {"Authorization": f"Bearer {key}"}
    keys = httpx.get(f"{stack.api_url}/v1/keys", headers=headers).json()["keys"]
    httpx.delete(f"{stack.api_url}/v1/keys/{keys[0]['id']}", headers=headers)
    with pytest.raises(AuthError, match="^auth error: API key rejected"):
        SvcClient(*common, api_key=key, api_url=stack.api_url)


def test_unreachable_relay_is_a_transport_error(stack: LocalStack, tmp_path: Any) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(TransportError, match="^transport error: relay unreachable"):
        SvcClient(
            dead,
            tmp_path / "x",
            b"x",
            api_key=stack.api_key,
            api_url=stack.api_url,
            connect_timeout=1.0,
        )


def test_another_accounts_channel_is_refused(
    stack: LocalStack, channel_name: str, ids: Any
) -> None:
    other_key = stack.signup()["api_key"]["key"]
    with client(stack, ids("a")) as a, client(stack, ids("m"), api_key=other_key) as m:
        a.create_channel(channel_name)
        with pytest.raises(RuntimeError, match="^runtime error: channel .* already|no access"):
            m.create_channel(channel_name)


@contextlib.contextmanager
def _next_commit_reply_lost(
    stack: LocalStack, channel_name: str, ids: Any, timeout: float
) -> Iterator[tuple[SvcClient, Channel, Channel, StreamConnection, SvcClient]]:
    """a and b in a channel, a third agent c to add; the Reply to a's next commit is lost
    (the relay acts on it), and a's client waits ``timeout`` s for a Reply. Yields (a's
    client, a's channel, b's channel, a's stream, c's client)."""
    ca, chan_a, cb, chan_b = pair(stack, channel_name, ids("a"), ids("b"))
    with ca, cb, client(stack, ids("c")) as cc:
        conn = ca.link._conn
        assert conn is not None
        lose_the_reply_to_the_next(conn, Commit)
        ca.timeout = timeout
        yield ca, chan_a, chan_b, conn, cc


def test_a_commit_whose_reply_is_lost_is_settled_from_the_log(
    stack: LocalStack, channel_name: str, ids: Any
) -> None:
    """The relay stored the commit but its Reply never came: the committer reads the
    log up to the relay's head, finds its own commit echoed and applies it, once; the
    Welcome it returns lets the new member in."""
    with _next_commit_reply_lost(stack, channel_name, ids, 1.0) as (_, chan_a, chan_b, conn, cc):
        welcome = chan_a.add_member(cc.generate_key_package())
        assert conn.waiting == 0  # the request given up on is forgotten
        assert chan_a.epoch == 2
        chan_c = cc.join_channel(channel_name, welcome)
        chan_a.send(b"to both")
        assert take(chan_b, 1) == [b"to both"]
        assert take(chan_c, 1) == [b"to both"]


def test_settling_a_commit_waits_no_longer_than_the_clients_timeout(
    stack: LocalStack, channel_name: str, ids: Any
) -> None:
    """A commit whose Reply is lost is settled by reading the log up to the relay's head;
    if the log does not come either, the commit fails after the client's timeout (not a
    fixed 30 s), and the next one settles it first."""
    with (
        _next_commit_reply_lost(stack, channel_name, ids, 1.0) as (ca, chan_a, chan_b, conn, cc),
        client(stack, ids("d")) as cd,
    ):
        withholding = withhold_deliveries(conn)
        started = time.monotonic()
        with pytest.raises(TransportError):
            chan_a.add_member(cc.generate_key_package())
        assert time.monotonic() - started < 10
        withholding.clear()
        ca.link.abandon(ca.link.generation, "the test withheld deliveries")  # redelivered
        ca.timeout = 30.0
        welcome = chan_a.add_member(cd.generate_key_package())
        assert chan_a.epoch == 3, "the lost commit, then this one"
        chan_d = cd.join_channel(channel_name, welcome)
        chan_a.send(b"after")
        assert take(chan_b, 1) == [b"after"]
        assert take(chan_d, 1) == [b"after"]


def test_sends_go_on_while_a_commit_waits_for_the_relay(
    stack: LocalStack, channel_name: str, ids: Any
) -> None:
    """A commit holds the channel while it is built and applied, not while it waits for
    the relay's answer (here a Reply that never comes: settled from the log after the
    client's timeout). send() on another thread meanwhile returns once its message is
    queued, and every message reaches the members once, in order: those the relay
    orders after the commit are encrypted again in its epoch."""
    with _next_commit_reply_lost(stack, channel_name, ids, 5.0) as (_, chan_a, chan_b, _, cc):
        key_package = cc.generate_key_package()
        welcome: list[bytes] = []
        adding = threading.Thread(target=lambda: welcome.append(chan_a.add_member(key_package)))
        adding.start()
        deadline = time.monotonic() + 10
        while not chan_a._group.has_pending_commit:
            assert time.monotonic() < deadline, "the commit was never built"
            time.sleep(0.005)
        during = [b"during %d" % i for i in range(5)]
        for payload in during:
            chan_a.send(payload)
        assert adding.is_alive(), "send() waited for the commit"
        adding.join(30)
        assert welcome, "add_member failed"
        assert chan_a.epoch == 2
        chan_c = cc.join_channel(channel_name, welcome[0])
        chan_a.send(b"after")
        assert take(chan_b, 6) == [*during, b"after"]
        got_c: list[bytes] = []
        while not got_c or got_c[-1] != b"after":
            got_c += take(chan_c, 1)
        # The new member reads what the relay ordered after the commit, once and in order.
        assert got_c[:-1] == during[len(during) - len(got_c) + 1 :]


def test_leave_waits_for_a_commit_under_way(stack: LocalStack, channel_name: str, ids: Any) -> None:
    """A leave proposal cannot be made while this agent's commit is pending: leave()
    waits for the commit another thread has under way, then leaves."""
    ca, chan_a, cb, chan_b = pair(stack, channel_name, ids("a"), ids("b"))
    with ca, cb:
        chan_a.set_role(cb.agent_id, "admin")  # b commits: only the owner and admins do
        wait_for(lambda: chan_b.roles()[cb.agent_id] == "admin")
        release, updating = update_held_at_its_reply(cb, chan_b)
        threading.Timer(1.0, release.set).start()
        try:
            with listening(chan_a):
                chan_b.leave(timeout=20)
        finally:
            updating.join(20)
        assert chan_b.closed and cb.channels() == []
        assert chan_a.members() == [ca.agent_id]


def test_a_proposal_read_while_a_commit_awaits_its_reply_is_committed(
    stack: LocalStack, channel_name: str, ids: Any
) -> None:
    """The Reply to a's commit is slow; meanwhile a reader applies the commit from its
    echo, then reads b's leave proposal in the new epoch. The commit finishing must not
    forget that proposal: a commits it (b is removed) once its own commit is done, and
    a's sends go on (mls-rs refuses them while a received proposal waits)."""
    ca, chan_a, cb, chan_b = pair(stack, channel_name, ids("a"), ids("b"))
    with ca, cb:
        release, updating = update_held_at_its_reply(ca, chan_a)
        # A reader of a's channel applies the commit from its echo.
        wait_for(lambda: (chan_a._deliveries.process_pending(), chan_a.epoch == 2)[1])
        # b proposes in that epoch too (a proposal of the epoch before is refused as stale).
        wait_for(lambda: (chan_b._deliveries.process_pending(), chan_b.epoch == 2)[1])
        leaving = threading.Thread(target=chan_b.leave, kwargs={"timeout": 20})
        leaving.start()
        wait_for(lambda: (chan_a._deliveries.process_pending(), chan_a._admissions.proposals)[1])
        release.set()
        updating.join(20)
        assert not updating.is_alive()
        with listening(chan_a):
            leaving.join(25)
        assert chan_b.closed
        assert chan_a.members() == [ca.agent_id]
        chan_a.send(b"still sending")
        chan_a.wait_stored(10)


def test_admissions_that_keep_failing_do_not_hold_a_commit_call(
    stack: LocalStack, channel_name: str, ids: Any
) -> None:
    """A proposal is recorded while a's update_keys() awaits its Reply (a listener applied
    the commit from its echo already), and the relay refuses
    every commit of it: when update_keys' own commit is done, it tries that work once
    and returns, however often a listener looks meanwhile; the listener retries it on
    its own thread."""
    ca, chan_a, cb, _ = pair(stack, channel_name, ids("a"), ids("b"))
    with ca, cb:
        admissions, link = chan_a._admissions, ca.link
        tried: list[int] = []
        make, request = admissions._commit_proposals, link.request

        def counted_make() -> Any:
            tried.append(1)
            return make()

        def refusing_request(frame: Any, **kwargs: Any) -> Any:
            if isinstance(frame, Commit) and tried:
                raise RelayError(Reply(code=Code.PERMISSION_DENIED, message="refused"))
            return request(frame, **kwargs)

        admissions._commit_proposals = counted_make  # type: ignore[method-assign]
        link.request = refusing_request  # type: ignore[method-assign, assignment]
        conn = link._conn
        assert conn is not None
        release = hold_the_reply_to_the_next(conn, Commit)
        done = threading.Event()
        updating = threading.Thread(target=lambda: (chan_a.update_keys(), done.set()))
        updating.start()
        stop = threading.Event()

        def listen() -> None:  # as the manager's listener does
            while not stop.is_set():
                chan_a._deliveries.process_pending()
                stop.wait(0.05)

        listener = threading.Thread(target=listen)
        try:
            wait_for(lambda: chan_a._commits.busy)
            listener.start()
            wait_for(lambda: chan_a.epoch == 2)  # the listener applied the commit's echo
            with chan_a._lock:  # what processing does when it reads a leave proposal
                admissions.proposals = True
                admissions.arrivals += 1
            release.set()
            assert done.wait(15), "update_keys() kept retrying the admissions"
            assert tried, "the work left to it was tried"
        finally:
            release.set()
            stop.set()
            if listener.is_alive():
                listener.join(10)
            updating.join(15)


def test_a_closed_client_holds_no_file_of_its_data_dir_open(
    stack: LocalStack, channel_name: str, ids: Any
) -> None:
    """An application may keep a closed client and its channels referenced: close()
    itself releases the data_dir's files (the engine's, the checkpoint threads', the
    local state's), not the garbage collector later."""
    ca, chan_a, cb, chan_b = pair(stack, channel_name, ids("a"), ids("b"))
    data_dir = stack.agent_dir(ids("a")).resolve()
    with ca, cb:
        chan_a.send(b"hello")
        chan_a.wait_stored()
        assert take(chan_b, 1) == [b"hello"]
        assert _open_files_under(data_dir) > 0
        ca.close()
        assert _open_files_under(data_dir) == 0
        assert chan_a is not None  # still referenced, as an application may


def _open_files_under(directory: Any) -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            count += Path(os.readlink(f"/proc/self/fd/{fd}")).is_relative_to(directory)
    return count
