"""Agent credentials (docs/api.md, Agent credentials): an agent proves it holds its MLS
signature key and gets that key bound to its account and identity."""

from __future__ import annotations

import base64
import binascii
import time
from datetime import UTC, datetime

from fastapi import APIRouter

from svc_sdk.protocol import CredentialRequest

from ...services import agent_credentials
from ..deps import CallerDep, ServicesDep
from ..problems import ProblemError, responses
from ..schemas import CredentialOut, CredentialRequestBody

router = APIRouter(prefix="/v1/agent-credentials", tags=["agent credentials"])


def _bytes(name: str, text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ProblemError(422, f"{name} is not base64", slug="bad-credential-request") from None


@router.post(
    "",
    response_model=CredentialOut,
    status_code=201,
    responses=responses(400, 401, 403, 422, 429),
    summary="Issue a credential binding the agent's MLS key to its account and identity",
)
async def issue(
    body: CredentialRequestBody, caller: CallerDep, services: ServicesDep
) -> CredentialOut:
    request = CredentialRequest(
        account=body.account.bytes,
        identity=_bytes("identity", body.identity),
        cipher_suite=body.cipher_suite,
        signature_key=_bytes("signature_key", body.signature_key),
        issued_at=body.issued_at,
    )
    now = int(time.time())
    try:
        agent_credentials.check_request(
            request, _bytes("proof", body.proof), caller.account.id, now
        )
    except PermissionError as exc:
        raise ProblemError(403, str(exc), slug="wrong-account") from None
    except agent_credentials.CredentialRequestError as exc:
        raise ProblemError(400, str(exc), slug="bad-credential-request") from None
    issued = agent_credentials.issue(
        services.credential_signer.get(),
        request,
        now,
        services.settings.agent_credential_ttl_seconds,
    )
    return CredentialOut(
        credential=base64.b64encode(issued.credential).decode(),
        issuer=issued.content.issuer,
        not_before=datetime.fromtimestamp(issued.content.not_before, UTC),
        not_after=datetime.fromtimestamp(issued.content.not_after, UTC),
    )
