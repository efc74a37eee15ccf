"""Channel.update_keys() against a real local stack: the owner and admins commit their
updates, a plain member proposes its own and an owner's or admin's client commits it."""

from __future__ import annotations

import time
from typing import Any

import pytest

from svc_sdk import PolicyError, TransportError
from svc_sdk.testing import LocalStack

from .helpers import listening, pair, take, wait_for


def test_a_plain_members_update_is_committed_by_the_owners_client(
    stack: LocalStack, channel_name: str, ids: Any
) -> None:
    ca, chan_a, cb, chan_b = pair(stack, channel_name, ids("a"), ids("b"))
    with ca, cb:
        epoch = chan_b.epoch
        with listening(chan_a):
            chan_b.update_keys()
        assert chan_b._commits.updated_epoch == chan_b.epoch == epoch + 1
        wait_for(lambda: chan_a.epoch == epoch + 1)
        chan_b.send(b"with fresh keys")
        assert take(chan_a, 1) == [b"with fresh keys"]
        chan_a.send(b"read with them")
        assert take(chan_b, 1) == [b"read with them"]
        # b does not commit, not even around the engine's own check.
        with pytest.raises(PolicyError, match="only the owner and admins commit"):
            chan_b._commits.commit(chan_b._group.self_update)


def test_a_plain_members_update_with_no_admin_online_times_out_and_lands_later(
    stack: LocalStack, channel_name: str, ids: Any
) -> None:
    """Nobody reads a's channel: b's update waits for a commit that does not come and
    raises, its keys unchanged. The proposal stays valid in its epoch: once a's client
    reads the channel, it commits the update."""
    ca, chan_a, cb, chan_b = pair(stack, channel_name, ids("a"), ids("b"))
    with ca, cb:
        epoch = chan_b.epoch
        with pytest.raises(TransportError, match="no owner or admin committed"):
            chan_b.update_keys(timeout=1.0)
        assert chan_b.epoch == epoch and chan_b._commits.updated_epoch == 0
        with listening(chan_a):
            wait_for(lambda: chan_b.members() and chan_b.epoch == epoch + 1)
        assert chan_b._commits.updated_epoch == epoch + 1


def test_a_plain_members_renewed_credential_reaches_the_channel(
    stack: LocalStack, channel_name: str, ids: Any
) -> None:
    ca, chan_a, cb, chan_b = pair(stack, channel_name, ids("a"), ids("b"))
    with ca, cb:
        first = cb.engine.credential
        assert first is not None
        epoch = chan_a.epoch
        time.sleep(1.1)  # a later not_before, so the renewal is visibly a new credential
        with listening(chan_a):
            cb.renew_credential()
        renewed = cb.engine.credential
        assert renewed is not None and renewed.not_before > first.not_before
        assert chan_b._commits.updated_epoch == epoch + 1
        chan_b.send(b"under the renewed credential")
        assert take(chan_a, 1) == [b"under the renewed credential"]
        assert chan_a.members() == chan_b.members() == [ca.agent_id, cb.agent_id]


def test_update_keys_again_in_the_same_epoch_sends_the_same_proposal(
    stack: LocalStack, channel_name: str, ids: Any
) -> None:
    """The relay holds one update proposal per member and epoch: called again after a
    timeout, update_keys() publishes the one it made, and the owner commits it."""
    ca, chan_a, cb, chan_b = pair(stack, channel_name, ids("a"), ids("b"))
    with ca, cb:
        epoch = chan_b.epoch
        with pytest.raises(TransportError, match="no owner or admin committed"):
            chan_b.update_keys(timeout=0.5)
        made = chan_b._commits.update_proposal
        assert made is not None and made[0] == epoch
        with listening(chan_a):
            chan_b.update_keys()
        assert chan_b._commits.updated_epoch == chan_b.epoch == epoch + 1
