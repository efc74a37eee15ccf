"""Exchanging an API key for a relay JWT (docs/api.md, Tokens)."""

from __future__ import annotations

import time

from fastapi import APIRouter

from ...services import tokens
from ..deps import CallerDep, ServicesDep
from ..problems import responses
from ..schemas import TokenResponse

router = APIRouter(prefix="/v1/tokens", tags=["tokens"])


@router.post(
    "",
    response_model=TokenResponse,
    responses=responses(401, 429),
    summary="Exchange the API key in Authorization for a short-lived JWT",
)
async def exchange(caller: CallerDep, services: ServicesDep) -> TokenResponse:
    # Async: signing takes ~50 µs, less than a hop to the threadpool.
    issued = tokens.issue(services.signer.get(), caller.account, services.settings, time.time())
    return TokenResponse(token=issued.token, expires_at=issued.expires_at)
