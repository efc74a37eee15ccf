"""The account API (FastAPI): accounts, API keys, token exchange, JWKS."""

from .app import create_app

__all__ = ["create_app"]
