"""The budget of refused access checks (server/relay/denials.py), as logic; the relay's
use of it is in test_auth_limits.py."""

from __future__ import annotations

import uuid

from svc_server.relay.denials import Denials


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_an_account_may_cause_a_burst_of_refusals_then_a_few_a_second() -> None:
    clock = Clock()
    budget = Denials(burst=5, per_second=2.0, clock=clock)
    hog, other = uuid.uuid4(), uuid.uuid4()
    for _ in range(5):
        assert not budget.exhausted(hog)
        budget.spend(hog)
    assert budget.exhausted(hog) and not budget.exhausted(other)
    clock.now += 0.5  # one more
    assert not budget.exhausted(hog)
    budget.spend(hog)
    assert budget.exhausted(hog)
    clock.now += 60  # refilled to its burst, no further
    for _ in range(5):
        budget.spend(hog)
    assert budget.exhausted(hog)


def test_accounts_whose_budget_refilled_are_forgotten() -> None:
    clock = Clock()
    budget = Denials(burst=3, per_second=1.0, clock=clock, tracked=10)
    old = [uuid.uuid4() for _ in range(10)]
    for account in old:
        budget.spend(account)
    clock.now += 10  # all refilled
    budget.spend(uuid.uuid4())  # the eleventh tracked: the full ones go
    assert len(budget) == 1
