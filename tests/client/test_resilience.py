"""Failures the client rides out: relay restarts, a relay process dying behind a list of
addresses, token expiry. Real processes, real kill -9."""

from __future__ import annotations

import gc
import logging
import random
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any, cast

import httpx
import pytest

from svc_sdk import Channel, SvcClient
from svc_sdk.errors import ChannelClosedError
from svc_sdk.local_state import LocalState
from svc_sdk.relay_link import OPEN_TIMEOUT, RelayLink
from svc_sdk.testing import LocalStack

from ..support import PostgresServer, RedisServer, scaled_out
from .helpers import client, pair, take


def test_relay_restart_loses_nothing_and_duplicates_nothing(ids: Any) -> None:
    with LocalStack() as stack:
        channel = "acme/tests/restart"
        ca, chan_a, cb, chan_b = pair(stack, channel, ids("a"), ids("b"))
        with ca, cb:
            for i in range(20):
                chan_a.send(f"m{i}".encode())
            assert take(chan_b, 10) == [f"m{i}".encode() for i in range(10)]
            stack.kill()  # SIGKILL: no goodbye to anyone
            sent = threading.Thread(
                target=lambda: [chan_a.send(f"m{i}".encode()) for i in range(20, 40)]
            )
            sent.start()  # blocks while the relay is down, then goes through
            time.sleep(0.5)
            stack.restart()
            sent.join(60)
            got = take(chan_b, 30, timeout=30)
            assert got == [f"m{i}".encode() for i in range(10, 40)]
            assert chan_b.next_message(0.5) is None  # and nothing twice
            assert cb.link.reconnects >= 1 and ca.link.reconnects >= 1


def test_relay_outage_logs_one_line_per_attempt(ids: Any, caplog: pytest.LogCaptureFixture) -> None:
    """While the relay is down, each reconnect attempt is one warning line; sends that
    were cut off leave no "Future exception was never retrieved" behind."""
    caplog.set_level(logging.WARNING)
    with LocalStack() as stack:
        ca, chan_a, cb, chan_b = pair(stack, "acme/tests/outage", ids("a"), ids("b"))
        with ca, cb:
            chan_a.send(b"before")
            stack.kill()
            sent = threading.Thread(
                target=lambda: [chan_a.send(f"m{i}".encode()) for i in range(20)]
            )
            sent.start()
            time.sleep(2.0)
            stack.restart()
            sent.join(60)
            assert take(chan_b, 21, timeout=30)[-1] == b"m19"
            gc.collect()  # an unretrieved future reports when it is collected
            time.sleep(0.2)
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]
    attempts = [r for r in caplog.records if "reconnecting (attempt" in r.getMessage()]
    assert attempts, "each failed attempt is logged"
    for record in attempts:
        assert record.name == "svc_sdk.relay" and record.exc_info is None
        assert "\n" not in record.getMessage()
        assert "127.0.0.1" in record.getMessage()


def test_reconnecting_leaves_the_global_random_state_alone(ids: Any) -> None:
    """The reconnect jitter comes from the library's own generator: an application that
    seeded ``random`` (a simulation, a test run under Hypothesis) sees the same sequence
    whether or not its agent is riding out an outage meanwhile. (Nothing else in this
    process draws from it while the test runs.)"""
    with LocalStack() as stack, client(stack, ids("a")) as agent:
        before = random.getstate()
        stack.kill()
        deadline = time.monotonic() + 30
        while agent.link.connected or agent.link._endpoint_index < 3:
            assert time.monotonic() < deadline, "no reconnect attempts"
            time.sleep(0.05)
        assert random.getstate() == before
        stack.restart()


def test_token_is_renewed_before_it_expires(ids: Any) -> None:
    with LocalStack(token_ttl_seconds=6) as stack:
        channel = "acme/tests/tokens"
        ca, chan_a, cb, chan_b = pair(stack, channel, ids("a"), ids("b"))
        with ca, cb:
            first = ca.api.token() if ca.api else ""
            time.sleep(8)  # past the first token's expiry
            chan_a.send(b"still authenticated")
            assert take(chan_b, 1) == [b"still authenticated"]
            assert ca.api is not None and ca.api.token() != first
            assert ca.link.reconnects == 0 and cb.link.reconnects == 0


