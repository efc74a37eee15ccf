"""POST /v1/agent-credentials and the keys that verify credentials: proof of
possession, the account binding, every refusal, rotation. Real HTTP, SQLite and
PostgreSQL."""

from __future__ import annotations

import base64
import json
import struct
import time
import uuid
from datetime import datetime
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from svc_sdk.agent_credential import (
    CREDENTIAL_LABEL,
    REQUEST_LABEL,
    CredentialContent,
    CredentialRequest,
    opaque,
)
from svc_sdk.mls import verify_agent_credential
from svc_server.db.session import make_engine, make_sessionmaker, transaction
from svc_server.services import signing

from ..support import RunningApi
from .conftest import bearer, signup
from .test_accounts import assert_problem

KEYS = "/.well-known/svc-credential-keys.json"


class Agent:
    """What an agent sends: its MLS signature key (suite 1 Ed25519, suite 2 P-256)."""

    def __init__(self, suite: int = 1) -> None:
        self.suite = suite
        if suite == 1:
            self.ed = Ed25519PrivateKey.generate()
            self.public = self.ed.public_key().public_bytes(
                serialization.Encoding.Raw, serialization.PublicFormat.Raw
            )
        else:
            self.ec = ec.generate_private_key(ec.SECP256R1())
            self.public = self.ec.public_key().public_bytes(
                serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
            )

    def sign(self, data: bytes) -> bytes:
        if self.suite == 1:
            return self.ed.sign(data)
        return self.ec.sign(data, ec.ECDSA(hashes.SHA256()))

    def body(self, account: str, identity: bytes = b"alice", **override: Any) -> dict[str, Any]:
        issued_at = override.pop("issued_at", int(time.time()))
        request = CredentialRequest(
            account=uuid.UUID(account).bytes,
            identity=identity,
            cipher_suite=self.suite,
            signature_key=self.public,
            issued_at=issued_at,
        )
        body = {
            "account": account,
            "identity": base64.b64encode(identity).decode(),
            "cipher_suite": self.suite,
            "signature_key": base64.b64encode(self.public).decode(),
            "issued_at": issued_at,
            "proof": base64.b64encode(self.sign(REQUEST_LABEL + request.encode())).decode(),
        }
        body.update(override)
        return body


def _anchors(http: httpx.Client) -> dict[str, Ed25519PublicKey]:
    keys = http.get(KEYS).json()["keys"]
    return {
        k["kid"]: Ed25519PublicKey.from_public_bytes(
            base64.urlsafe_b64decode(k["x"] + "=" * (-len(k["x"]) % 4))
        )
        for k in keys
    }


def _decode(credential: bytes) -> tuple[CredentialContent, bytes]:
    """A strict reader of the documented format, independent of the encoder."""
    at = 0

    def vector() -> bytes:
        nonlocal at
        first = credential[at]
        size = {0: 1, 1: 2, 2: 4}[first >> 6]
        n = int.from_bytes(credential[at : at + size], "big") & ((1 << (8 * size - 2)) - 1)
        at += size
        value = credential[at : at + n]
        assert len(value) == n
        at += n
        return value

    def number(size: int) -> int:
        nonlocal at
        value = int.from_bytes(credential[at : at + size], "big")
        at += size
        return value

    issuer, account, identity = vector().decode(), vector(), vector()
    suite = number(2)
    key = vector()
    not_before, not_after = number(8), number(8)
    content = CredentialContent(issuer, account, identity, suite, key, not_before, not_after)
    signature = vector()
    assert at == len(credential), "no trailing bytes"
    return content, signature


@pytest.mark.parametrize("suite", [1, 2])
def test_issue_binds_key_account_and_identity(http: httpx.Client, suite: int) -> None:
    account = signup(http)
    key, account_id = account["api_key"]["key"], account["account"]["id"]
    agent = Agent(suite)
    before = int(time.time())
    response = http.post(
        "/v1/agent-credentials", json=agent.body(account_id, b"alice"), headers=bearer(key)
    )
    assert response.status_code == 201, response.text
    out = response.json()
    credential = base64.b64decode(out["credential"])
    content, signature = _decode(credential)
    assert content.account == uuid.UUID(account_id).bytes
    assert (content.identity, content.cipher_suite) == (b"alice", suite)
    assert content.signature_key == agent.public
    assert content.issuer == out["issuer"] and content.issuer.startswith("c")
    assert before <= content.not_before <= time.time()
    assert content.not_after - content.not_before == 3 * 86_400
    assert datetime.fromisoformat(out["not_after"]).timestamp() == content.not_after
    # Offline verification with the published key, over the documented bytes.
    _anchors(http)[content.issuer].verify(signature, CREDENTIAL_LABEL + content.encode())
    assert credential == content.signed(signature)


def test_two_accounts_get_distinct_credentials_for_one_name(http: httpx.Client) -> None:
    first, second = signup(http, "a@example.com"), signup(http, "b@example.com")
    issued = []
    for account in (first, second):
        agent = Agent()
        response = http.post(
            "/v1/agent-credentials",
            json=agent.body(account["account"]["id"], b"alice"),
            headers=bearer(account["api_key"]["key"]),
        )
        assert response.status_code == 201, response.text
        issued.append(_decode(base64.b64decode(response.json()["credential"]))[0])
    assert issued[0].identity == issued[1].identity == b"alice"
    assert issued[0].account != issued[1].account


