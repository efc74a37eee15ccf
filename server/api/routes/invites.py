"""Channel invites, behind the manager's invite / join_with_token (docs/api.md): create
a token, redeem it with a key package."""

from __future__ import annotations

import base64
import binascii

from fastapi import APIRouter, status
from sqlalchemy.exc import IntegrityError

from ...auth.key_packages import KeyPackageError
from ...db.models import utcnow
from ...db.session import transaction
from ...services import invites
from ..deps import Caller, CallerDep, Services, ServicesDep
from ..problems import ProblemError, responses
from ..schemas import InviteCreated, InviteCreateRequest, InviteRedeemRequest, JoinRequestOut

router = APIRouter(prefix="/v1/invites", tags=["invites"])

_STATUS = {"not-found": 404, "not-admin": 403, "expired": 410, "used-up": 410}


def _problem(exc: invites.InviteError) -> ProblemError:
    return ProblemError(_STATUS[exc.kind], str(exc), slug=f"invite-{exc.kind}")


def _key_package(text: str, caller: Caller, services: Services) -> tuple[bytes, bytes]:
    """The key package and its agent identity, once its credential checks out and names
    the caller's account: an account redeems invites for its own agents only."""
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ProblemError(
            422, f"key_package is not base64: {exc}", slug="bad-key-package"
        ) from None
    try:
        owner = services.credential_keys.owner(data)
    except KeyPackageError as exc:
        raise ProblemError(422, f"key_package: {exc}", slug="bad-key-package") from None
    if owner.account != caller.account.id:
        raise ProblemError(
            403,
            "key_package belongs to an agent of another account; redeem with your own agent's",
            slug="wrong-account",
        )
    return data, owner.identity


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=InviteCreated,
    responses=responses(400, 401, 403, 404, 413, 422, 429),
    summary="Create an invite token for a channel your account uses",
)
def create_invite(
    body: InviteCreateRequest, caller: CallerDep, services: ServicesDep
) -> InviteCreated:
    try:
        with transaction(services.sessions) as session:
            new = invites.create(
                session, body.channel, caller.account.id, body.max_uses, body.ttl, utcnow()
            )
    except invites.InviteError as exc:
        raise _problem(exc) from None
    return InviteCreated(
        id=new.id,
        token=new.token,
        channel=body.channel,
        max_uses=body.max_uses,
        expires_at=new.expires_at,
    )


@router.post(
    "/redeem",
    status_code=status.HTTP_201_CREATED,
    response_model=JoinRequestOut,
    responses=responses(400, 401, 403, 404, 409, 410, 413, 422, 429),
    summary="Redeem an invite with your key package; post the join request on the relay",
)
def redeem_invite(
    body: InviteRedeemRequest, caller: CallerDep, services: ServicesDep
) -> JoinRequestOut:
    if not invites.is_well_formed(body.token):  # no database work for a garbled token
        raise _problem(invites.InviteError("not-found", "invite token is not valid"))
    key_package, identity = _key_package(body.key_package, caller, services)
    try:
        with transaction(services.sessions) as session:
            request = invites.redeem(
                session,
                body.token,
                body.channel,
                caller.account.id,
                identity,
                key_package,
                utcnow(),
            )
            join_id = request.id
    except invites.InviteError as exc:
        raise _problem(exc) from None
    except IntegrityError:  # the same agent redeeming twice at once
        raise ProblemError(
            409, "this agent is already redeeming this invite; retry", slug="conflict"
        ) from None
    return JoinRequestOut(join_id=join_id, channel=body.channel, identity=identity.hex())
