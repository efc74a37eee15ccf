"""Server settings, read from ``SVC_*`` environment variables (pydantic-settings)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from .errors import StartupError

DEFAULT_DATA_DIR = Path("~/.svc/server")


class Settings(BaseSettings):
    """Everything the account API and the relay can be configured with.

    >>> Settings(data_dir="/tmp/svc").database_url
    'sqlite:////tmp/svc/svc.sqlite3'
    """

    model_config = SettingsConfigDict(env_prefix="SVC_", extra="ignore")

    data_dir: Path = Field(DEFAULT_DATA_DIR, description="Directory for the embedded database")
    database_url: str = Field(
        "", description="SQLAlchemy URL; empty means SQLite in data_dir (PostgreSQL in production)"
    )
    redis_url: str = Field(
        "",
        description="Relay log shared by relay processes: redis://host:port/db for one "
        "Redis server, redis+cluster://host:port[,host:port...] for a Redis Cluster",
    )
    token_ttl_seconds: int = Field(900, ge=5, le=86_400, description="JWT lifetime")
    agent_credential_ttl_seconds: int = Field(
        3 * 86_400, ge=10, le=30 * 86_400, description="Agent credential lifetime"
    )
    issuer: str = "svc-api"
    audience: str = "svc-relay"
    signup_rate_limit: str = Field("10/minute", description="Signups per client address")
    auth_failure_rate_limit: str = Field(
        "30/minute", description="Failed API-key authentications per client address"
    )
    trusted_proxies: str = Field(
        "",
        description="Comma-separated addresses (or CIDRs) of reverse proxies whose "
        "X-Forwarded-For the API believes; empty: none, rate limits use the TCP peer",
    )
    tls_cert_file: str = Field(
        "", description="PEM certificate (chain) for TLS on the API and relay; empty: plain"
    )
    tls_key_file: str = Field("", description="PEM private key for tls_cert_file")
    max_body_size: int = Field(64 * 1024, ge=1024, description="Largest request body, bytes")
    max_header_bytes: int = Field(
        32 * 1024,
        ge=1024,
        le=1024 * 1024,
        description="Largest request head (request line and header fields), bytes; "
        "beyond it the API answers 431",
    )
    max_header_count: int = Field(
        100, ge=10, le=10_000, description="Most header fields in a request; beyond: 431"
    )
    header_timeout_seconds: float = Field(
        10.0,
        gt=0,
        le=600,
        description="Time a client has to send a request head, from connecting or from "
        "the request's first byte; then 408 and the connection is closed",
    )
    body_timeout_seconds: float = Field(
        30.0,
        gt=0,
        le=3600,
        description="Time a client has to send a request body after its head; then the "
        "connection is closed",
    )
    keep_alive_timeout_seconds: int = Field(
        5, ge=1, le=600, description="How long an idle keep-alive connection stays open"
    )
    last_used_write_interval_seconds: float = Field(60.0, ge=0)

    # Relay
    api_url: str = Field(
        "", description="Account API address for the JWKS; empty means read it from the database"
    )
    retention_seconds: int = Field(7 * 86_400, ge=60, description="How long messages are kept")
    max_message_bytes: int = Field(1024 * 1024, ge=1024, le=16 * 1024 * 1024)
    subscriber_buffer: int = Field(
        4096, ge=16, description="Deliveries queued per stream before it is told it lagged"
    )
    subscriber_buffer_bytes: int = Field(
        16 * 1024 * 1024,
        ge=8 * 1024 * 1024,
        description="Bytes of deliveries queued per stream before it is told it lagged",
    )
    relay_buffer_bytes: int = Field(
        512 * 1024 * 1024,
        ge=64 * 1024 * 1024,
        description="Bytes of deliveries queued in all streams; past it the fullest stream lags",
    )
    relay_streams_per_account: int = Field(
        1000,
        ge=1,
        description="Streams one account may have open on one relay process at once",
    )
    relay_group_cache_bytes: int = Field(
        256 * 1024 * 1024,
        ge=1024 * 1024,
        description="Memory for tracked MLS groups (snapshot bytes); least recently used go",
    )
    relay_sync: str = Field(
        "normal", pattern="^(normal|full)$", description="SQLite log: fsync every batch (full)"
    )

    @property
    def proxy_list(self) -> list[str]:
        return [p.strip() for p in self.trusted_proxies.split(",") if p.strip()]

    @field_validator("data_dir")
    @classmethod
    def _expand(cls, value: Path) -> Path:
        return value.expanduser()

    def model_post_init(self, __context: object) -> None:
        if not self.database_url:
            self.database_url = f"sqlite:///{self.data_dir / 'svc.sqlite3'}"

    @property
    def tls(self) -> tuple[bytes, bytes] | None:
        """(certificate chain, private key) in PEM when TLS is configured."""
        if not self.tls_cert_file and not self.tls_key_file:
            return None
        if not (self.tls_cert_file and self.tls_key_file):
            raise StartupError("TLS needs both SVC_TLS_CERT_FILE and SVC_TLS_KEY_FILE")
        try:
            return Path(self.tls_cert_file).read_bytes(), Path(self.tls_key_file).read_bytes()
        except OSError as exc:
            raise StartupError(f"cannot read TLS files: {exc}") from None

    @property
    def scheme(self) -> str:
        return "https" if self.tls_cert_file else "http"

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")
