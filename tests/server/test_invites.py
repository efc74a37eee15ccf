"""Invite endpoints on SQLite and PostgreSQL: hashed tokens, atomic use counting,
redemption admitting the account, and problem+json for every bad input."""

from __future__ import annotations

import base64
import threading
import time
import uuid
from typing import Any

import httpx
from sqlalchemy import select, update

from svc_sdk.api_client import ApiClient
from svc_sdk.mls import Engine, inspect
from svc_server.db.models import Invite, JoinRequest, utcnow
from svc_server.db.session import make_engine, make_sessionmaker, transaction
from svc_server.services import channels, invites

from ..conftest import ISSUER
from ..support import RunningApi
from .conftest import bearer, signup

CHANNEL = "acme/ops/alerts"


def _register(api: RunningApi, owner: str) -> None:
    engine = make_engine(api.settings)
    try:
        with transaction(make_sessionmaker(engine)) as session:
            account = uuid.UUID(owner)
            assert channels.create(session, CHANNEL, account) == "created"
            # The relay records the creator as the owner member once it tracks the group.
            channels.record(
                session, CHANNEL, 0, [channels.Member(account, b"owner", "owner")], False, []
            )
    finally:
        engine.dispose()


def _kp(api: RunningApi, key: str, tmp_path: Any, name: str) -> str:
    """A key package of agent ``name`` of the account of API ``key``, with a credential
    from the API, base64."""
    engine = Engine(tmp_path / name, name.encode())
    client = ApiClient(api.url, key)
    try:
        engine.set_trust_anchors(client.credential_keys())
        engine.install_credential(client.agent_credential(engine))
    finally:
        client.close()
    return base64.b64encode(engine.generate_key_package()).decode()


def test_invite_lifecycle(api: RunningApi, http: httpx.Client, tmp_path: Any) -> None:
    owner = signup(http, "owner@example.com")
    joiner = signup(http, "joiner@example.com")
    own, other = bearer(owner["api_key"]["key"]), bearer(joiner["api_key"]["key"])
    _register(api, owner["account"]["id"])
    # Only an account that uses the channel can invite; outsiders get 404.
    assert http.post("/v1/invites", json={"channel": CHANNEL}, headers=other).status_code == 404
    made = http.post("/v1/invites", json={"channel": CHANNEL, "max_uses": 2}, headers=own)
    assert made.status_code == 201, made.text
    token = made.json()["token"]
    assert token.startswith("svc_inv_") and made.json()["max_uses"] == 2
    jkey = joiner["api_key"]["key"]
    body = {"channel": CHANNEL, "token": token, "key_package": _kp(api, jkey, tmp_path, "j1")}
    redeemed = http.post("/v1/invites/redeem", json=body, headers=other)
    assert redeemed.status_code == 201, redeemed.text
    assert redeemed.json()["identity"] == b"j1".hex()
    # The same agent again: no second use consumed, same join request.
    again = http.post("/v1/invites/redeem", json=body, headers=other)
    assert again.json()["join_id"] == redeemed.json()["join_id"]
    second = {**body, "key_package": _kp(api, jkey, tmp_path, "j2")}
    assert http.post("/v1/invites/redeem", json=second, headers=other).status_code == 201
    third = {**body, "key_package": _kp(api, jkey, tmp_path, "j3")}
    used_up = http.post("/v1/invites/redeem", json=third, headers=other)
    assert used_up.status_code == 410 and "no uses left" in used_up.json()["detail"]
    # The joiner's account may now use the channel, but not invite further accounts.
    engine = make_engine(api.settings)
    with transaction(make_sessionmaker(engine)) as session:
        assert channels.has_access(session, CHANNEL, uuid.UUID(joiner["account"]["id"]))
    engine.dispose()
    theirs = http.post("/v1/invites", json={"channel": CHANNEL, "max_uses": 10_000}, headers=other)
    assert theirs.status_code == 403, theirs.text
    assert "only accounts with an owner or admin" in theirs.json()["detail"]


