"""Verifying the account API's tokens where they are used (the relay)."""

from .verifier import Claims, InvalidToken, TokenVerifier

__all__ = ["Claims", "InvalidToken", "TokenVerifier"]
