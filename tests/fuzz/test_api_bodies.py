"""Fuzz target: the account API's request bodies, paths and query strings, over real
HTTP to a real ``svc up`` (SQLite; the relay beside it records the channel the invite
endpoints need). Mutations of genuine requests — a signup, a key, a credential request
signed by a real engine, an invite for a real channel, a redemption with a real key
package — plus well-formed JSON with arbitrary values in every field.

No 5xx; every 4xx is ``application/problem+json`` whose ``status`` is the response's;
afterwards the account, its key and its channel work as before."""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from svc_sdk.mls import verify_credential_request
from svc_sdk.testing import LocalStack

from ..client.helpers import client
from ..relay.helpers import engine
from .mutate import counted, mutations, settings_for

pytestmark = pytest.mark.fuzz

CHANNEL = "acme/fuzz/api"


@dataclass
class Request:
    method: str
    path: str
    body: dict[str, Any] | None = None


@dataclass
class Target:
    stack: LocalStack
    http: httpx.Client
    key: str
    requests: list[Request]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    root: Path = tmp_path_factory.mktemp("fuzz-api")
    limits: dict[str, Any] = {
        "signup_rate_limit": "1000000/minute",
        "auth_failure_rate_limit": "1000000/minute",
    }
    with LocalStack(**limits) as stack, httpx.Client(base_url=stack.api_url, timeout=30) as http:
        headers = {"Authorization": f"Bearer {stack.api_key}"}
        owner = client(stack, "fuzz-api-owner")
        with owner:
            owner.create_channel(CHANNEL)
            token = owner.invite(CHANNEL, max_uses=1000)
        agent = engine(root, "fuzz-api-agent", (stack.api_url, stack.api_key))
        content, proof = agent.credential_request(
            uuid.UUID(stack.account_id).bytes, int(time.time())
        )
        request = verify_credential_request(content, proof)
        spare = http.post("/v1/keys", json={"name": "spare"}, headers=headers).json()
        requests = [
            Request("POST", "/v1/accounts", {"email": "fuzz@example.com", "name": "Fuzz"}),
            Request("POST", "/v1/keys", {"name": "k"}),
            Request("POST", "/v1/tokens"),
            Request("GET", "/v1/accounts/me"),
            Request("GET", "/v1/keys"),
            Request("DELETE", f"/v1/keys/{spare['id']}"),
            Request("POST", "/v1/invites", {"channel": CHANNEL, "max_uses": 3, "ttl": 3600}),
            Request(
                "POST",
                "/v1/invites/redeem",
                {
                    "channel": CHANNEL,
                    "token": token,
                    "key_package": b64(agent.generate_key_package()),
                },
            ),
            Request(
                "POST",
                "/v1/agent-credentials",
                {
                    "account": stack.account_id,
                    "identity": b64(request.identity),
                    "cipher_suite": request.cipher_suite,
                    "signature_key": b64(request.signature_key),
                    "issued_at": request.issued_at,
                    "proof": b64(proof),
                },
            ),
            Request("GET", "/v1/channels"),
            Request("GET", f"/v1/channels/{CHANNEL}/members"),
            Request("GET", f"/v1/channels/{CHANNEL}/events?after=0&limit=100"),
        ]
        yield Target(stack, http, stack.api_key, requests)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=6,
)


HOW = ["body-bytes", "body-fields", "body-bytes", "body-fields", "path", "auth", "content-type"]
Case = tuple[str, str, dict[str, str], bytes, str]
# Requests per example, sent at once over a small pool: the API process and this one
# then use both cores (10,000 one by one took ~70 s).
PARALLEL = 4


@st.composite
def cases(draw: st.DrawFn, requests: list[Request], key: str) -> Case:
    request = draw(st.sampled_from(requests))
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    path = request.path
    body = json.dumps(request.body).encode() if request.body is not None else b""
    # Mostly bodies (Hypothesis favours small integers: the first entries).
    how = HOW[draw(st.integers(0, len(HOW) - 1))]
    if how == "body-bytes" and body:
        body = draw(mutations([body]))
    elif how == "body-fields" and request.body is not None:
        fields = dict(request.body)
        for name in draw(st.lists(st.sampled_from([*fields, "extra"]), min_size=1, max_size=3)):
            if draw(st.booleans()):
                fields[name] = draw(JSON)
            else:
                fields.pop(name, None)
        body = json.dumps(fields).encode()
    elif how == "path":
        path = draw(mutations([path.encode()], max_ops=2)).decode("latin-1")
        # What a client can put in a request line: no spaces, no control characters.
        path = "/" + "".join(c if 0x20 < ord(c) < 0x7F else f"%{ord(c):02X}" for c in path).lstrip(
            "/"
        )
    elif how == "auth":
        headers["Authorization"] = draw(mutations([f"Bearer {key}".encode()])).decode("latin-1")
        if not all(0x20 <= ord(c) < 0x7F for c in headers["Authorization"]):
            headers["Authorization"] = headers["Authorization"].encode("latin-1").hex()
        # What HTTP can carry: no whitespace around a header value.
        headers["Authorization"] = headers["Authorization"].strip()
    elif how == "content-type":
        headers["Content-Type"] = draw(
            st.sampled_from(
                ["text/plain", "", "application/json; charset=latin-1", "multipart/form-data"]
            )
        )
    return request.method, path, headers, body, how


def test_api_bodies(target: Target) -> None:
    statuses: dict[str, int] = {}
    with counted("API bodies") as case:

        def one(case_: Case) -> None:
            method, path, headers, body, how = case_
            response = target.http.request(method, path, headers=headers, content=body)
            case()
            seen = f"{how} {response.status_code}"
            statuses[seen] = statuses.get(seen, 0) + 1
            assert response.status_code < 500, (method, path, body[:200], response.text)
            if response.status_code >= 400:
                assert response.headers["content-type"] == "application/problem+json", response
                problem = response.json()
                assert problem["status"] == response.status_code, problem
                assert {"type", "title", "detail"} <= problem.keys(), problem

        with ThreadPoolExecutor(PARALLEL) as pool:

            @settings_for(PARALLEL)
            @given(
                batch=st.lists(
                    cases(target.requests, target.key), min_size=PARALLEL, max_size=PARALLEL
                )
            )
            def run(batch: list[Case]) -> None:
                for done in [pool.submit(one, c) for c in batch]:
                    done.result()

            run()
    print("statuses:", dict(sorted(statuses.items())))
    # Nothing broke: the key, the account, its channel and signup all still work.
    headers = {"Authorization": f"Bearer {target.key}"}
    assert target.http.get("/healthz").status_code == 200
    assert target.http.get("/v1/accounts/me", headers=headers).status_code == 200
    assert target.http.post("/v1/tokens", headers=headers).status_code == 200
    members = target.http.get(f"/v1/channels/{CHANNEL}/members", headers=headers)
    assert members.status_code == 200 and len(members.json()["members"]) == 1
    assert target.http.post("/v1/accounts", json={"email": "after@example.com"}).status_code == 201
