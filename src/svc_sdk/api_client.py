"""The client side of the account API: exchanging the API key for relay JWTs, agent
credentials, the invite endpoints, and the channels' rosters and audit trails. Errors
become the library's RuntimeError subclasses."""

from __future__ import annotations

import base64
import json
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from svc_sdk import credentials
from svc_sdk._native import Engine, HttpClient, verify_credential_request
from svc_sdk.audit import (
    ChannelEvent,
    ChannelMember,
    ChannelSummary,
    channels_from,
    events_from,
    members_from,
)
from svc_sdk.errors import (
    AccessError,
    AuthError,
    ChannelClosedError,
    InternalError,
    InviteError,
    InviteReason,
    TransportError,
)

# Refresh when this share of the token's lifetime has passed (exchange again
# before it expires, so a stream never sees an expired token).
REFRESH_AT = 0.75


@dataclass(frozen=True)
class _Answer:
    status_code: int
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class ApiClient:
    """Thread-safe; holds one HTTP connection pool (in the native extension, so an agent
    loads no Python HTTP stack) and the current JWT."""

    def __init__(self, api_url: str, api_key: str, timeout: float = 10.0) -> None:
        # Keys are printable ASCII; anything else (a pasted "…", a newline) cannot go into
        # an HTTP header and would fail later as an encoding error.
        if not isinstance(api_key, str) or not api_key.isascii() or not api_key.isprintable():
            raise AuthError("the API key contains characters no key has; check how it was pasted")
        self.api_url = api_url.rstrip("/")
        self._key = api_key
        ca = credentials.tls_ca_file() if self.api_url.startswith("https://") else None
        try:
            ca_pem = Path(ca).read_bytes() if ca else None
        except OSError as exc:
            raise TransportError(f"cannot read SVC_TLS_CA_FILE {ca}: {exc.strerror}") from None
        try:
            self._http = HttpClient(self.api_url, ca_pem, timeout)
        except ValueError as exc:
            raise TransportError(f"account API address {api_url!r} is not a URL: {exc}") from None
        except TransportError as exc:  # SVC_TLS_CA_FILE holds no certificate
            raise TransportError(f"account API {api_url}: {exc.detail}") from None
        self._lock = threading.Lock()
        self._token: str | None = None
        self._issued = 0.0
        self._expires = 0.0

    def close(self) -> None:
        self._http.close()

    def _post(self, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        return self._call("POST", path, body)

    def _get(self, path: str, params: dict[str, int] | None = None) -> dict[str, Any]:
        return self._call("GET", path, params=params)

    def _send(self, method: str, path: str, body: Any = None, authorized: bool = True) -> _Answer:
        headers = [("accept", "application/json")]
        if authorized:
            headers.append(("authorization", f"Bearer {self._key}"))
        payload = None
        if body is not None:
            headers.append(("content-type", "application/json"))
            payload = json.dumps(body).encode()
        try:
            status, data = self._http.request(method, path, headers, payload)
        except TransportError as exc:
            raise TransportError(f"account API {self.api_url} unreachable: {exc.detail}") from None
        except ChannelClosedError:
            raise ChannelClosedError("the client is closed") from None
        return _Answer(status, data)

    def _call(
        self, method: str, path: str, body: Any = None, params: dict[str, int] | None = None
    ) -> dict[str, Any]:
        if params:
            path = f"{path}?{urlencode(params)}"
        response = self._send(method, path, body)
        if response.status_code == 401:
            raise AuthError(f"API key rejected by {self.api_url}: {_detail(response)}")
        if response.status_code == 403:  # a valid key asking for another account's agent
            raise AccessError(f"refused by {self.api_url}: {_detail(response)}")
        if response.status_code >= 400:
            raise _error(response)
        try:
            data: dict[str, Any] = response.json()
        except ValueError:
            raise InternalError(f"account API answered {path} with non-JSON") from None
        return data

    # -- tokens ------------------------------------------------------------------------

    def token(self) -> str:
        """A JWT that is not close to expiry, exchanging the key when needed."""
        with self._lock:
            if self._token is None or time.time() >= self.refresh_due():
                self._exchange()
            assert self._token is not None
            return self._token

    def account_id(self) -> str:
        """The account the key belongs to: the current token's subject. Read without
        verifying the token, which only the relay needs to trust."""
        try:
            payload = self.token().split(".")[1]
            claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
            return str(claims["sub"])
        except (IndexError, ValueError, KeyError, TypeError):
            raise InternalError("the account API issued a token without a subject") from None

    def refresh(self) -> str:
        """Exchanges the key for a new JWT now."""
        with self._lock:
            self._exchange()
            assert self._token is not None
            return self._token

    def refresh_due(self) -> float:
        """When the current token should be replaced (epoch seconds)."""
        return self._issued + (self._expires - self._issued) * REFRESH_AT

    def _exchange(self) -> None:
        data = self._post("/v1/tokens")
        try:
            token = str(data["token"])
            expires = datetime.fromisoformat(str(data["expires_at"])).timestamp()
        except (KeyError, ValueError) as exc:
            raise InternalError(f"unexpected token response: {exc}") from None
        self._token, self._issued, self._expires = token, time.time(), expires

    # -- agent credentials -------------------------------------------------------------

    def agent_credential(self, engine: Engine) -> bytes:
        """A credential from the API binding ``engine``'s MLS signature key to this
        account and the engine's identity (docs/security.md, "Agent credentials"): the
        engine signs the request, proving it holds the key."""
        account = uuid.UUID(self.account_id())
        content, proof = engine.credential_request(account.bytes, int(time.time()))
        request = verify_credential_request(content, proof)
        data = self._post(
            "/v1/agent-credentials",
            {
                "account": str(account),
                "identity": base64.b64encode(request.identity).decode(),
                "cipher_suite": request.cipher_suite,
                "signature_key": base64.b64encode(request.signature_key).decode(),
                "issued_at": request.issued_at,
                "proof": base64.b64encode(proof).decode(),
            },
        )
        try:
            return base64.b64decode(str(data["credential"]), validate=True)
        except (KeyError, ValueError):
            raise InternalError("the account API answered without a credential") from None

    def credential_keys(self) -> dict[str, bytes]:
        """The keys that verify agent credentials, by kid: the API's published anchors."""
        response = self._send("GET", "/.well-known/svc-credential-keys.json", authorized=False)
        if response.status_code != 200:
            raise TransportError(
                f"account API {self.api_url} answered HTTP {response.status_code} for its"
                " credential keys"
            )
        try:
            keys = response.json()["keys"]
            return {
                str(k["kid"]): base64.urlsafe_b64decode(k["x"] + "=" * (-len(k["x"]) % 4))
                for k in keys
            }
        except (KeyError, TypeError, ValueError):
            raise InternalError("the account API's credential keys are malformed") from None

    # -- invites -----------------------------------------------------------------------

    def create_invite(self, channel: str, max_uses: int, ttl: int) -> str:
        data = self._post("/v1/invites", {"channel": channel, "max_uses": max_uses, "ttl": ttl})
        return str(data["token"])

    def redeem_invite(self, channel: str, token: str, key_package: bytes) -> str:
        """Returns the join request id to post on the relay."""
        data = self._post(
            "/v1/invites/redeem",
            {
                "channel": channel,
                "token": token,
                "key_package": base64.b64encode(key_package).decode(),
            },
        )
        return str(data["join_id"])

    # -- channels ----------------------------------------------------------------------

    def channels(self) -> list[ChannelSummary]:
        return channels_from(self._get("/v1/channels"))

    def channel_members(self, channel: str) -> list[ChannelMember]:
        return members_from(self._get(f"/v1/channels/{channel}/members"))

    def channel_events(self, channel: str, after: int, limit: int) -> list[ChannelEvent]:
        data = self._get(f"/v1/channels/{channel}/events", {"after": after, "limit": limit})
        return events_from(data)


def _detail(response: _Answer) -> str:
    try:
        body = response.json()
    except ValueError:
        return f"HTTP {response.status_code}"
    if isinstance(body, dict) and body.get("detail"):
        return str(body["detail"])
    return f"HTTP {response.status_code}"


# The account API's problem types for invites (server/api/routes/invites.py).
_INVITE_REASONS: dict[str, InviteReason] = {
    "urn:svc:problem:invite-not-found": "invalid",
    "urn:svc:problem:invite-expired": "expired",
    "urn:svc:problem:invite-used-up": "used-up",
}


def _problem_type(response: _Answer) -> str | None:
    try:
        body = response.json()
    except ValueError:
        return None
    kind = body.get("type") if isinstance(body, dict) else None
    return kind if isinstance(kind, str) else None


def _invite_reason(response: _Answer) -> InviteReason:
    kind = _problem_type(response)
    if kind is not None and kind in _INVITE_REASONS:
        return _INVITE_REASONS[kind]
    # 410 Gone: the invite existed; which way it ran out is unknown without the type.
    return "expired" if response.status_code == 410 else "invalid"


def _error(response: _Answer) -> Exception:
    detail = _detail(response)
    if _problem_type(response) == "urn:svc:problem:channel-not-found":
        # Unknown, or not admitted: the API does not say which (docs/api.md, Channels).
        return AccessError(detail)
    # The API's other 404 and 410 answers to this client are about invites.
    if response.status_code in (404, 410):
        return InviteError(detail, _invite_reason(response))
    if response.status_code >= 500:
        return TransportError(f"account API {response.status_code}: {detail}")
    return InternalError(f"account API {response.status_code}: {detail}")
