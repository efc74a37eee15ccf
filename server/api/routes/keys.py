"""API keys of the caller's account (docs/api.md, API keys)."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Response, status

from ...db.models import Account, utcnow
from ...db.session import transaction
from ...services import api_keys
from ..deps import CallerDep, ServicesDep
from ..problems import ProblemError, responses
from ..schemas import ApiKeyCreated, ApiKeyOut, KeyCreateRequest, KeyList

router = APIRouter(prefix="/v1/keys", tags=["keys"])


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=ApiKeyCreated,
    responses=responses(400, 401, 413, 422, 429),
    summary="Create an API key; the full key is in this response only",
)
def create_key(
    caller: CallerDep, services: ServicesDep, body: KeyCreateRequest | None = None
) -> ApiKeyCreated:
    name = body.name if body is not None else "default"
    with transaction(services.sessions) as session:
        account = session.get_one(Account, caller.account.id)
        record, secret = api_keys.create(session, account, name)
        return ApiKeyCreated(id=record.id, key_prefix=record.key_prefix, name=name, key=secret)


@router.get(
    "",
    response_model=KeyList,
    responses=responses(401, 429),
    summary="List the active keys, newest first",
)
def list_keys(caller: CallerDep, services: ServicesDep) -> KeyList:
    with transaction(services.sessions) as session:
        keys = api_keys.list_active(session, caller.account.id)
        return KeyList(keys=[ApiKeyOut.model_validate(k, from_attributes=True) for k in keys])


@router.delete(
    "/{key_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    response_class=Response,
    responses=responses(401, 404, 429),
    summary="Revoke a key (it stops working at once; the record is kept)",
)
def revoke_key(key_id: str, caller: CallerDep, services: ServicesDep) -> Response:
    not_found = ProblemError(404, "no active key with this id in your account", slug="not-found")
    try:
        parsed = uuid.UUID(key_id)
    except ValueError:
        raise not_found from None
    with transaction(services.sessions) as session:
        if not api_keys.revoke(session, caller.account.id, parsed, utcnow()):
            raise not_found
    return Response(status_code=status.HTTP_204_NO_CONTENT)