def test_bad_redemptions(api: RunningApi, http: httpx.Client, tmp_path: Any) -> None:
    owner = signup(http, "o2@example.com")
    own = bearer(owner["api_key"]["key"])
    _register(api, owner["account"]["id"])
    token = http.post("/v1/invites", json={"channel": CHANNEL, "ttl": 1}, headers=own).json()[
        "token"
    ]
    kp = _kp(api, owner["api_key"]["key"], tmp_path, "x")
    # A key package of another account's agent, and one whose credential no API issued.
    stranger = signup(http, "stranger@example.com")["api_key"]["key"]
    theirs = _kp(api, stranger, tmp_path, "theirs")
    forged_engine = ISSUER.certify(Engine(tmp_path / "forged", b"forged"))
    forged = base64.b64encode(forged_engine.generate_key_package()).decode()
    cases = [
        ({"channel": CHANNEL, "token": token, "key_package": theirs}, 403),
        ({"channel": CHANNEL, "token": token, "key_package": forged}, 422),
        ({"channel": CHANNEL, "token": "svc_inv_" + "A" * 43, "key_package": kp}, 404),
        ({"channel": "acme/ops/other", "token": token, "key_package": kp}, 404),
        ({"channel": CHANNEL, "token": "garbage", "key_package": kp}, 404),
        ({"channel": CHANNEL, "token": token, "key_package": "!!!"}, 422),
        ({"channel": CHANNEL, "token": token, "key_package": base64.b64encode(b"x").decode()}, 422),
        ({"channel": "not a channel", "token": token, "key_package": kp}, 422),
    ]
    for body, status in cases:
        response = http.post("/v1/invites/redeem", json=body, headers=own)
        assert response.status_code == status, (body, response.text)
        assert response.headers["content-type"] == "application/problem+json"
    bad_ttl = http.post("/v1/invites", json={"channel": CHANNEL, "ttl": 0}, headers=own)
    assert bad_ttl.status_code == 422
    time.sleep(1.1)
    expired = http.post(
        "/v1/invites/redeem",
        json={"channel": CHANNEL, "token": token, "key_package": kp},
        headers=own,
    )
    assert expired.status_code == 410 and "expired" in expired.json()["detail"]


def test_last_use_goes_to_exactly_one_of_racing_redeemers(
    api: RunningApi, http: httpx.Client, tmp_path: Any
) -> None:
    owner = signup(http, "o3@example.com")
    key = owner["api_key"]["key"]
    own = bearer(key)
    _register(api, owner["account"]["id"])
    token = http.post("/v1/invites", json={"channel": CHANNEL}, headers=own).json()["token"]
    bodies = [
        {"channel": CHANNEL, "token": token, "key_package": _kp(api, key, tmp_path, f"r{i}")}
        for i in range(8)
    ]
    statuses: list[int] = []
    barrier = threading.Barrier(len(bodies))

    def redeem(body: dict[str, str]) -> None:
        with httpx.Client(base_url=api.url, timeout=30) as client:
            barrier.wait()
            statuses.append(client.post("/v1/invites/redeem", json=body, headers=own).status_code)

    threads = [threading.Thread(target=redeem, args=(b,)) for b in bodies]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(statuses) == [201] + [410] * 7


def test_another_account_cannot_take_over_a_pending_join(
    api: RunningApi, http: httpx.Client, tmp_path: Any
) -> None:
    """An account that redeems a token someone else used, with its own agent of the same
    identity, gets nothing and changes nothing: the pending join stays the first one's."""
    owner = signup(http, "o4@example.com")
    own = bearer(owner["api_key"]["key"])
    _register(api, owner["account"]["id"])
    b_key, c_key = (signup(http, f"{who}@example.com")["api_key"]["key"] for who in "bc")
    one_use = http.post("/v1/invites", json={"channel": CHANNEL}, headers=own).json()["token"]
    b_kp = _kp(api, b_key, tmp_path, "bob")
    body = {"channel": CHANNEL, "token": one_use, "key_package": b_kp}
    b_join = http.post("/v1/invites/redeem", json=body, headers=bearer(b_key))
    assert b_join.status_code == 201, b_join.text
    c_body = {**body, "key_package": _kp(api, c_key, tmp_path / "c", "bob")}
    taken = http.post("/v1/invites/redeem", json=c_body, headers=bearer(c_key))
    assert taken.status_code == 410 and "no uses left" in taken.json()["detail"]
    engine = make_engine(api.settings)
    try:
        with transaction(make_sessionmaker(engine)) as session:
            rows = session.execute(
                select(JoinRequest.account_id, JoinRequest.key_package).where(
                    JoinRequest.channel == CHANNEL
                )
            ).all()
            assert [bytes(kp) for _, kp in rows] == [base64.b64decode(b_kp)]
            assert not channels.has_access(session, CHANNEL, _account_of(http, c_key))
    finally:
        engine.dispose()
    # With uses left, the other account's agent gets its own join request, apart.
    two_uses = http.post(
        "/v1/invites", json={"channel": CHANNEL, "max_uses": 2}, headers=own
    ).json()["token"]
    first = http.post("/v1/invites/redeem", json={**body, "token": two_uses}, headers=bearer(b_key))
    second = http.post(
        "/v1/invites/redeem", json={**c_body, "token": two_uses}, headers=bearer(c_key)
    )
    assert first.status_code == second.status_code == 201
    assert first.json()["join_id"] != second.json()["join_id"]


