"""The FastAPI application."""

from __future__ import annotations

from fastapi import FastAPI

from .. import __version__
from ..config import Settings
from . import problems
from .deps import Services
from .routes import accounts, channels, credentials, invites, keys, meta, tokens


def create_app(settings: Settings | None = None, services: Services | None = None) -> FastAPI:
    """Builds the API: connects to the database, applies migrations, loads the signing
    key. Pass ``services`` to share them with an embedded relay."""
    services = services or Services.start(settings or Settings())
    app = FastAPI(
        title="svc account API",
        version=__version__,
        description="Accounts, API keys (sk_live_…), their exchange for relay JWTs, and "
        "agent credentials.",
    )
    app.state.services = services
    problems.install(app)
    app.add_middleware(problems.BodyLimit, max_bytes=services.settings.max_body_size)
    for module in (accounts, keys, tokens, credentials, invites, channels, meta):
        app.include_router(module.router)
    return app
