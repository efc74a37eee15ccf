"""The channel endpoints on SQLite and PostgreSQL: the account's channels, a channel's
roster and its audit trail, as the relay records them (``channels.record``, called here
directly; tests/client/test_channel_audit.py drives the same through a real relay).
Outsiders get the same 404 whether the channel exists or not."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import httpx
import pytest

from svc_server.db.models import Invite, JoinRequest, utcnow
from svc_server.db.session import make_engine, make_sessionmaker, transaction
from svc_server.services import channels
from svc_server.services.channels import Event, Member

from ..support import RunningApi
from .conftest import bearer, signup

CHANNEL = "acme/ops/alerts"


class World:
    """Three accounts: alice owns CHANNEL, bob is added to it, carol is an outsider."""

    def __init__(self, api: RunningApi, http: httpx.Client) -> None:
        self.api, self.http = api, http
        people = {n: signup(http, f"{n}@example.com") for n in ("alice", "bob", "carol")}
        self.ids = {n: uuid.UUID(p["account"]["id"]) for n, p in people.items()}
        self.keys = {n: bearer(p["api_key"]["key"]) for n, p in people.items()}

    def agent(self, name: str, identity: bytes | None = None) -> tuple[uuid.UUID, bytes]:
        return self.ids[name], identity or name.encode()

    def write(self, work: Any) -> Any:
        engine = make_engine(self.api.settings)
        try:
            with transaction(make_sessionmaker(engine)) as session:
                return work(session)
        finally:
            engine.dispose()

    def record(
        self, epoch: int, members: list[tuple[str, str]], events: list[Event], name: str = CHANNEL
    ) -> None:
        roster = [Member(*self.agent(who), role) for who, role in members]
        self.write(lambda s: channels.record(s, name, epoch, roster, False, events))

    def get(self, who: str, path: str, **params: Any) -> httpx.Response:
        return self.http.get(path, headers=self.keys[who], params=params)


@pytest.fixture
def world(api: RunningApi, http: httpx.Client) -> World:
    """CHANNEL's history: alice creates it (epoch 0), adds bob (1), makes him admin (2),
    then removes him (3) and adds him back (4)."""
    w = World(api, http)
    alice, bob = w.agent("alice"), w.agent("bob")
    w.write(lambda s: channels.create(s, CHANNEL, w.ids["alice"]))
    w.record(0, [("alice", "owner")], [Event("created", alice, alice, "owner")])
    w.record(1, [("alice", "owner"), ("bob", "member")], [Event("added", alice, bob)])
    w.record(2, [("alice", "owner"), ("bob", "admin")], [Event("role", alice, bob, "admin")])
    w.record(3, [("alice", "owner")], [Event("removed", alice, bob)])
    w.record(4, [("alice", "owner"), ("bob", "member")], [Event("added", alice, bob)])
    return w


def _agent(w: World, name: str) -> dict[str, Any]:
    return {"agent": name, "identity": name.encode().hex(), "account_id": str(w.ids[name])}


def test_members_lists_the_roster_with_roles(world: World) -> None:
    for who in ("alice", "bob"):
        response = world.get(who, f"/v1/channels/{CHANNEL}/members")
        assert response.status_code == 200, response.text
        assert response.json() == {
            "channel": CHANNEL,
            "epoch": 4,
            "members": [
                {**_agent(world, "alice"), "role": "owner", "since_epoch": 0},
                # Removed at epoch 3 and added back: a member since its latest addition.
                {**_agent(world, "bob"), "role": "member", "since_epoch": 4},
            ],
        }


def test_events_are_the_audit_trail_oldest_first(world: World) -> None:
    response = world.get("bob", f"/v1/channels/{CHANNEL}/events")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["channel"] == CHANNEL and body["next_after"] is None
    events = body["events"]
    alice, bob = _agent(world, "alice"), _agent(world, "bob")
    assert [(e["epoch"], e["kind"], e["actor"], e["subject"], e["detail"]) for e in events] == [
        (0, "created", alice, alice, "owner"),
        (1, "added", alice, bob, ""),
        (2, "role", alice, bob, "admin"),
        (3, "removed", alice, bob, ""),
        (4, "added", alice, bob, ""),
    ]
    ids = [e["id"] for e in events]
    assert ids == sorted(ids) and len(set(ids)) == 5
    assert all(e["at"].endswith("Z") for e in events)


def test_events_page_by_cursor(world: World) -> None:
    path = f"/v1/channels/{CHANNEL}/events"
    everything = [e["id"] for e in world.get("alice", path).json()["events"]]
    seen: list[int] = []
    after = 0
    pages = 0
    while True:
        page = world.get("alice", path, after=after, limit=2).json()
        pages += 1
        seen += [e["id"] for e in page["events"]]
        assert len(page["events"]) <= 2
        if page["next_after"] is None:
            break
        assert page["next_after"] == page["events"][-1]["id"]
        after = page["next_after"]
    assert seen == everything and pages == 3
    # A full last page says there may be more; the page after it is empty.
    full = world.get("alice", path, after=everything[2], limit=2).json()
    assert full["next_after"] == everything[4]
    assert world.get("alice", path, after=everything[4]).json() == {
        "channel": CHANNEL,
        "events": [],
        "next_after": None,
    }
    assert len(world.get("alice", path, limit=1000).json()["events"]) == 5


@pytest.mark.parametrize(
    "params",
    [{"limit": 0}, {"limit": 1001}, {"limit": "ten"}, {"after": -1}, {"after": 2**63}],
)
def test_bad_paging_is_a_422_problem(world: World, params: dict[str, Any]) -> None:
    response = world.get("alice", f"/v1/channels/{CHANNEL}/events", **params)
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert problem["status"] == 422
    assert [e["field"] for e in problem["errors"]] == list(params)


def test_an_outsider_cannot_tell_the_channel_exists(world: World) -> None:
    answers = []
    for name in (CHANNEL, "acme/ops/nothing-here", "not-a-channel-name"):
        for suffix in ("members", "events"):
            response = world.get("carol", f"/v1/channels/{name}/{suffix}")
            assert response.status_code == 404, response.text
            assert response.headers["content-type"] == "application/problem+json"
            body = response.json()
            assert body["type"] == "urn:svc:problem:channel-not-found"
            answers.append(body["detail"].replace(name, "NAME"))
    assert len(set(answers)) == 1, answers
    assert world.get("carol", "/v1/channels").json() == {"channels": []}


def test_removed_account_loses_the_channel_and_its_history(world: World) -> None:
    world.record(
        5, [("alice", "owner")], [Event("removed", world.agent("alice"), world.agent("bob"))]
    )
    assert world.get("bob", f"/v1/channels/{CHANNEL}/members").status_code == 404
    assert world.get("bob", f"/v1/channels/{CHANNEL}/events").status_code == 404
    assert world.get("bob", "/v1/channels").json() == {"channels": []}
    assert world.get("alice", f"/v1/channels/{CHANNEL}/members").json()["epoch"] == 5


def test_list_shows_role_member_count_and_epoch(world: World) -> None:
    second = world.agent("alice", b"alice-2")
    other = "acme/ops/zz-second"
    world.write(lambda s: channels.create(s, other, world.ids["bob"]))
    world.record(
        0,
        [("bob", "owner")],
        [Event("created", world.agent("bob"), world.agent("bob"), "owner")],
        name=other,
    )
    # alice's account has two agents in CHANNEL: an owner and a plain member.
    roster = [
        Member(*world.agent("alice"), "owner"),
        Member(*second, "member"),
        Member(*world.agent("bob"), "admin"),
    ]
    world.write(lambda s: channels.record(s, CHANNEL, 6, roster, False, []))
    assert world.get("alice", "/v1/channels").json() == {
        "channels": [
            {
                "name": CHANNEL,
                "epoch": 6,
                "member_count": 3,
                "access": "member",
                "role": "owner",
                "agents": [
                    {**_agent(world, "alice"), "role": "owner", "since_epoch": 0},
                    {
                        "agent": "alice-2",
                        "identity": b"alice-2".hex(),
                        "account_id": str(world.ids["alice"]),
                        "role": "member",
                        "since_epoch": 6,
                    },
                ],
            }
        ]
    }
    listed = world.get("bob", "/v1/channels").json()["channels"]
    assert [(c["name"], c["role"], c["member_count"]) for c in listed] == [
        (CHANNEL, "admin", 3),
        (other, "owner", 1),
    ]


def test_a_live_invite_redemption_lists_the_channel_as_invited(world: World) -> None:
    now = utcnow()

    def redeem(expires_in: timedelta) -> Any:
        def work(session: Any) -> None:
            invite = Invite(
                token_hash=uuid.uuid4().hex,
                channel=CHANNEL,
                account_id=world.ids["alice"],
                max_uses=1,
                uses=1,
                created_at=now,
                expires_at=now + expires_in,
            )
            session.add(invite)
            session.flush()
            session.add(
                JoinRequest(
                    invite_id=invite.id,
                    channel=CHANNEL,
                    account_id=world.ids["carol"],
                    identity=b"carol",
                    key_package=b"kp",
                    created_at=now,
                )
            )

        return work

    # An expired redemption admits nobody.
    world.write(redeem(timedelta(seconds=-1)))
    assert world.get("carol", "/v1/channels").json() == {"channels": []}
    assert world.get("carol", f"/v1/channels/{CHANNEL}/members").status_code == 404
    world.write(redeem(timedelta(hours=1)))
    assert world.get("carol", "/v1/channels").json() == {
        "channels": [
            {
                "name": CHANNEL,
                "epoch": 4,
                "member_count": 2,
                "access": "invited",
                "role": None,
                "agents": [],
            }
        ]
    }
    assert world.get("carol", f"/v1/channels/{CHANNEL}/members").status_code == 200
    assert world.get("carol", f"/v1/channels/{CHANNEL}/events").status_code == 200


@pytest.mark.parametrize(
    "name", ["acme/members/events", "acme/events/members", "members/events/members"]
)
def test_names_with_the_suffixes_in_them_route_right(world: World, name: str) -> None:
    alice = world.agent("alice")
    world.write(lambda s: channels.create(s, name, world.ids["alice"]))
    world.record(0, [("alice", "owner")], [Event("created", alice, alice, "owner")], name=name)
    members = world.get("alice", f"/v1/channels/{name}/members")
    assert members.status_code == 200, members.text
    assert members.json()["channel"] == name
    assert len(members.json()["members"]) == 1
    events = world.get("alice", f"/v1/channels/{name}/events")
    assert events.status_code == 200, events.text
    assert [e["kind"] for e in events.json()["events"]] == ["created"]


def test_a_percent_encoded_name_is_the_same_channel(world: World) -> None:
    encoded = CHANNEL.replace("/", "%2F")
    response = world.get("alice", f"/v1/channels/{encoded}/members")
    assert response.status_code == 200, response.text
    assert response.json()["channel"] == CHANNEL


def test_identities_that_are_not_utf8_stay_exact(world: World) -> None:
    odd = world.agent("bob", b"caf\xc3\xa9\xff")
    roster = [Member(*world.agent("alice"), "owner"), Member(*odd, "member")]
    world.write(lambda s: channels.record(s, CHANNEL, 7, roster, False, [Event("added", odd, odd)]))
    member = world.get("alice", f"/v1/channels/{CHANNEL}/members").json()["members"][1]
    assert member["agent"] == "café\\xff"
    assert bytes.fromhex(member["identity"]) == b"caf\xc3\xa9\xff"


def test_every_channel_endpoint_needs_a_key(world: World) -> None:
    for path in (
        "/v1/channels",
        f"/v1/channels/{CHANNEL}/members",
        f"/v1/channels/{CHANNEL}/events",
    ):
        response = world.http.get(path)
        assert response.status_code == 401
        assert response.headers["content-type"] == "application/problem+json"
