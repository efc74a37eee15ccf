"""How many refused access checks an account may cause: a token bucket per account.

A check that ends in a refusal costs the relay a lookup of the channel's group and a
query of the account database (does the account hold a live invite redemption?), ten
times what a request that needs no check costs. An account whose streams asked, over and
over, for a channel it may not use made another account's round trips 20 times slower
(docs/performance.md, "Refused requests"). Past its budget, an account's requests that
need a check are answered at once, without one, until the budget refills. An honest
client is refused a handful of times (a channel it was removed from), never a hundred.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

# Refusals an account may cause at once, and how many more each second after that.
DENIAL_BURST = 100
DENIALS_PER_SECOND = 10.0
# Accounts tracked before those whose budget is full again are forgotten.
MAX_TRACKED = 10_000


class Denials:
    """Each account's budget of refused access checks (see the module)."""

    def __init__(
        self,
        burst: int = DENIAL_BURST,
        per_second: float = DENIALS_PER_SECOND,
        clock: Callable[[], float] = time.monotonic,
        tracked: int = MAX_TRACKED,
    ) -> None:
        self.burst = burst
        self.per_second = per_second
        self._clock = clock
        self._spent: dict[uuid.UUID, tuple[float, float]] = {}  # account: tokens, when
        self._tracked = self._prune_at = tracked

    def _tokens(self, account: uuid.UUID, now: float) -> float:
        tokens, when = self._spent.get(account, (self.burst, now))
        return min(self.burst, tokens + (now - when) * self.per_second)

    def exhausted(self, account: uuid.UUID) -> bool:
        """Whether ``account`` has no refusal left to cause."""
        return self._tokens(account, self._clock()) < 1

    def spend(self, account: uuid.UUID) -> None:
        """Counts one refusal against ``account``."""
        now = self._clock()
        self._spent[account] = (self._tokens(account, now) - 1, now)
        if len(self._spent) > self._prune_at:
            self._spent = {
                a: spent for a, spent in self._spent.items() if self._tokens(a, now) < self.burst
            }
            # Next time when twice as many are tracked: pruning stays O(1) per refusal.
            self._prune_at = max(self._tracked, 2 * len(self._spent))

    def __len__(self) -> int:
        return len(self._spent)
