r"""``AgentId``: who a channel member is, as its verified credential says.

An agent identity (``b"alice"``) is chosen by its account, so two accounts can both run
an ``alice``. What a channel knows about a member is the pair its agent credential binds
and every member verified: the account that holds the key, and the identity.

>>> who = AgentId("6f1c1c3e-5d0e-4d2b-9a43-0b8f3f2d6a10", b"alice")
>>> str(who)
'alice@6f1c1c3e-5d0e-4d2b-9a43-0b8f3f2d6a10'
>>> AgentId(who.account, b"caf\xc3\xa9 \xff").name
'café \\xff'
>>> AgentId.from_member_id(who.member_id) == who
True
"""

from __future__ import annotations

import functools
import uuid
from dataclasses import dataclass

ACCOUNT_BYTES = 16
# Every received message names its sender: parsing the UUID each time was a tenth of a
# receiver's time at 256 B. A channel has few members, so a small cache holds them all.
CACHED_MEMBERS = 1024


@dataclass(frozen=True, order=True, slots=True)
class AgentId:
    """A verified channel member: ``account`` (the account's UUID, as text) and
    ``identity`` (the agent identity bytes). ``str()`` is ``identity@account``."""

    account: str
    identity: bytes

    @classmethod
    def from_member_id(cls, member_id: bytes) -> AgentId:
        """From the engine's and relay's form: the account's 16 UUID bytes, then the
        identity."""
        if len(member_id) <= ACCOUNT_BYTES:
            raise ValueError("a member id is 16 account bytes followed by the identity")
        if cls is AgentId:
            return _parse(bytes(member_id))
        return cls(str(uuid.UUID(bytes=bytes(member_id[:ACCOUNT_BYTES]))), member_id[16:])

    @property
    def member_id(self) -> bytes:
        """``account (16 bytes) || identity``: how MLS groups and the relay name the agent."""
        return _member_id(self.account, self.identity)

    @property
    def name(self) -> str:
        """The identity as text, for people: UTF-8, other bytes as ``\\xNN`` escapes."""
        return self.identity.decode(errors="backslashreplace")

    def __str__(self) -> str:
        return f"{self.name}@{self.account}"


@functools.lru_cache(maxsize=CACHED_MEMBERS)
def _parse(member_id: bytes) -> AgentId:
    return AgentId(str(uuid.UUID(bytes=member_id[:ACCOUNT_BYTES])), member_id[ACCOUNT_BYTES:])


@functools.lru_cache(maxsize=CACHED_MEMBERS)
def _member_id(account: str, identity: bytes) -> bytes:
    return uuid.UUID(account).bytes + identity