def test_failover_between_relays_on_redis(
    tmp_path: Path, postgres: PostgresServer | None, redis_server: RedisServer | None, ids: Any
) -> None:
    if redis_server is None:
        pytest.skip("no redis-server on this machine")
    with scaled_out(tmp_path, postgres, redis_server, "client") as cluster:
        api_url, (a_port, b_port) = cluster.api_url, cluster.relay_ports
        key = httpx.post(f"{api_url}/v1/accounts", json={"email": "fo@example.com"}).json()[
            "api_key"
        ]["key"]
        both = f"http://127.0.0.1:{a_port},http://127.0.0.1:{b_port}"

        def make(name: str, endpoint: str) -> SvcClient:
            deadline = time.monotonic() + 30
            while True:
                try:
                    return SvcClient(
                        endpoint, tmp_path / name, name.encode(), key, api_url, connect_timeout=2
                    )
                except RuntimeError:
                    if time.monotonic() > deadline:
                        raise

        alice = make(ids("alice"), both)  # on relay A, the first address
        bob = make(ids("bob"), f"http://127.0.0.1:{b_port}")
        with alice, bob:
            chan_a = alice.create_channel("acme/tests/failover")
            chan_b = bob.join_channel(
                "acme/tests/failover", chan_a.add_member(bob.generate_key_package())
            )
            for i in range(10):
                chan_a.send(f"m{i}".encode())
            assert take(chan_b, 10) == [f"m{i}".encode() for i in range(10)]
            cluster.relays[0].kill()  # relay A dies: alice moves on to B
            cluster.relays[0].wait()
            for i in range(10, 20):
                chan_a.send(f"m{i}".encode())
            bob_to_alice = [f"r{i}".encode() for i in range(5)]
            for payload in bob_to_alice:
                chan_b.send(payload)
            assert take(chan_b, 10) == [f"m{i}".encode() for i in range(10, 20)]
            assert take(chan_a, 5) == bob_to_alice
            assert alice.link.endpoint.endswith(str(b_port))
            assert chan_b.next_message(0.3) is None


def test_a_channel_refused_for_now_when_its_agent_reconnects_stays_open(
    stack: LocalStack, ids: Any
) -> None:
    """A Subscribe the relay refuses for now (RESOURCE_EXHAUSTED: the account spent its
    budget of refused requests; UNAVAILABLE: its store did not answer) when an agent
    reconnects does not close the channel: the link subscribes it again on a new
    connection, after its backoff, and what was sent meanwhile arrives."""
    import asyncio
    import itertools

    from svc_sdk._relay_pb import relay_pb2 as pb
    from svc_sdk.relay_client import RelayConnection

    def new_key(email: str) -> str:
        body = httpx.post(f"{stack.api_url}/v1/accounts", json={"email": email}).json()
        key: str = body["api_key"]["key"]
        return key

    key = new_key(f"{ids('retry')}@example.com")  # a budget of its own
    alice = client(stack, ids("alice"), api_key=key)
    bob = client(stack, ids("bob"), api_key=key)
    other = client(stack, ids("other"), api_key=new_key(f"{ids('other')}@example.com"))
    refused = f"acme/tests/{ids('not-ours')}"
    other.create_channel(refused)
    channel = f"acme/tests/{ids('retry')}"
    token = httpx.post(
        f"{stack.api_url}/v1/tokens", headers={"Authorization": f"Bearer {key}"}
    ).json()["token"]
    throttled, stop = threading.Event(), threading.Event()

    def spend_the_budget() -> None:  # another agent of the account, asking and asking
        async def run() -> None:
            # A stream refuses a channel it was throttled on without a check (which
            # spends nothing), and is closed past 1,000 of them: a new name each time,
            # a new stream every 500.
            names = itertools.chain([refused], (f"{refused}-{n}" for n in itertools.count()))
            while not stop.is_set():
                async with RelayConnection(stack.relay_url, token, b"asker") as conn:
                    for name in itertools.islice(names, 500):
                        reply = await conn.request(pb.Subscribe(channel=name), check=False)
                        if reply.code == 8:  # RESOURCE_EXHAUSTED
                            throttled.set()
                        if stop.is_set():
                            break

        asyncio.run(run())

    asker = threading.Thread(target=spend_the_budget)
    with alice, bob, other:
        chan_a = alice.create_channel(channel)
        chan_b = bob.join_channel(channel, chan_a.add_member(bob.generate_key_package()))
        chan_a.send(b"before")
        assert take(chan_b, 1) == [b"before"]
        asker.start()
        try:
            assert throttled.wait(30)
            reconnects = bob.link.reconnects
            bob.link.abandon(bob.link.generation, "the test drops the connection")
            time.sleep(1)  # bob's Subscribe, on each reconnect, is refused for now
            assert bob.link.reconnects == reconnects, "subscribed with the budget spent?"
        finally:
            stop.set()
            asker.join()
        chan_a.send(b"after")
        assert take(chan_b, 1) == [b"after"]
        assert bob.link.reconnects > reconnects