def test_refusals_change_nothing(http: httpx.Client) -> None:
    account, other = signup(http, "a@example.com"), signup(http, "b@example.com")
    key, account_id = account["api_key"]["key"], account["account"]["id"]
    agent, thief = Agent(), Agent()

    def post(body: Any, headers: dict[str, str] | None = None) -> httpx.Response:
        sent = bearer(key) if headers is None else headers
        return http.post("/v1/agent-credentials", json=body, headers=sent)

    # Proof of possession: missing, by another key, over other bytes, for another key.
    good = agent.body(account_id)
    cases: list[tuple[dict[str, Any], int, str]] = [
        ({**good, "proof": base64.b64encode(b"x" * 64).decode()}, 400, "proof of possession"),
        ({**good, "proof": thief.body(account_id)["proof"]}, 400, "proof of possession"),
        ({**good, "identity": base64.b64encode(b"mallory").decode()}, 400, "proof of poss"),
        ({**good, "signature_key": base64.b64encode(thief.public).decode()}, 400, "proof of"),
        # Another account's name on the request (the agent signed for it): refused.
        (agent.body(other["account"]["id"]), 403, "another account"),
        (agent.body(account_id, issued_at=int(time.time()) - 3600), 400, "issued_at"),
        (agent.body(account_id, issued_at=int(time.time()) + 3600), 400, "issued_at"),
        (agent.body(account_id, b""), 422, "identity"),
        (agent.body(account_id, b"x" * 1025), 400, "1 to 1024 bytes"),
        ({**good, "cipher_suite": 7}, 422, "cipher_suite: Input should be 1 or 2"),
        ({**good, "signature_key": base64.b64encode(b"short").decode()}, 400, "32 bytes"),
        ({**good, "proof": "%%%"}, 422, "proof: String should match pattern"),
        ({k: v for k, v in good.items() if k != "proof"}, 422, "proof"),
        ({**good, "extra": 1}, 422, "extra"),
    ]
    for body, status, words in cases:
        problem = assert_problem(post(body), status)
        assert words in problem["detail"], (body, problem)
    # No key, a garbage key, a revoked key.
    assert_problem(post(good, {}), 401)
    assert_problem(post(good, bearer("sk_live_" + "x" * 40)), 401)
    spare = http.post("/v1/keys", json={"name": "spare"}, headers=bearer(key)).json()
    assert http.delete(f"/v1/keys/{spare['id']}", headers=bearer(key)).status_code == 204
    assert_problem(post(agent.body(account_id), bearer(spare["key"])), 401)
    # And the good request still works: nothing above changed anything.
    assert post(agent.body(account_id)).status_code == 201


def test_credential_keys_rotate_and_old_keys_stay_published(
    api: RunningApi, http: httpx.Client
) -> None:
    account = signup(http)
    key, account_id = account["api_key"]["key"], account["account"]["id"]
    first = http.post("/v1/agent-credentials", json=Agent().body(account_id), headers=bearer(key))
    old_kid = first.json()["issuer"]
    token_kids = {k["kid"] for k in http.get("/.well-known/jwks.json").json()["keys"]}
    assert old_kid not in token_kids, "credential keys are not token keys"
    listed = http.get(KEYS).json()["keys"]
    assert [k["kid"] for k in listed] == [old_kid]
    assert listed[0]["use"] == "svc-agent-credential" and listed[0]["crv"] == "Ed25519"

    engine = make_engine(api.settings)
    with transaction(make_sessionmaker(engine)) as session:
        new_kid = signing.rotate(session, 900, signing.CREDENTIAL).kid
    engine.dispose()
    assert {k["kid"] for k in http.get(KEYS).json()["keys"]} == {old_kid, new_kid}
    assert {k["kid"] for k in http.get("/.well-known/jwks.json").json()["keys"]} == token_kids


def test_vector_matches_the_documented_encoding() -> None:
    """The bytes the engine decodes (native/tests/credential.rs has the same vector)."""
    content = CredentialContent(
        issuer="k1",
        account=bytes(range(16)),
        identity=b"alice",
        cipher_suite=1,
        signature_key=bytes(32),
        not_before=1,
        not_after=2,
    )
    expected = (
        b"\x02k1"
        + b"\x10" + bytes(range(16))
        + b"\x05alice"
        + b"\x00\x01"
        + b"\x20" + bytes(32)
        + struct.pack(">QQ", 1, 2)
    )  # fmt: skip
    assert content.encode() == expected
    assert opaque(b"x" * 64)[:2] == b"\x40\x40" and opaque(b"x" * 16384)[:4] == b"\x80\x00\x40\x00"
    assert json.dumps(content.signed(b"s")[-2:].hex()) == '"0173"'


def test_rfc8032_vector_signed_by_the_issuer_matches_the_engine() -> None:
    """native/tests/credential.rs pins the same content and signature: the issuer's
    bytes and the engine's decoder agree, signature included (Ed25519 is
    deterministic)."""
    seed = bytes.fromhex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
    issuer = Ed25519PrivateKey.from_private_bytes(seed)
    content = CredentialContent(
        issuer="key-1",
        account=uuid.UUID("00112233-4455-6677-8899-aabbccddeeff").bytes,
        identity=b"agent-a",
        cipher_suite=1,
        signature_key=bytes.fromhex(
            "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c"
        ),
        not_before=1_700_000_000,
        not_after=1_700_086_400,
    )
    assert content.encode().hex() == (
        "056b65792d311000112233445566778899aabbccddeeff076167656e742d610001203d4017c3e8"
        "43895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c000000006553f1000000000065554280"
    )
    signature = issuer.sign(CREDENTIAL_LABEL + content.encode())
    assert signature.hex() == (
        "47f7554047cc64169fb7fa7848d083e2e98d4827238a580d7d112ee4b9fe1d7c"
        "b2ab9a16a6425b9e42bd33e1161d1766c4e9bca2d53acee1139c35636f4d9103"
    )
    public = issuer.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    info = verify_agent_credential(content.signed(signature), {"key-1": public})
    assert (info.identity, info.not_after) == (b"agent-a", 1_700_086_400)
