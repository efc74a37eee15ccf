"""Health and the public keys that verify tokens."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response
from sqlalchemy import text

from ...db.session import transaction
from ...services import signing
from ..deps import ServicesDep
from ..problems import responses
from ..schemas import Health, Jwks

router = APIRouter(tags=["meta"])


@router.get("/healthz", response_model=Health, responses=responses(503))
def healthz(services: ServicesDep) -> dict[str, str]:
    with transaction(services.sessions) as session:
        session.execute(text("SELECT 1"))
    return {"status": "ok"}


@router.get("/.well-known/jwks.json", response_model=Jwks, summary="Token verification keys")
def jwks(services: ServicesDep, response: Response) -> dict[str, Any]:
    # Short cache: verifiers re-fetch anyway when they meet an unknown kid.
    response.headers["Cache-Control"] = "public, max-age=60"
    with transaction(services.sessions) as session:
        return signing.jwks(session)


@router.get(
    "/.well-known/svc-credential-keys.json",
    response_model=Jwks,
    summary="Keys that verify agent credentials",
)
def credential_keys(services: ServicesDep, response: Response) -> dict[str, Any]:
    # Members and the relay verify agent credentials offline with these; retired keys stay
    # listed (docs/security.md, "Agent credentials").
    response.headers["Cache-Control"] = "public, max-age=60"
    with transaction(services.sessions) as session:
        return signing.jwks(session, signing.CREDENTIAL)
