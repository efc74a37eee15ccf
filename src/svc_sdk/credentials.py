"""Where the API key and API address come from: ``SVC_API_KEY`` or the key
file ``svc signup`` writes (``~/.svc/api-key``, mode 0600), and ``SVC_API_URL``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import ssl

DEFAULT_API_URL = "http://127.0.0.1:8000"
DEFAULT_RELAY_URL = "http://127.0.0.1:50051"


def tls_ca_file() -> str | None:
    """``SVC_TLS_CA_FILE``: PEM roots to trust for https:// endpoints instead of the
    system's (for a private CA or a self-signed certificate)."""
    return os.environ.get("SVC_TLS_CA_FILE") or None


def tls_verify() -> ssl.SSLContext | bool:
    """What httpx verifies the API's certificate against."""
    ca = tls_ca_file()
    if not ca:
        return True
    import ssl  # here: loading OpenSSL costs ~3 MiB, and only httpx callers need it

    return ssl.create_default_context(cafile=ca)


def key_file() -> Path:
    return Path.home() / ".svc" / "api-key"


def api_url() -> str:
    return os.environ.get("SVC_API_URL") or DEFAULT_API_URL


def load_api_key() -> str | None:
    """``SVC_API_KEY``, else the key file, else None."""
    key = os.environ.get("SVC_API_KEY")
    if key:
        return key.strip()
    try:
        return key_file().read_text().strip() or None
    except FileNotFoundError:
        return None


def save_api_key(key: str, *, replace: bool = False) -> Path:
    """Writes the key file, 0600 in a 0700 folder. An existing key file is kept unless
    ``replace``: it may hold the only copy of another account's key
    (:class:`FileExistsError`)."""
    path = key_file()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    # A fresh name each time, created exclusively: never a file someone else prepared.
    tmp = path.with_name(f".api-key.{os.getpid()}.{os.urandom(4).hex()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(key + "\n")
        if replace:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)  # fails if the key file exists, atomically
    finally:
        tmp.unlink(missing_ok=True)
    return path
