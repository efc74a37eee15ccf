"""Running the relay: the grpc.aio server with health checking, keepalive and limits."""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from sqlalchemy.orm import Session, sessionmaker

from ..auth import Claims, TokenVerifier
from ..auth.key_packages import CredentialKeys
from ..config import Settings
from ..db.session import make_sessionmaker, open_database, transaction
from ..errors import StartupError
from ..services import signing
from .access import Access
from .metrics import RelayMetrics
from .service import SERVICE, Relay
from .store import LogStore


def grpc_options(settings: Settings) -> list[tuple[str, Any]]:
    # Keepalive per gRPC guidance (A8/A9): ping idle connections every 30 s, allow clients
    # to ping every 10 s, and accept pings on streams with no data in flight.
    frame_limit = settings.max_message_bytes + 64 * 1024
    return [
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
        ("grpc.http2.max_ping_strikes", 2),
        ("grpc.max_receive_message_length", frame_limit),
        ("grpc.max_send_message_length", 16 * 1024 * 1024),
        ("grpc.so_reuseport", 0),
    ]


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


def _check_port(host: str, port: int) -> None:
    """A taken port is our one-line error, not gRPC's C-core log line followed by ours:
    the same bind gRPC will do, tried first. (SO_REUSEADDR as gRPC sets it: a port left
    in TIME_WAIT is free, one with a listener is not.)"""
    address = host.strip("[]")
    try:
        infos = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise StartupError(f"relay cannot listen on {host}:{port}: {exc.strerror}") from None
    family, kind, proto, _, sockaddr = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(sockaddr)
        except OSError as exc:
            raise StartupError(f"relay cannot listen on {host}:{port}: {exc.strerror}") from None


@dataclass
class RunningRelay:
    relay: Relay
    server: grpc.aio.Server
    port: int
    health: health.HealthServicer

    async def stop(self, grace: float = 1.0) -> None:
        self.health.enter_graceful_shutdown()
        await self.server.stop(grace)
        await self.relay.close()


async def start_relay(
    settings: Settings,
    host: str = "127.0.0.1",
    port: int = 50051,
    sessions: sessionmaker[Session] | None = None,
    metrics: RelayMetrics | None = None,
) -> RunningRelay:
    """Starts a relay on ``host:port`` (0 picks a free port) and returns once it serves."""
    if port:
        _check_port(host, port)
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
    except Exception as exc:
        await relay.close()
        where = f"Redis at {settings.redis_url}" if settings.redis_url else "the relay log"
        raise StartupError(f"cannot use {where}: {exc}") from None
    server = grpc.aio.server(options=grpc_options(settings))
    server.add_generic_rpc_handlers((relay.handler(),))
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    tls = settings.tls
    try:
        if tls is None:
            bound = server.add_insecure_port(f"{host}:{port}")
        else:
            credentials = grpc.ssl_server_credentials([(tls[1], tls[0])])
            bound = server.add_secure_port(f"{host}:{port}", credentials)
    except RuntimeError:  # grpc's "Failed to bind": the port is taken or not ours
        bound = 0
    if bound == 0:
        await relay.close()
        raise StartupError(f"relay cannot listen on {host}:{port}: address in use or not available")
    await server.start()
    for name in ("", SERVICE):
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return RunningRelay(relay, server, bound, health_servicer)
