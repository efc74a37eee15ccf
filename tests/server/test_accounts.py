"""POST /v1/accounts and GET /v1/accounts/me, through real HTTP."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from ..support import run_api
from .conftest import bearer, signup

ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")


def assert_problem(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body: dict[str, Any] = response.json()
    assert body["status"] == status
    assert body["title"] and body["type"]
    assert "Traceback" not in response.text
    return body


def test_signup_creates_account_and_first_key(http: httpx.Client) -> None:
    body = signup(http, "Ada@Example.com", name="Ada")
    account, key = body["account"], body["api_key"]
    uuid.UUID(account["id"])
    assert (account["email"], account["name"], account["plan"]) == (
        "ada@example.com",
        "Ada",
        "free",
    )
    assert ISO_UTC.match(account["created_at"])
    created = datetime.fromisoformat(account["created_at"])
    assert abs((datetime.now(UTC) - created).total_seconds()) < 60
    assert key["name"] == "default"
    assert key["key"].startswith("sk_live_") and key["key"].startswith(key["key_prefix"])
    assert len(key["key_prefix"]) < len(key["key"]) // 2
    me = http.get("/v1/accounts/me", headers=bearer(key["key"]))
    assert me.status_code == 200 and me.json() == account


def test_duplicate_email_is_409(http: httpx.Client) -> None:
    signup(http, "bob@example.com")
    response = http.post("/v1/accounts", json={"email": "BOB@example.com"})
    assert assert_problem(response, 409)["detail"] == "an account with this email already exists"


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"email": "not-an-email"}, 422),
        ({"email": 5}, 422),
        ({}, 422),
        ({"email": "a@example.com", "name": ["x"]}, 422),
        ({"email": "a@example.com", "plan": "enterprise"}, 422),  # cannot pick a plan
        ({"email": "a" * 250 + "@example.com"}, 422),
        ([1, 2], 422),
    ],
)
def test_invalid_signup_bodies(http: httpx.Client, body: Any, status: int) -> None:
    problem = assert_problem(http.post("/v1/accounts", json=body), status)
    assert problem["errors"], "validation problems list the fields"
    assert all("input" not in e for e in problem["errors"]), "input is never echoed"


def test_malformed_json_is_400(http: httpx.Client) -> None:
    response = http.post(
        "/v1/accounts", content=b'{"email": ', headers={"content-type": "application/json"}
    )
    assert assert_problem(response, 400)["detail"] == "request body is not valid JSON"


def test_oversized_body_is_413(http: httpx.Client) -> None:
    big = {"email": "a@example.com", "name": "x" * (70 * 1024)}
    assert_problem(http.post("/v1/accounts", json=big), 413)

    def chunks() -> Any:  # no Content-Length: the limit applies while streaming
        for _ in range(80):
            yield b"x" * 1024

    response = http.post(
        "/v1/accounts", content=chunks(), headers={"content-type": "application/json"}
    )
    assert_problem(response, 413)


def test_unknown_route_and_method(http: httpx.Client) -> None:
    assert_problem(http.get("/v1/nothing"), 404)
    assert_problem(http.put("/v1/accounts"), 405)


def test_me_requires_a_key(http: httpx.Client) -> None:
    response = http.get("/v1/accounts/me")
    assert_problem(response, 401)
    assert response.headers["www-authenticate"].startswith("Bearer")


def test_signup_is_rate_limited_per_address(make_settings: Any) -> None:
    with (
        run_api(make_settings(signup_rate_limit="2/minute")) as api,
        httpx.Client(base_url=api.url) as http,
    ):
        signup(http, "one@example.com")
        signup(http, "two@example.com")
        response = http.post("/v1/accounts", json={"email": "three@example.com"})
        assert_problem(response, 429)
        assert int(response.headers["retry-after"]) >= 1
