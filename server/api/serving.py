"""How every account API server is run by uvicorn (``svc api``, ``svc up``, the tests):
one place for the options that are security decisions, not tuning."""

from __future__ import annotations

import contextlib
from collections.abc import Generator
from typing import Any

import uvicorn

from ..config import Settings
from .protocol import bounded_protocol


class Server(uvicorn.Server):
    """uvicorn's server without signal handlers of its own: the process that runs it
    decides when it stops (``should_exit``) — ``svc api`` on SIGINT or SIGTERM, with
    handlers in place before it says it serves; ``svc up``'s API process when its parent
    says so."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """Keyword arguments for ``uvicorn.Config`` / ``uvicorn.run``.

    X-Forwarded-For and X-Forwarded-Proto are honoured only from the addresses in
    ``SVC_TRUSTED_PROXIES`` (none by default). Otherwise rate limits are keyed on the
    TCP peer: a client cannot pick the address it is counted under, nor lock another
    address out, by sending the header itself (uvicorn trusts loopback by default).

    >>> uvicorn_options(Settings(trusted_proxies=""))["proxy_headers"]
    False

    The request head is capped and both halves of a request are timed
    (``SVC_MAX_HEADER_BYTES``, ``SVC_MAX_HEADER_COUNT``, ``SVC_HEADER_TIMEOUT_SECONDS``,
    ``SVC_BODY_TIMEOUT_SECONDS``) by the protocol class in ``protocol.py``: uvicorn's
    own protocols bound neither.

    >>> uvicorn_options(Settings())["http"].limits.max_head_bytes
    32768
    """
    proxies = settings.proxy_list
    return {
        "http": bounded_protocol(settings),
        "timeout_keep_alive": settings.keep_alive_timeout_seconds,
        "proxy_headers": bool(proxies),
        "forwarded_allow_ips": proxies or None,
        "ssl_certfile": settings.tls_cert_file or None,
        "ssl_keyfile": settings.tls_key_file or None,
    }
