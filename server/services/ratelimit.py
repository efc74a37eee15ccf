"""Per-client-address rate limits (signup, failed authentication), on the `limits`
library: in process memory by default, shared through Redis when SVC_REDIS_URL is set."""

from __future__ import annotations

import math
import time

from limits import RateLimitItem, parse
from limits.storage import storage_from_string
from limits.strategies import MovingWindowRateLimiter

from ..config import Settings


class RateLimits:
    def __init__(self, settings: Settings) -> None:
        storage = storage_from_string(settings.redis_url or "memory://")
        self._limiter = MovingWindowRateLimiter(storage)
        self._signup: RateLimitItem = parse(settings.signup_rate_limit)
        self._auth_failures: RateLimitItem = parse(settings.auth_failure_rate_limit)

    def _retry_after(self, item: RateLimitItem, *identifiers: str) -> int:
        reset = self._limiter.get_window_stats(item, *identifiers).reset_time
        return max(1, math.ceil(reset - time.time()))

    def take_signup(self, address: str) -> int | None:
        """Counts a signup attempt; returns seconds to wait if over the limit."""
        if self._limiter.hit(self._signup, "signup", address):
            return None
        return self._retry_after(self._signup, "signup", address)

    def auth_blocked(self, address: str) -> int | None:
        """Seconds to wait if this address failed authentication too often, else None."""
        if self._limiter.test(self._auth_failures, "auth-failure", address):
            return None
        return self._retry_after(self._auth_failures, "auth-failure", address)

    def record_auth_failure(self, address: str) -> None:
        self._limiter.hit(self._auth_failures, "auth-failure", address)
