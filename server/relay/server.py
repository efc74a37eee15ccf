"""Running the relay: its store and verifiers, and the native gRPC server (transport.py)
with health checking, keepalive and limits."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from svc_sdk.protocol import RelayServer

from ..auth import Claims, TokenVerifier
from ..auth.key_packages import CredentialKeys
from ..config import Settings
from ..db.session import make_sessionmaker, open_database, transaction
from ..errors import StartupError
from ..services import signing
from .access import Access
from .metrics import RelayMetrics
from .service import Relay
from .store import LogStore
from .transport import Transport

# Keepalive per gRPC guidance (A8/A9): ping idle connections every 30 s; a client's own
# pings (every 10 s at most, as gRPC's clients send them) are answered, never refused.
KEEPALIVE_SECONDS = 30.0
KEEPALIVE_TIMEOUT_SECONDS = 10.0
# gRPC's own limit on a request's header block (metadata), as grpcio enforced it.
MAX_HEADER_BYTES = 16 * 1024
MAX_SEND_BYTES = 16 * 1024 * 1024


def relay_server(settings: Settings, host: str, port: int) -> RelayServer:
    """The native server, listening. Raises OSError when it cannot listen there and
    ValueError for a certificate or key it cannot use."""
    tls = settings.tls
    return RelayServer(
        host,
        port,
        max_frame=settings.max_message_bytes + 64 * 1024,
        max_send=MAX_SEND_BYTES,
        keepalive=KEEPALIVE_SECONDS,
        keepalive_timeout=KEEPALIVE_TIMEOUT_SECONDS,
        max_header_bytes=MAX_HEADER_BYTES,
        cert_pem=None if tls is None else tls[0],
        key_pem=None if tls is None else tls[1],
    )


def make_store(settings: Settings) -> LogStore:
    if settings.redis_url:
        from .redis_store import RedisLogStore

        return RedisLogStore(settings.redis_url, settings.retention_seconds)
    from .sqlite_store import SqliteLogStore

    return SqliteLogStore(Path(settings.data_dir) / "relay.sqlite3", settings.relay_sync)


def make_verifier(settings: Settings, sessions: sessionmaker[Session]) -> TokenVerifier:
    if settings.api_url:
        return TokenVerifier.from_url(
            settings.api_url.rstrip("/") + "/.well-known/jwks.json",
            issuer=settings.issuer,
            audience=settings.audience,
        )

    def from_database() -> dict[str, Any]:
        with transaction(sessions) as session:
            return signing.jwks(session)

    return TokenVerifier(from_database, issuer=settings.issuer, audience=settings.audience)


def make_credential_keys(settings: Settings, sessions: sessionmaker[Session]) -> CredentialKeys:
    if settings.api_url:
        return CredentialKeys.from_url(
            settings.api_url.rstrip("/") + "/.well-known/svc-credential-keys.json"
        )

    def from_database() -> dict[str, Any]:
        with transaction(sessions) as session:
            return signing.jwks(session, signing.CREDENTIAL)

    return CredentialKeys(from_database)


@dataclass
class RunningRelay:
    relay: Relay
    transport: Transport
    port: int

    async def stop(self, grace: float = 1.0) -> None:
        await self.transport.stop(grace)
        await self.relay.close()


async def start_relay(
    settings: Settings,
    host: str = "127.0.0.1",
    port: int = 50051,
    sessions: sessionmaker[Session] | None = None,
    metrics: RelayMetrics | None = None,
) -> RunningRelay:
    """Starts a relay on ``host:port`` (0 picks a free port) and returns once it serves."""
    try:
        server = relay_server(settings, host, port)
    except OSError as exc:
        raise StartupError(f"relay cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise StartupError(f"relay TLS: {exc}") from None
    try:
        if sessions is None:
            engine = await asyncio.to_thread(open_database, settings)
            sessions = make_sessionmaker(engine)
        verifier = make_verifier(settings, sessions)

        async def verify(token: str) -> Claims:
            return await asyncio.to_thread(verifier.verify, token)

        keys = make_credential_keys(settings, sessions)
        relay = Relay(settings, make_store(settings), Access(sessions), verify, keys, metrics)
        try:
            await relay.start()
        except BaseException as exc:  # a stop (cancelled) mid-start closes what it opened too
            await relay.close()
            if not isinstance(exc, Exception):
                raise
            where = f"Redis at {settings.redis_url}" if settings.redis_url else "the relay log"
            raise StartupError(f"cannot use {where}: {exc}") from None
    except BaseException:
        server.stop(hard=True)
        raise
    transport = Transport(relay, server)
    transport.start()
    return RunningRelay(relay, transport, transport.port)
