"""Signup and the caller's account."""

from __future__ import annotations

from fastapi import APIRouter, Request, status
from sqlalchemy.exc import IntegrityError

from ...db.session import transaction
from ...services import accounts
from ..deps import CallerDep, ServicesDep, client_address
from ..problems import ProblemError, rate_limited, responses
from ..schemas import AccountOut, ApiKeyCreated, SignupRequest, SignupResponse

router = APIRouter(prefix="/v1/accounts", tags=["accounts"])


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=SignupResponse,
    responses=responses(400, 409, 413, 422, 429),
    summary="Sign up: create an account and its first API key",
)
def signup(body: SignupRequest, request: Request, services: ServicesDep) -> SignupResponse:
    wait = services.rate_limits.take_signup(client_address(request))
    if wait is not None:
        raise rate_limited("too many signups from this address", wait)
    duplicate = ProblemError(409, "an account with this email already exists", slug="email-taken")
    try:
        with transaction(services.sessions) as session:
            account, key, secret = accounts.signup(session, str(body.email), body.name or "")
            result = SignupResponse(
                account=AccountOut.model_validate(account, from_attributes=True),
                api_key=ApiKeyCreated(
                    id=key.id, key_prefix=key.key_prefix, name=key.name, key=secret
                ),
            )
    except accounts.EmailTaken:
        raise duplicate from None
    except IntegrityError:  # a concurrent signup with the same email won the race
        raise duplicate from None
    return result


@router.get(
    "/me",
    response_model=AccountOut,
    responses=responses(401, 429),
    summary="The authenticated account",
)
def me(caller: CallerDep) -> AccountOut:
    return AccountOut.model_validate(caller.account, from_attributes=True)
