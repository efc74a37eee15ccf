"""Request and response bodies of the account API."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Literal

from email_validator import EmailNotValidError, validate_email
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema

from svc_sdk.protocol import CHANNEL_PATTERN

Plan = Literal["free", "dev", "team", "enterprise"]


def _email(value: str) -> str:
    # Syntax and a routable domain, no DNS lookup; normalised (domain lowercased).
    try:
        return validate_email(value, check_deliverability=False).normalized
    except EmailNotValidError as exc:
        raise ValueError(str(exc)) from None


# The documented schema says what is enforced: special-use domains (RFC 6761) are refused.
EMAIL_PATTERN = r"^(?!.*\.(arpa|invalid|local|localhost|onion|test)\.?$)[^@\s]+@[^@\s]+$"

Email = Annotated[
    str,
    Field(min_length=3, max_length=254),
    AfterValidator(_email),
    WithJsonSchema(
        {"type": "string", "format": "email", "maxLength": 254, "pattern": EMAIL_PATTERN}
    ),
]


class SignupRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    email: Email = Field(description="Account email, unique")
    name: str | None = Field(None, max_length=200, description="Display name")


class AccountOut(BaseModel):
    id: uuid.UUID
    email: str
    name: str
    plan: Plan
    created_at: datetime


class ApiKeyCreated(BaseModel):
    id: uuid.UUID
    key_prefix: str = Field(description="sk_live_ plus the first characters of the key")
    name: str
    key: str = Field(description="The full key; shown only in this response")


class SignupResponse(BaseModel):
    account: AccountOut
    api_key: ApiKeyCreated


class KeyCreateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field("default", min_length=1, max_length=100, description="Key name")


class ApiKeyOut(BaseModel):
    id: uuid.UUID
    key_prefix: str
    name: str
    last_used_at: datetime | None = Field(description="null when the key was never used")
    created_at: datetime


class KeyList(BaseModel):
    keys: list[ApiKeyOut] = Field(description="Active keys, newest first")


class TokenResponse(BaseModel):
    token: str = Field(description="JWT for the relay (EdDSA, aud svc-relay)")
    expires_at: datetime


class Health(BaseModel):
    status: Literal["ok"]


class Jwk(BaseModel):
    model_config = ConfigDict(extra="allow")

    kty: str
    kid: str
    alg: str
    use: str
    crv: str
    x: str


class Jwks(BaseModel):
    keys: list[Jwk]


ChannelName = Annotated[
    str,
    Field(
        pattern=CHANNEL_PATTERN,
        max_length=194,
        description="org/namespace/service: three parts of 1-64 letters, digits, . _ -",
    ),
]


class InviteCreateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    channel: ChannelName
    max_uses: int = Field(1, ge=1, le=10_000, description="How many agents may redeem it")
    ttl: int = Field(3600, ge=1, le=30 * 24 * 3600, description="Lifetime in seconds")


class InviteCreated(BaseModel):
    id: uuid.UUID
    token: str = Field(description="svc_inv_…; shown only in this response")
    channel: str
    max_uses: int
    expires_at: datetime


class InviteRedeemRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    channel: ChannelName
    token: str = Field(min_length=1, max_length=200, description="svc_inv_…")
    key_package: str = Field(
        min_length=1, max_length=44_000, description="The joiner's MLS key package, base64"
    )


class JoinRequestOut(BaseModel):
    join_id: uuid.UUID = Field(description="Post it to the channel with a relay JoinRequest")
    channel: str
    identity: str = Field(description="The key package's identity, hex")


BASE64 = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"


class CredentialRequestBody(BaseModel):
    """An agent asking for a credential; every binary field is base64."""

    model_config = ConfigDict(extra="forbid")

    account: uuid.UUID = Field(description="The account the agent signed for: the API key's")
    identity: str = Field(
        min_length=1, max_length=1368, pattern=BASE64, description="The agent identity"
    )
    cipher_suite: Literal[1, 2] = Field(description="MLS cipher suite of signature_key")
    signature_key: str = Field(
        min_length=1,
        max_length=200,
        pattern=BASE64,
        description="The agent's MLS signature public key",
    )
    issued_at: int = Field(ge=0, description="When the agent signed this, unix seconds")
    proof: str = Field(
        min_length=1,
        max_length=200,
        pattern=BASE64,
        description="The agent's MLS signature over the request (docs/security.md)",
    )


class CredentialOut(BaseModel):
    credential: str = Field(description="The agent credential, base64 (docs/security.md)")
    issuer: str = Field(description="kid of the key that signed it")
    not_before: datetime
    not_after: datetime


ChannelRole = Literal["owner", "admin", "member"]


class AgentOut(BaseModel):
    """A channel member as its agent credential names it: account and identity."""

    agent: str = Field(description="The identity as text: UTF-8, any other byte as a \\xNN escape")
    identity: str = Field(description="The identity bytes, hex (exact)")
    account_id: uuid.UUID


class ChannelMemberOut(AgentOut):
    role: ChannelRole
    since_epoch: int = Field(description="The epoch of the commit that added this agent")


class ChannelOut(BaseModel):
    name: str
    epoch: int = Field(description="The MLS epoch of the channel's newest accepted commit")
    member_count: int = Field(description="Member agents of every account")
    access: Literal["member", "invited"] = Field(
        description="member: one of your agents is a member; invited: you hold a live "
        "invite redemption and none of your agents is a member yet"
    )
    role: ChannelRole | None = Field(
        description="The highest role of your agents in the channel; null when invited"
    )
    agents: list[ChannelMemberOut] = Field(description="Your agents that are members")


class ChannelList(BaseModel):
    channels: list[ChannelOut] = Field(description="The channels your account may use, by name")


class ChannelMembers(BaseModel):
    channel: str
    epoch: int
    members: list[ChannelMemberOut] = Field(
        description="The roster after the newest accepted commit, oldest members first"
    )


ChannelEventKind = Literal["created", "added", "removed", "left", "role", "policy"]


class ChannelEventOut(BaseModel):
    id: int = Field(description="Increasing; pass the last one seen as `after`")
    epoch: int = Field(description="The epoch the commit moved the channel to")
    kind: ChannelEventKind
    actor: AgentOut = Field(description="The member whose commit made the change")
    subject: AgentOut | None = Field(
        description="The member added, removed, leaving or given a role; null for policy"
    )
    detail: str = Field(
        description="created: owner; role: the new role; policy: members-invite or "
        "admins-invite; otherwise empty"
    )
    at: datetime = Field(description="When the relay recorded it")


class ChannelEvents(BaseModel):
    channel: str
    events: list[ChannelEventOut] = Field(description="Oldest first")
    next_after: int | None = Field(
        description="The `after` of the next page when this one is full, else null"
    )