def _account_of(http: httpx.Client, key: str) -> uuid.UUID:
    me = http.get("/v1/accounts/me", headers=bearer(key))
    assert me.status_code == 200, me.text
    return uuid.UUID(me.json()["id"])


def test_a_removal_ends_the_removed_agents_redemption(
    api: RunningApi, http: httpx.Client, tmp_path: Any
) -> None:
    """A redemption is spent once its agent is in. Its removal drops it too, so the
    account is out of the channel and cannot mint an invite even when the roster that
    added the agent was never recorded."""
    owner = signup(http, "o5@example.com")
    _register(api, owner["account"]["id"])
    bob_key = signup(http, "b5@example.com")["api_key"]["key"]
    token = http.post(
        "/v1/invites", json={"channel": CHANNEL}, headers=bearer(owner["api_key"]["key"])
    ).json()["token"]
    body = {"channel": CHANNEL, "token": token, "key_package": _kp(api, bob_key, tmp_path, "bob")}
    assert http.post("/v1/invites/redeem", json=body, headers=bearer(bob_key)).status_code == 201
    bob = _account_of(http, bob_key)
    alice = channels.Member(uuid.UUID(owner["account"]["id"]), b"owner", "owner")
    removed = channels.Event("removed", (alice.account_id, b"owner"), (bob, b"bob"))
    engine = make_engine(api.settings)
    try:
        with transaction(make_sessionmaker(engine)) as session:
            assert channels.has_access(session, CHANNEL, bob)
            channels.record(session, CHANNEL, 2, [alice], False, [removed])
        with transaction(make_sessionmaker(engine)) as session:
            assert not channels.has_access(session, CHANNEL, bob)
    finally:
        engine.dispose()
    refused = http.post("/v1/invites", json={"channel": CHANNEL}, headers=bearer(bob_key))
    assert refused.status_code == 404, refused.text


