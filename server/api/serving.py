"""How every account API server is run by uvicorn (``svc api``, ``svc up``, the tests):
one place for the options that are security decisions, not tuning."""

from __future__ import annotations

from typing import Any

from ..config import Settings


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """Keyword arguments for ``uvicorn.Config`` / ``uvicorn.run``.

    X-Forwarded-For and X-Forwarded-Proto are honoured only from the addresses in
    ``SVC_TRUSTED_PROXIES`` (none by default). Otherwise rate limits are keyed on the
    TCP peer: a client cannot pick the address it is counted under, nor lock another
    address out, by sending the header itself (uvicorn trusts loopback by default).

    >>> uvicorn_options(Settings(trusted_proxies=""))["proxy_headers"]
    False
    """
    proxies = settings.proxy_list
    return {
        "proxy_headers": bool(proxies),
        "forwarded_allow_ips": proxies or None,
        "ssl_certfile": settings.tls_cert_file or None,
        "ssl_keyfile": settings.tls_key_file or None,
    }