def test_agent_restart_resumes_from_its_cursor(stack: LocalStack, ids: Any) -> None:
    channel = f"acme/tests/agent-restart-{time.monotonic_ns()}"
    ca, chan_a, cb, chan_b = pair(stack, channel, ids("a"), ids("b"))
    with ca:
        chan_a.send(b"one")
        assert take(chan_b, 1) == [b"one"]
        cb.close()
        chan_a.send(b"two")
        chan_a.update_keys()  # a commit while bob is away
        chan_a.send(b"three")
        with client(stack, ids("b")) as again:
            chan = again.channel(channel)
            assert take(chan, 2) == [b"two", b"three"]
            chan.send(b"back")
            assert take(chan_a, 1) == [b"back"]


def alice_and_bob_in_a_process(
    stack: LocalStack, ids: Any, name: str, script: str
) -> tuple[str, SvcClient, Channel, subprocess.Popen[str], IO[str]]:
    """A channel of alice (here) and bob, then ``script`` run as bob in its own
    interpreter with the relay, data_dir, identity, API key, API URL and channel as
    arguments. Returns once the script printed "ready", with its stdout."""
    channel = f"acme/tests/{name}-{time.monotonic_ns()}"
    ca, chan_a, cb, _ = pair(stack, channel, ids("a"), ids("b"))
    cb.close()
    args = [stack.relay_url, str(stack.agent_dir(ids("b"))), ids("b")]
    args += [stack.api_key, stack.api_url, channel]
    process = subprocess.Popen(
        [sys.executable, "-c", script, *args], stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "ready"
    return channel, ca, chan_a, process, process.stdout


READER = """
import os, signal, sys
from svc_sdk import Channel, SvcClient
relay, data_dir, identity, key, api, name = sys.argv[1:]
channel = SvcClient(relay, data_dir, identity.encode(), key, api).channel(name)
print("ready", flush=True)
for _ in range(3):
    message = channel.next_message(20)
    print(message.seq, message.data.decode(), flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # before anything records the last read
"""


def test_agent_killed_right_after_reading_repeats_and_loses_nothing(
    stack: LocalStack, ids: Any
) -> None:
    channel, ca, chan_a, reader, out = alice_and_bob_in_a_process(stack, ids, "kill", READER)
    with ca:
        seqs = []
        for i in range(3):
            chan_a.send(f"m{i}".encode())
            seq, data = out.readline().split()
            assert data == f"m{i}"
            seqs.append(int(seq))
        assert reader.wait(30) == -9
        # The last message was handed over but the cursor on disk is behind it: the
        # relay sends it again after the restart, and its key is already used.
        state = LocalState(stack.agent_dir(ids("b")))
        ((_, cursor, _),) = state.channels()
        state.close()
        assert cursor < seqs[-1]
        chan_a.send(b"m3")
        with client(stack, ids("b")) as again:
            chan = again.channel(channel)
            assert take(chan, 1) == [b"m3"]
            assert chan.next_message(0.5) is None


def test_close_ends_a_send_waiting_for_the_relay(ids: Any) -> None:
    with LocalStack() as stack:
        channel = "acme/tests/close-while-sending"
        ca, chan_a, cb, _ = pair(stack, channel, ids("a"), ids("b"))
        cb.close()
        stack.kill()  # the relay is gone: the message waits in the outbox
        errors: list[BaseException] = []

        def send() -> None:
            try:
                chan_a.send(b"never stored")  # queued: returns at once
                chan_a.wait_stored()
            except Exception as exc:
                errors.append(exc)

        sender = threading.Thread(target=send)
        sender.start()
        time.sleep(0.5)
        assert sender.is_alive()
        started = time.monotonic()
        ca.close()
        sender.join(10)
        assert not sender.is_alive() and time.monotonic() - started < 6
        assert len(errors) == 1 and str(errors[0]).startswith("runtime error: the client is closed")


CRASH_BEFORE_STORE = """
import os, signal, sys, time
from svc_sdk import Channel, SvcClient
from svc_sdk.local_state import LocalState
relay, data_dir, identity, key, api, name = sys.argv[1:]

def crash(*args):  # dies after decrypting, before the inbox write
    os.kill(os.getpid(), signal.SIGKILL)

LocalState.advance = crash
channel = SvcClient(relay, data_dir, identity.encode(), key, api).channel(name)
print("ready", flush=True)
assert channel._deliveries.wait(20)
time.sleep(0.3)  # both messages queued
channel._deliveries.process_pending()  # nobody reading: decrypt into the inbox
print("not reached", flush=True)
"""


def test_agent_killed_between_decrypting_and_storing_loses_nothing(
    stack: LocalStack, ids: Any
) -> None:
    channel, ca, chan_a, reader, out = alice_and_bob_in_a_process(
        stack, ids, "crash-before-store", CRASH_BEFORE_STORE
    )
    with ca:
        chan_a.send_batch([b"m0", b"m1"])
        assert reader.wait(30) == -9
        assert out.read() == ""
        # The engine had not written its state: after the restart both decrypt again.
        with client(stack, ids("b")) as again:
            assert take(again.channel(channel), 2) == [b"m0", b"m1"]


def test_a_relay_that_accepts_but_never_answers_is_passed_over(stack: LocalStack, ids: Any) -> None:
    """A first address whose listener takes the TCP connection and then says nothing (a
    wedged relay or proxy) costs the open timeout, not the connection: the link moves on
    to the next address."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        endpoints = f"http://127.0.0.1:{silent.getsockname()[1]},{stack.relay_url}"
        started = time.monotonic()
        with client(stack, ids("alice"), endpoint=endpoints, connect_timeout=30) as alice:
            assert alice.link.endpoint == stack.relay_url
            assert time.monotonic() - started < OPEN_TIMEOUT + 10
            chan = alice.create_channel(f"acme/tests/{ids('passed-over')}")
            chan.send(b"hello")
            chan.wait_stored(10)


def test_a_subscription_waiting_for_the_relay_ends_when_the_client_closes() -> None:
    """A channel being opened while the relay is away waits for the next connection; a
    close() meanwhile ends that wait at once with ChannelClosedError, not after the
    subscription's timeout, and leaves no subscription behind."""
    link = RelayLink(["127.0.0.1:1"], b"me", tokens=cast(Any, None))
    outcome: list[BaseException] = []

    def open_channel() -> None:
        try:
            link.subscribe("acme/tests/waiting", 0, cast(Any, None), timeout=30)
        except BaseException as exc:
            outcome.append(exc)

    waiting = threading.Thread(target=open_channel)
    waiting.start()
    time.sleep(0.2)
    link.close()
    waiting.join(5)
    assert not waiting.is_alive(), "still waiting after close()"
    assert len(outcome) == 1 and isinstance(outcome[0], ChannelClosedError), outcome
    assert "acme/tests/waiting" not in link._subs
