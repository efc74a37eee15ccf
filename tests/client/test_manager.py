"""SvcChannelManager and invites, end to end on a real local stack."""

from __future__ import annotations

import shutil
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from svc_sdk import Envelope, InviteError, Protocol, SvcChannelManager
from svc_sdk.manager import default_data_dir
from svc_sdk.testing import LocalStack


def invited(stack: LocalStack, channel: str, a: str, b: str) -> tuple[Any, Any]:
    alice, bob = stack.manager(a), stack.manager(b)
    alice.create(channel)
    bob.join_with_token(channel, alice.invite(channel), timeout=15)
    return alice, bob


def test_defaults_come_from_the_environment(
    stack: LocalStack, ids: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SVC_RELAY", stack.relay_url)
    monkeypatch.setenv("SVC_DATA_DIR", str(tmp_path / "agent"))
    monkeypatch.setenv("SVC_API_KEY", stack.api_key)
    monkeypatch.setenv("SVC_API_URL", stack.api_url)
    with SvcChannelManager(ids("env")) as manager:  # identity as str: UTF-8
        assert manager.identity == ids("env").encode()
        assert manager.client.engine.data_dir == tmp_path / "agent"
        assert manager.client.link.endpoints == [stack.relay_url]
        assert manager.client.api is not None and manager.client.api.api_url == stack.api_url
        assert manager.list_channels() == []


def test_data_dir_default_is_tmp_svc_hex(
    stack: LocalStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SVC_DATA_DIR", raising=False)
    identity = f"default-dir-{time.monotonic_ns()}".encode()
    expected = default_data_dir(identity, stack.relay_url, stack.account_id)
    try:
        with stack.manager(identity, data_dir=None) as manager:
            assert str(manager.client.engine.data_dir) == expected
    finally:
        shutil.rmtree(expected, ignore_errors=True)


def test_invite_join_and_exchange(stack: LocalStack, channel_name: str, ids: Any) -> None:
    alice, bob = stack.manager(ids("alice")), stack.manager(ids("bob"))
    alice.create(channel_name)
    token = alice.invite(channel_name)
    assert token.startswith("svc_inv_")
    started = time.monotonic()
    bob.join_with_token(channel_name, token)
    joined_in = time.monotonic() - started
    assert joined_in < 5, joined_in  # the member is told at once, not by polling
    alice.send(channel_name, "hello")
    bob.send(channel_name, b"hi")
    assert bob.receive(channel_name) == ["hello"]
    assert alice.receive(channel_name) == ["hi"]
    assert bob.list_channels() == [channel_name]


def test_invite_across_accounts_admits_the_joiner(
    stack: LocalStack, channel_name: str, ids: Any
) -> None:
    other_key = stack.signup()["api_key"]["key"]
    alice = stack.manager(ids("alice"))
    mallory_key_bob = stack.manager(ids("bob"), api_key=other_key)
    alice.create(channel_name)
    mallory_key_bob.join_with_token(channel_name, alice.invite(channel_name), timeout=15)
    mallory_key_bob.send(channel_name, "from another account")
    assert alice.receive(channel_name) == ["from another account"]


def test_receive_drains_and_receive_latest_keeps_the_newest(
    stack: LocalStack, channel_name: str, ids: Any
) -> None:
    alice, bob = invited(stack, channel_name, ids("a"), ids("b"))
    for i in range(5):
        alice.send(channel_name, f"m{i}")
    got: list[str] = []
    while len(got) < 5:
        got += bob.receive(channel_name, timeout=10)
    assert got == [f"m{i}" for i in range(5)]
    assert bob.receive(channel_name, timeout=0.2) == []
    for i in range(3):
        alice.send(channel_name, f"n{i}")
    deadline = time.monotonic() + 10
    while bob.client.channel(channel_name)._pending_count() < 3 and time.monotonic() < deadline:
        time.sleep(0.01)  # the listener thread decrypts in the background
    assert bob.receive_latest(channel_name) == "n2"
    assert bob.receive_latest(channel_name, timeout=0.2) is None
    # Waiting happens only when nothing is buffered.
    alice.send(channel_name, "late")
    assert bob.receive(channel_name, timeout=30) == ["late"]


def test_envelopes(stack: LocalStack, channel_name: str, ids: Any) -> None:
    alice, bob = invited(stack, channel_name, ids("a"), ids("b"))
    env = Envelope(Protocol.MCP, "application/json", b'{"jsonrpc":"2.0"}', {"id": 1})
    alice.send_envelope(channel_name, env)
    alice.send(channel_name, "plain text")
    got: list[Envelope] = []
    while len(got) < 2:
        got += bob.receive_envelopes(channel_name, timeout=10)
    assert got[0] == env
    assert got[1] == Envelope(Protocol.RAW, "application/octet-stream", b"plain text")


def test_max_uses_is_atomic(stack: LocalStack, channel_name: str, ids: Any) -> None:
    alice = stack.manager(ids("alice"))
    alice.create(channel_name)
    token = alice.invite(channel_name, max_uses=1)
    joiners = [stack.manager(ids(f"j{i}")) for i in range(2)]
    results: dict[int, object] = {}
    barrier = threading.Barrier(2)

    def join(i: int) -> None:
        barrier.wait()
        try:
            joiners[i].join_with_token(channel_name, token, timeout=15)
            results[i] = "joined"
        except InviteError as exc:
            results[i] = exc

    threads = [threading.Thread(target=join, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(map(str, results.values())) == [
        "joined",
        "runtime error: invite token has no uses left",
    ]
    refused = [r for r in results.values() if isinstance(r, InviteError)]
    assert [r.reason for r in refused] == ["used-up"]
    assert len(alice.members(channel_name)) == 2


def test_bad_tokens_and_timeouts(stack: LocalStack, channel_name: str, ids: Any) -> None:
    alice, bob = stack.manager(ids("alice")), stack.manager(ids("bob"))
    alice.create(channel_name)
    # ``reason`` tells the kinds apart without parsing messages.
    with pytest.raises(InviteError, match="^runtime error: invite token is not valid") as bad:
        bob.join_with_token(channel_name, "svc_inv_" + "A" * 43)
    assert bad.value.reason == "invalid"
    with pytest.raises(InviteError, match="must be a string starting with svc_inv_") as bad:
        bob.join_with_token(channel_name, "sk_live_nope")
    assert bad.value.reason == "invalid"
    # A token for one channel does not open another.
    other = channel_name + "x"
    alice.create(other)
    with pytest.raises(InviteError, match="not valid for this channel") as bad:
        bob.join_with_token(channel_name, alice.invite(other))
    assert bad.value.reason == "invalid"
    expiring = alice.invite(channel_name, ttl=1)
    time.sleep(1.2)
    with pytest.raises(InviteError, match="expired") as bad:
        bob.join_with_token(channel_name, expiring)
    assert bad.value.reason == "expired"
    # Nobody online to add bob: a clear timeout.
    token = alice.invite(channel_name)
    alice.close()
    with pytest.raises(
        InviteError, match="no member of channel .* added this agent within 1 s"
    ) as late:
        bob.join_with_token(channel_name, token, timeout=1)
    assert late.value.reason == "timeout"
    assert bob.list_channels() == []


def test_invite_tokens_are_stored_hashed(stack: LocalStack, channel_name: str, ids: Any) -> None:
    alice = stack.manager(ids("alice"))
    alice.create(channel_name)
    token = alice.invite(channel_name)
    db = stack.data_dir / "server" / "svc.sqlite3"
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT token_hash FROM invites").fetchall()
    assert rows and all(token not in str(row) for row in rows)
    for path in (stack.data_dir / "server").iterdir():
        assert token.encode() not in path.read_bytes()


def test_close_stops_listeners_within_a_second_and_is_idempotent(
    stack: LocalStack, channel_name: str, ids: Any
) -> None:
    alice, _ = invited(stack, channel_name, ids("a"), ids("b"))
    listeners = [t for t in threading.enumerate() if t.name == f"svc-listen-{channel_name}"]
    assert len(listeners) == 2
    started = time.monotonic()
    alice.close()
    assert time.monotonic() - started < 1.5
    alice.close()
    alive = [t for t in threading.enumerate() if t.name == f"svc-listen-{channel_name}"]
    assert len(alive) == 1  # only bob's


def test_restart_knows_its_channels_and_gets_what_it_missed(
    stack: LocalStack, channel_name: str, ids: Any
) -> None:
    alice, bob = invited(stack, channel_name, ids("a"), ids("b"))
    alice.send(channel_name, "before")
    assert bob.receive(channel_name, timeout=10) == ["before"]
    alice.send(channel_name, "unread at close")
    deadline = time.monotonic() + 10
    while bob.client.channel(channel_name)._pending_count() < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    bob.close()
    for i in range(3):
        alice.send(channel_name, f"while down {i}")
    bob = stack.manager(ids("b"))
    assert bob.list_channels() == [channel_name]
    got: list[str] = []
    while len(got) < 4:
        got += bob.receive(channel_name, timeout=10)
    assert got == ["unread at close"] + [f"while down {i}" for i in range(3)]
    bob.send(channel_name, "back")
    assert alice.receive(channel_name, timeout=10) == ["back"]