def test_an_invite_ends_when_its_account_can_no_longer_invite(
    api: RunningApi, http: httpx.Client, tmp_path: Any
) -> None:
    """An invite is good only while the account that made it may still invite: once the
    relay's roster shows it demoted (or removed, or the policy no longer lets members
    invite), its invites no longer redeem (410, invite-expired) and the redemptions made
    with them no longer admit anyone. Regaining the authority does not revive them."""
    owner = signup(http, "o6@example.com")
    _register(api, owner["account"]["id"])
    alice = channels.Member(uuid.UUID(owner["account"]["id"]), b"owner", "owner")
    admin_key = signup(http, "a6@example.com")["api_key"]["key"]
    admin = _account_of(http, admin_key)
    joiner_key = signup(http, "j6@example.com")["api_key"]["key"]
    joiner = _account_of(http, joiner_key)

    def roster(epoch: int, role: str, members_invite: bool = False) -> None:
        engine = make_engine(api.settings)
        try:
            with transaction(make_sessionmaker(engine)) as session:
                mallory = channels.Member(admin, b"mallory", role)
                channels.record(session, CHANNEL, epoch, [alice, mallory], members_invite, [])
        finally:
            engine.dispose()

    def invite() -> str:
        made = http.post(
            "/v1/invites", json={"channel": CHANNEL, "max_uses": 5}, headers=bearer(admin_key)
        )
        assert made.status_code == 201, made.text
        token: str = made.json()["token"]
        return token

    def redeem(token: str, name: str) -> httpx.Response:
        kp = _kp(api, joiner_key, tmp_path, name)
        body = {"channel": CHANNEL, "token": token, "key_package": kp}
        return http.post("/v1/invites/redeem", json=body, headers=bearer(joiner_key))

    def joiner_admitted() -> bool:
        engine = make_engine(api.settings)
        try:
            with transaction(make_sessionmaker(engine)) as session:
                return channels.has_access(session, CHANNEL, joiner)
        finally:
            engine.dispose()

    roster(1, "admin")
    token = invite()
    assert redeem(token, "j1").status_code == 201
    assert joiner_admitted()
    roster(2, "member")  # the owner demotes mallory
    refused = redeem(token, "j2")
    assert refused.status_code == 410, refused.text
    assert refused.headers["content-type"] == "application/problem+json"
    assert refused.json()["type"] == "urn:svc:problem:invite-expired"
    assert not joiner_admitted(), "a redemption of an ended invite still admits its account"
    roster(3, "admin")  # promoted again: the ended invite stays ended
    assert redeem(token, "j3").status_code == 410
    # A plain member's invite, while the policy lets members invite, ends with the policy.
    roster(4, "member", members_invite=True)
    token = invite()
    assert redeem(token, "j4").status_code == 201
    roster(5, "member", members_invite=False)
    assert redeem(token, "j5").status_code == 410
    assert not joiner_admitted()


def test_the_relay_refuses_a_key_package_only_when_no_invite_it_came_with_is_good(
    api: RunningApi, http: httpx.Client, tmp_path: Any
) -> None:
    """``dead_admissions``: which key packages a commit adds that came in join requests
    whose invites all ended. One key package redeemed with two invites stays addable
    while one of them is good."""
    owner = signup(http, "o7@example.com")
    _register(api, owner["account"]["id"])
    alice = channels.Member(uuid.UUID(owner["account"]["id"]), b"owner", "owner")
    admin_key = signup(http, "a7@example.com")["api_key"]["key"]
    admin = _account_of(http, admin_key)
    joiner_key = signup(http, "j7@example.com")["api_key"]["key"]
    joiner = _account_of(http, joiner_key)
    engine = make_engine(api.settings)
    sessions = make_sessionmaker(engine)

    def roster(epoch: int, role: str) -> None:
        with transaction(sessions) as session:
            mallory = channels.Member(admin, b"mallory", role)
            channels.record(session, CHANNEL, epoch, [alice, mallory], False, [])

    def invite(key: str) -> str:
        made = http.post("/v1/invites", json={"channel": CHANNEL}, headers=bearer(key))
        assert made.status_code == 201, made.text
        token: str = made.json()["token"]
        return token

    kp = _kp(api, joiner_key, tmp_path, "joiner")
    ref = inspect(base64.b64decode(kp)).key_package_ref
    assert ref is not None
    added = [(joiner, b"joiner", ref)]

    def dead() -> list[tuple[uuid.UUID, bytes]]:
        with transaction(sessions) as session:
            return invites.dead_admissions(session, CHANNEL, added, utcnow())

    try:
        roster(1, "admin")
        for key in (admin_key, owner["api_key"]["key"]):
            body = {"channel": CHANNEL, "token": invite(key), "key_package": kp}
            redeemed = http.post("/v1/invites/redeem", json=body, headers=bearer(joiner_key))
            assert redeemed.status_code == 201, redeemed.text
        assert dead() == []
        roster(2, "member")  # mallory's invite ends; the owner's is still good
        assert dead() == []
        with transaction(sessions) as session:  # the owner's ends too (expired)
            session.execute(update(Invite).values(expires_at=utcnow()))
        assert dead() == [(joiner, b"joiner")]
        # A key package no join request carries is the committer's business.
        with transaction(sessions) as session:
            other = [(joiner, b"joiner", b"\x00" * 32)]
            assert invites.dead_admissions(session, CHANNEL, other, utcnow()) == []
    finally:
        engine.dispose()
