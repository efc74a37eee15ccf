"""An agent gets its credential from the account API with the real engine's proof of
possession, and verifies it offline with the published keys (suites 1 and 2)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from svc_sdk import AuthError
from svc_sdk.api_client import ApiClient
from svc_sdk.mls import Engine, MlsError, verify_agent_credential, verify_credential_request
from svc_sdk.testing import LocalStack

PREFIX = "^MLS engine error: "


@pytest.mark.parametrize("suite", [1, 2])
def test_engine_gets_and_verifies_its_credential(
    stack: LocalStack, tmp_path: Path, ids: Callable[[str], str], suite: int
) -> None:
    identity = ids("alice").encode()
    engine = Engine(tmp_path / "alice", identity, cipher_suite=suite)
    api = ApiClient(stack.api_url, stack.api_key)
    try:
        credential = api.agent_credential(engine)
        anchors = api.credential_keys()
    finally:
        api.close()
    content, proof = engine.credential_request(b"\0" * 16, int(time.time()))
    key = verify_credential_request(content, proof).signature_key

    now = int(time.time())
    info = verify_agent_credential(credential, anchors, key, now)
    assert info.account == uuid.UUID(stack.account_id).bytes
    assert (info.identity, info.cipher_suite, info.signature_key) == (identity, suite, key)
    assert info.issuer in anchors and info.not_before <= now < info.not_after

    # Offline checks a member makes: someone else's key, a later time, other anchors.
    other = Engine(tmp_path / "mallory", identity, cipher_suite=suite)
    theirs = verify_credential_request(*other.credential_request(b"\0" * 16, now)).signature_key
    with pytest.raises(MlsError, match=PREFIX + ".*key"):
        verify_agent_credential(credential, anchors, theirs, now)
    with pytest.raises(MlsError, match=PREFIX + ".*expired"):
        verify_agent_credential(credential, anchors, key, info.not_after + 3600)
    verify_agent_credential(credential, anchors, key, None)  # None: no expiry check
    with pytest.raises(MlsError, match=PREFIX + f'.*unknown key "{info.issuer}"'):
        verify_agent_credential(credential, {"someone-else": bytes(32)}, key, now)
    with pytest.raises(MlsError, match=PREFIX + "malformed agent credential"):
        verify_agent_credential(credential[:-1], anchors, key, now)


def test_credential_for_a_revoked_key_is_refused(
    stack: LocalStack, tmp_path: Path, ids: Callable[[str], str]
) -> None:
    account = stack.signup()
    api = ApiClient(stack.api_url, account["api_key"]["key"])
    engine = Engine(tmp_path / "a", ids("a").encode())
    try:
        api.account_id()  # a token, before the key goes
        key = account["api_key"]["key"]
        spare = httpx.post(
            f"{stack.api_url}/v1/keys", headers={"Authorization": f"Bearer {key}"}
        ).json()
        httpx.delete(
            f"{stack.api_url}/v1/keys/{account['api_key']['id']}",
            headers={"Authorization": f"Bearer {spare['key']}"},
        ).raise_for_status()
        with pytest.raises(AuthError, match="API key rejected"):
            api.agent_credential(engine)
    finally:
        api.close()
