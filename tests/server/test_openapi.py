"""The served OpenAPI document, exercised by Schemathesis: no 5xx, and every response
matches the documented schema, status code and content type."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from svc_server.config import Settings

from ..support import RunningApi, run_api


@pytest.fixture(scope="module")
def live_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningApi]:
    config = Settings(
        data_dir=tmp_path_factory.mktemp("openapi"),
        signup_rate_limit="100000/minute",
        auth_failure_rate_limit="100000/minute",
    )
    with run_api(config) as api:
        yield api


def excluded(case: Any) -> list[Any]:
    # A credential request that matches the schema is still refused (400/403, documented)
    # unless the agent's key signed it moments ago: no schema can express a proof.
    if case.operation.path == "/v1/agent-credentials":
        return [positive_data_acceptance]
    return []


def test_api_conforms_to_its_schema(live_api: RunningApi) -> None:
    signup = httpx.post(f"{live_api.url}/v1/accounts", json={"email": "fuzz@example.com"})
    headers = {"Authorization": f"Bearer {signup.json()['api_key']['key']}"}
    schema = schemathesis.openapi.from_url(f"{live_api.url}/openapi.json")
    checked = []
    calls: list[str] = []
    # Driven through Schemathesis's public strategy API rather than its pytest plugin,
    # which reaches into pytest internals that pytest 9 removed.
    for result in schema.get_all_operations():
        operation = result.ok()  # type: ignore[union-attr]

        @given(case=operation.as_strategy())
        @settings(
            max_examples=40, deadline=None, database=None, suppress_health_check=list(HealthCheck)
        )
        def run(case: Any) -> None:
            case.call_and_validate(headers=headers, excluded_checks=excluded(case))
            calls.append(case.operation.label)

        run()
        checked.append(operation.label)
    assert len(checked) == 15, checked
    assert len(calls) > 15 * 10, "each operation gets many generated cases"


def test_openapi_document_lists_every_route(live_api: RunningApi) -> None:
    doc = httpx.get(f"{live_api.url}/openapi.json").json()
    assert set(doc["paths"]) == {
        "/v1/accounts",
        "/v1/accounts/me",
        "/v1/keys",
        "/v1/keys/{key_id}",
        "/v1/tokens",
        "/v1/agent-credentials",
        "/v1/invites",
        "/v1/invites/redeem",
        "/v1/channels",
        "/v1/channels/{name}/members",
        "/v1/channels/{name}/events",
        "/healthz",
        "/.well-known/jwks.json",
        "/.well-known/svc-credential-keys.json",
    }
    problem = doc["paths"]["/v1/keys/{key_id}"]["delete"]["responses"]["404"]["content"]
    assert "application/problem+json" in problem
