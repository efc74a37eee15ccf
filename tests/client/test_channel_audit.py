"""The audit trail through the real stack: the relay records each accepted commit's
membership changes, the account API serves them to the accounts admitted to the channel,
and the client and ``svc channels`` read them."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

import svc_cli
from svc_sdk import AccessError, AgentId, ChannelEvent, ChannelMember
from svc_sdk.testing import LocalStack

from .helpers import client

T = TypeVar("T")


def eventually(read: Callable[[], T], ok: Callable[[T], bool], timeout: float = 10.0) -> T:
    """``read()`` once ``ok`` holds for it: the relay records a commit's changes just
    after it answers the committer."""
    deadline = time.monotonic() + timeout
    while True:
        value = read()
        if ok(value) or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


def trail(events: list[ChannelEvent]) -> list[tuple[str, AgentId, AgentId | None, str]]:
    return [(e.kind, e.actor, e.subject, e.detail) for e in events]


def roster(members: list[ChannelMember]) -> list[tuple[AgentId, str]]:
    return [(m.agent, m.role) for m in members]


def run_cli(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    stack: LocalStack,
    key: str,
    *args: str,
) -> tuple[int, str, str]:
    monkeypatch.setenv("SVC_API_URL", stack.api_url)
    monkeypatch.setenv("SVC_API_KEY", key)
    capsys.readouterr()
    status = svc_cli.main(list(args))
    out, err = capsys.readouterr()
    return status, out, err


def test_members_roles_and_events_follow_the_commits(
    stack: LocalStack,
    channel_name: str,
    ids: Any,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    other_key = stack.signup()["api_key"]["key"]
    outsider_key = stack.signup()["api_key"]["key"]
    alice = client(stack, ids("alice"))
    bob = client(stack, ids("bob"), api_key=other_key)
    dave = client(stack, ids("dave"), api_key=other_key)
    carol = client(stack, ids("carol"), api_key=outsider_key)
    with alice, bob, dave, carol:
        a, b, d = alice.agent_id, bob.agent_id, dave.agent_id
        chan = alice.create_channel(channel_name)
        # Adding an agent of another account admits that account.
        bob_chan = bob.join_channel(channel_name, chan.add_member(bob.generate_key_package()))
        chan.set_role(b, "admin")
        # bob, an admin once his client has the role commit, adds an agent of his account.
        assert eventually(lambda: bob_chan.roles()[b], lambda role: role == "admin") == "admin"
        dave.join_channel(channel_name, bob_chan.add_member(dave.generate_key_package()))
        chan.remove_member(b)

        expected = [
            ("created", a, a, "owner"),
            ("added", a, b, ""),
            ("role", a, b, "admin"),
            ("added", b, d, ""),
            ("removed", a, b, ""),
        ]
        events = eventually(
            lambda: alice.channel_events(channel_name), lambda e: len(e) >= len(expected)
        )
        assert trail(events) == expected
        assert all(e.channel == channel_name for e in events)
        epochs = [e.epoch for e in events]
        assert epochs[0] == 0 and epochs == sorted(epochs) and len(set(epochs)) == 5
        assert [e.id for e in events] == sorted(e.id for e in events)

        # The roster after the removal: bob is gone, dave stays, so his account may read.
        for reader in (alice, dave):
            assert roster(reader.channel_members(channel_name)) == [(a, "owner"), (d, "member")]
        assert trail(dave.channel_events(channel_name)) == expected
        [theirs] = [c for c in dave.account_channels() if c.name == channel_name]
        assert (theirs.access, theirs.role, theirs.member_count) == ("member", "member", 2)
        assert [m.agent for m in theirs.agents] == [d]
        assert theirs.epoch == events[-1].epoch
        [ours] = [c for c in alice.account_channels() if c.name == channel_name]
        assert (ours.role, [m.agent for m in ours.agents]) == ("owner", [a])

        # Paging: two at a time, each page after the last id of the one before.
        first = alice.channel_events(channel_name, limit=2)
        second = alice.channel_events(channel_name, after=first[-1].id, limit=2)
        third = alice.channel_events(channel_name, after=second[-1].id, limit=2)
        assert first + second + third == events and len(third) == 1
        assert alice.channel_events(channel_name, after=events[-1].id) == []
        with pytest.raises(ValueError, match="limit"):
            alice.channel_events(channel_name, limit=1001)

        # Another account never admitted learns nothing, not even that the channel exists.
        assert channel_name not in [c.name for c in carol.account_channels()]
        for read in (carol.channel_members, carol.channel_events):
            with pytest.raises(AccessError, match="no channel"):
                read(channel_name)
            with pytest.raises(AccessError, match="no channel"):
                read("acme/nobody/has-this")

        # The command line: tables, --json, and the same refusal for the outsider.
        status, out, _ = run_cli(
            capsys, monkeypatch, stack, stack.api_key, "channels", "members", channel_name
        )
        assert status == 0
        lines = out.splitlines()
        assert lines[0].startswith(f"{channel_name} at epoch {events[-1].epoch}: 2 members")
        assert lines[1].split() == ["AGENT", "ACCOUNT_ID", "ROLE", "SINCE_EPOCH"]
        assert lines[2].split()[:3] == [a.name, a.account, "owner"]
        assert lines[3].split()[:3] == [d.name, d.account, "member"]

        status, out, err = run_cli(
            capsys,
            monkeypatch,
            stack,
            other_key,
            "channels",
            "events",
            channel_name,
            "--limit",
            "3",
        )
        assert status == 0
        rows = [line.split() for line in out.splitlines()]
        assert rows[0] == ["ID", "EPOCH", "AT", "KIND", "ACTOR", "SUBJECT", "DETAIL"]
        assert [(r[3], r[4], r[5], r[6]) for r in rows[1:]] == [
            (kind, str(actor), str(subject), detail or "-")
            for kind, actor, subject, detail in expected[:3]
        ]
        assert f"--after {events[2].id}" in err

        status, out, _ = run_cli(
            capsys,
            monkeypatch,
            stack,
            other_key,
            "channels",
            "events",
            channel_name,
            "--after",
            str(events[2].id),
            "--json",
        )
        body = json.loads(out)
        assert status == 0 and body["next_after"] is None
        assert [e["id"] for e in body["events"]] == [e.id for e in events[3:]]
        assert body["events"][0]["actor"] == {
            "agent": b.name,
            "identity": b.identity.hex(),
            "account_id": b.account,
        }

        status, out, _ = run_cli(capsys, monkeypatch, stack, other_key, "channels", "list")
        assert status == 0
        [row] = [line.split() for line in out.splitlines() if line.startswith(channel_name)]
        assert row == [channel_name, "member", "member", d.name, "2", str(events[-1].epoch)]

        for action in ("members", "events"):
            status, out, err = run_cli(
                capsys, monkeypatch, stack, outsider_key, "channels", action, channel_name
            )
            assert status == 1 and out == ""
            assert "no channel" in err and "HTTP 404" in err
        status, out, _ = run_cli(
            capsys, monkeypatch, stack, outsider_key, "channels", "list", "--json"
        )
        assert channel_name not in [c["name"] for c in json.loads(out)["channels"]]

        # Its last member gone, bob's and dave's account loses the channel's records too.
        chan.remove_member(d)
        eventually(
            lambda: len(alice.channel_events(channel_name)), lambda n: n == len(expected) + 1
        )
        assert roster(alice.channel_members(channel_name)) == [(a, "owner")]
        assert channel_name not in [c.name for c in dave.account_channels()]
        with pytest.raises(AccessError):
            dave.channel_members(channel_name)


def test_a_bad_page_size_is_refused_by_the_command_line(
    stack: LocalStack,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for bad in ("0", "1001", "ten"):
        with pytest.raises(SystemExit) as exc:
            run_cli(
                capsys,
                monkeypatch,
                stack,
                stack.api_key,
                "channels",
                "events",
                "acme/x/y",
                "--limit",
                bad,
            )
        assert exc.value.code == 2
    status, _, err = run_cli(
        capsys, monkeypatch, stack, stack.api_key, "channels", "members", "not-a-name"
    )
    assert status == 1 and "invalid channel name" in err
