"""What routes get injected: the server's services and the authenticated caller."""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Depends, Request
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import Session, sessionmaker

from ..auth.key_packages import CredentialKeys
from ..config import Settings
from ..db.models import utcnow
from ..db.session import make_sessionmaker, open_database, transaction
from ..services import api_keys, signing
from ..services.ratelimit import RateLimits
from ..services.signing import CREDENTIAL, SignerCache
from .problems import ProblemError, rate_limited


class LastUsedThrottle:
    """Decides when a key's last_used_at is written: at most once per interval per key
    and process, so authentication does not cost a database write per request."""

    _MAX_TRACKED = 100_000

    def __init__(self, interval: float) -> None:
        self._interval = interval
        self._written: dict[uuid.UUID, float] = {}
        self._lock = threading.Lock()

    def due(self, key_id: uuid.UUID) -> bool:
        now = time.monotonic()
        with self._lock:
            last = self._written.get(key_id)
            if last is not None and now - last < self._interval:
                return False
            if len(self._written) >= self._MAX_TRACKED:
                self._written.clear()
            self._written[key_id] = now
            return True


@dataclass
class Services:
    settings: Settings
    engine: Engine
    sessions: sessionmaker[Session]
    signer: SignerCache
    rate_limits: RateLimits
    credential_signer: SignerCache
    last_used: LastUsedThrottle = field(init=False)
    credential_keys: CredentialKeys = field(init=False)

    def __post_init__(self) -> None:
        self.last_used = LastUsedThrottle(self.settings.last_used_write_interval_seconds)

        def published() -> dict[str, Any]:
            with transaction(self.sessions) as session:
                return signing.jwks(session, CREDENTIAL)

        self.credential_keys = CredentialKeys(published)

    def lookup_connection(self) -> Connection:
        """A connection for single-statement reads on the hot path. On PostgreSQL it is in
        autocommit, saving the BEGIN and ROLLBACK round trips; pysqlite already issues no
        BEGIN before a SELECT, and switching its mode costs more than it saves."""
        conn = self.engine.connect()
        if self.settings.is_sqlite:
            return conn
        return conn.execution_options(isolation_level="AUTOCOMMIT")

    @classmethod
    def start(cls, settings: Settings) -> Services:
        """Connects, migrates the schema, and makes sure a signing key exists."""
        engine = open_database(settings)
        sessions = make_sessionmaker(engine)
        signer = SignerCache(sessions)
        signer.get()
        credential_signer = SignerCache(sessions, purpose=CREDENTIAL)
        credential_signer.get()
        return cls(settings, engine, sessions, signer, RateLimits(settings), credential_signer)


async def get_services(request: Request) -> Services:
    # async: FastAPI would run a plain def dependency in the threadpool on every request.
    services: Services = request.app.state.services
    return services


ServicesDep = Annotated[Services, Depends(get_services)]


def client_address(request: Request) -> str:
    return request.client.host if request.client else "unknown"


@dataclass(frozen=True)
class Caller:
    account: api_keys.AccountRecord
    key_id: uuid.UUID


def _unauthorized(detail: str) -> ProblemError:
    return ProblemError(
        401,
        detail,
        slug="unauthorized",
        headers={"WWW-Authenticate": 'Bearer realm="svc", error="invalid_token"'},
    )


async def authenticate(request: Request, services: ServicesDep) -> Caller:
    """The account behind ``Authorization: Bearer <API key>``, checked on every request
    against the database, so a revoked key fails at once in every API process.

    Runs on the event loop: one indexed query on a local or pooled connection costs
    less than the hop to a worker thread it would otherwise take."""
    address = client_address(request)
    wait = services.rate_limits.auth_blocked(address)
    if wait is not None:
        raise rate_limited("too many failed authentication attempts from this address", wait)
    header = request.headers.get("authorization")
    if header is None:
        raise ProblemError(
            401,
            "missing Authorization header; send Authorization: Bearer <API key>",
            slug="unauthorized",
            headers={"WWW-Authenticate": 'Bearer realm="svc"'},
        )
    scheme, _, secret = header.partition(" ")
    secret = secret.strip()
    if scheme.lower() != "bearer" or not secret:
        services.rate_limits.record_auth_failure(address)
        raise _unauthorized("malformed Authorization header; expected Bearer <API key>")
    if not api_keys.is_well_formed(secret):
        services.rate_limits.record_auth_failure(address)
        raise _unauthorized("not a valid svc API key (sk_live_…); check for a typo")
    with services.lookup_connection() as conn:
        found = api_keys.find_active(conn, secret)
        if found is None:
            services.rate_limits.record_auth_failure(address)
            raise _unauthorized("API key is unknown or revoked")
        if services.last_used.due(found.id):
            api_keys.touch(conn, found.id, utcnow())
            conn.commit()
    return Caller(account=found.account, key_id=found.id)


CallerDep = Annotated[Caller, Depends(authenticate)]
