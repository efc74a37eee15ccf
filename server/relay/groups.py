"""The relay's view of every channel's MLS group: a tracked group per channel (mls-rs's
external client, through ``svc_sdk.protocol.GroupTracker``), stored with the channel's log and
cached in memory.

Every commit and proposal is validated against the channel's group before it is stored
(signature, sender, epoch, update path, credentials, the roles policy, and that no key
package it adds was used in the channel before); the new state is stored in the same
atomic step as the commit, only if the state it was validated against
is still the stored one (a version number), so two relay processes never both advance a
channel. Loaded groups are kept in a least-recently-used cache bounded in bytes (the
size of their snapshots).
"""

from __future__ import annotations

import asyncio
import struct
import uuid
from collections import OrderedDict
from dataclasses import dataclass

from svc_sdk.protocol import GroupTracker, MlsError, Observed, PolicyError, Roles, TrackedGroup

from ..auth.key_packages import CredentialKeys, KeyPackageError
from ..services.channels import Event, Member
from .store import LogStore


class Invalid(Exception):
    """The message does not validate against the channel's group; nothing was stored."""


class PolicyBreach(Invalid):
    """The message is a valid handshake of a member that the channel's policy forbids."""


class Stale(Exception):
    """The message is for another epoch than the channel's current one."""

    def __init__(self, current_epoch: int) -> None:
        super().__init__(f"message is for a stale epoch; the channel is at epoch {current_epoch}")
        self.current_epoch = current_epoch


@dataclass(frozen=True, slots=True)
class Validated:
    """A handshake message that validates, and the group state it leads to."""

    observed: Observed
    group: TrackedGroup
    roles_before: Roles
    #: The stored version the message was validated against.
    version: int
    #: What to store: the tracked group's snapshot and the key packages used (``pack``).
    snapshot: bytes
    #: The HPKE init keys of every key package the channel's commits added, this one's
    #: too.
    used: frozenset[bytes] = frozenset()


def split(member_id: bytes) -> tuple[uuid.UUID, bytes]:
    return uuid.UUID(bytes=member_id[:16]), member_id[16:]


class Groups:
    def __init__(self, store: LogStore, keys: CredentialKeys, cache_bytes: int) -> None:
        self._store = store
        self._keys = keys
        self._tracker = GroupTracker()
        self._anchors: dict[str, bytes] | None = None
        self._cache: OrderedDict[str, _Cached] = OrderedDict()
        self._cache_bytes = cache_bytes
        self._bytes = 0
        self._locks: dict[str, asyncio.Lock] = {}

    # -- the cache --------------------------------------------------------------------

    @property
    def cached(self) -> tuple[int, int]:
        """(groups, bytes) held in memory."""
        return len(self._cache), self._bytes

    def _put(
        self,
        channel: str,
        version: int,
        group: TrackedGroup,
        size: int,
        used: frozenset[bytes] = frozenset(),
    ) -> _Cached:
        self.evict(channel)
        accounts = frozenset(uuid.UUID(bytes=m[:16]) for m, _ in group.members())
        entry = _Cached(version, group, size, accounts, used)
        if size > self._cache_bytes:
            return entry
        self._cache[channel] = entry
        self._bytes += size
        while self._bytes > self._cache_bytes:
            _, old = self._cache.popitem(last=False)
            self._bytes -= old.size
        return entry

    def evict(self, channel: str) -> None:
        found = self._cache.pop(channel, None)
        if found is not None:
            self._bytes -= found.size

    def lock(self, channel: str) -> asyncio.Lock:
        """Serialises one process's validations of a channel (other processes are kept
        out by the stored version)."""
        lock = self._locks.get(channel)
        if lock is None:
            lock = self._locks[channel] = _ChannelLock(self._locks, channel)
        return lock

    # -- groups -----------------------------------------------------------------------

    def _refresh_anchors(self, refresh: bool = False) -> None:
        try:
            anchors = self._keys.anchors(refresh)
        except KeyPackageError as exc:
            raise Invalid(str(exc)) from None
        if anchors is not self._anchors:
            self._tracker.set_trust_anchors(anchors)
            self._anchors = anchors

    async def _with_anchors(self, call: object, *args: bytes) -> object:
        """Runs a tracker call off the loop; once more with freshly fetched credential
        keys when a credential names a key not seen yet (the API rotated its key)."""
        assert callable(call)
        self._refresh_anchors()
        try:
            return await asyncio.to_thread(call, *args)
        except MlsError as exc:
            if "unknown key" not in str(exc):
                raise _invalid(exc) from None
        self._refresh_anchors(refresh=True)
        try:
            return await asyncio.to_thread(call, *args)
        except MlsError as exc:
            raise _invalid(exc) from None

    async def observe(self, channel: str, group_info: bytes, creator: bytes) -> TrackedGroup:
        """The group a creator's GroupInfo describes, if it is a new group of ``channel``
        whose only member, its owner, is ``creator``."""
        group = await self._with_anchors(self._tracker.observe, group_info)
        assert isinstance(group, TrackedGroup)
        if group.group_id != channel.encode():
            raise Invalid(f"the GroupInfo is for another group than {channel!r}")
        if group.epoch != 0 or group.members() != [(creator, "owner")]:
            raise Invalid("a new channel's group has its creator as its only member, the owner")
        return group

    async def create(self, channel: str, group: TrackedGroup) -> int:
        """Stores a new channel's group; its version, or 0 if the channel has one."""
        snapshot = pack(await asyncio.to_thread(group.snapshot), frozenset())
        version = await self._store.create_group(channel, snapshot)
        if version:
            self._put(channel, version, group, len(snapshot))
        return version

    async def drop(self, channel: str, version: int) -> bool:
        """Drops the group ``create`` stored as ``version``, while the channel's log is
        empty: its creation could not be finished."""
        self.evict(channel)
        return await self._store.drop_group(channel, version)

    async def current(self, channel: str) -> _Cached | None:
        """The stored group of ``channel`` (the cached copy while it is still the stored
        version)."""
        version = await self._store.group_version(channel)
        if version == 0:
            return None
        found = self._cache.get(channel)
        if found is not None and found.version == version:
            self._cache.move_to_end(channel)
            return found
        stored = await self._store.group(channel)
        if stored is None:
            return None
        version, snapshot = stored
        try:
            tracked, used = unpack(snapshot)
            group = await asyncio.to_thread(self._tracker.load, tracked)
        except (MlsError, ValueError) as exc:
            raise Invalid(f"stored group state of {channel!r} is unreadable: {exc}") from None
        return self._put(channel, version, group, len(snapshot), used)

    async def accounts(self, channel: str) -> frozenset[uuid.UUID]:
        """The accounts with a member in the channel's tracked group: who may use it."""
        try:
            found = await self.current(channel)
        except Invalid:
            return frozenset()
        return frozenset() if found is None else found.accounts

    async def validate(self, channel: str, message: bytes, epoch: int) -> Validated:
        """Validates a commit or a member's proposal for ``epoch`` against the stored
        group, on a copy: the cached group changes only through ``accepted``. Call under
        ``lock(channel)``. A repeated proposal (kind "repeat") comes with no state."""
        found = await self.current(channel)
        if found is None:
            raise Invalid(
                f"channel {channel!r} has no tracked group (created before the relay tracked "
                "groups); create the channel again"
            )
        if found.group.epoch != epoch:
            raise Stale(found.group.epoch)
        after = found.group.copy()
        observed = await self._with_anchors(after.process, message)
        assert isinstance(observed, Observed)
        used = found.used
        if observed.kind == "repeat":  # changes nothing: no state to pack
            return Validated(observed, found.group, found.group.roles(), found.version, b"", used)
        if observed.added:
            # By init key, not KeyPackageRef: a copy of a key package whose signature is
            # encoded another way (ECDSA's s and n - s both verify) has another ref.
            keys = observed.added_init_keys
            if len(set(keys)) != len(keys) or not used.isdisjoint(keys):
                # A key package is for one use (RFC 9420, section 16.8). Replayed, it would
                # put back, without its agent's consent, the leaf of a member that was
                # removed or left, whose private keys its agent deleted when it joined.
                raise Invalid(
                    "the commit adds a key package that was used in this channel before; "
                    "a key package is for one use: add the agent with a fresh one"
                )
            used = used.union(keys)
        snapshot = pack(await asyncio.to_thread(after.snapshot), used)
        return Validated(observed, after, found.group.roles(), found.version, snapshot, used)

    def accepted(self, channel: str, v: Validated) -> None:
        """The store took ``v``'s state as the version after ``v.version``."""
        self._put(channel, v.version + 1, v.group, len(v.snapshot), v.used)


# A stored group state: this prefix, the number of used key packages (4 bytes, big
# endian), the HPKE init key of each (a length byte, then the key), then the tracked
# group's snapshot.
# A tracked group's snapshot starts with its protocol version (0x0001), never 0xFF, so a
# state stored before they were kept reads as one with none.
_PACKED = b"\xff\xffsvc-used-kp\x00"
# The same with two length bytes per key: for init keys of 256 bytes or more, which the
# post-quantum suite's are (X-Wing: 1,216 bytes). Used only when a key needs it, so the
# states of suite 1 and 2 channels are stored as before.
_PACKED_WIDE = b"\xff\xffsvc-used-kp\x01"


def pack(tracked: bytes, used: frozenset[bytes]) -> bytes:
    """The state to store for a tracked group's snapshot and the init keys of the key
    packages the channel has used (sorted: the same state packs to the same bytes)."""
    wide = any(len(key) > 0xFF for key in used)
    parts = [_PACKED_WIDE if wide else _PACKED, struct.pack(">I", len(used))]
    for key in sorted(used):
        if len(key) > 0xFFFF:
            raise ValueError(f"an init key of {len(key)} bytes cannot be stored")
        parts += [struct.pack(">H", len(key)) if wide else bytes([len(key)]), key]
    parts.append(tracked)
    return b"".join(parts)


def unpack(stored: bytes) -> tuple[bytes, frozenset[bytes]]:
    """(tracked group snapshot, init keys of the used key packages) of a stored state;
    ValueError if it is cut short."""
    if stored.startswith(_PACKED):
        width = 1
    elif stored.startswith(_PACKED_WIDE):
        width = 2
    else:
        return stored, frozenset()
    at = len(_PACKED)
    if len(stored) < at + 4:
        raise ValueError("stored group state is cut short")
    (count,) = struct.unpack_from(">I", stored, at)
    at += 4
    used = set()
    for _ in range(count):
        if at + width > len(stored):
            raise ValueError("stored group state is cut short")
        size = int.from_bytes(stored[at : at + width], "big")
        at += width
        if at + size > len(stored):
            raise ValueError("stored group state is cut short")
        used.add(stored[at : at + size])
        at += size
    return stored[at:], frozenset(used)


def _invalid(exc: MlsError) -> Invalid:
    return PolicyBreach(str(exc)) if isinstance(exc, PolicyError) else Invalid(str(exc))


@dataclass(frozen=True, slots=True)
class _Cached:
    version: int
    group: TrackedGroup
    size: int
    accounts: frozenset[uuid.UUID]
    #: HPKE init keys of the key packages the channel's commits added.
    used: frozenset[bytes] = frozenset()


class _ChannelLock(asyncio.Lock):
    """A per-channel lock that leaves the table when nobody holds or waits for it."""

    def __init__(self, table: dict[str, asyncio.Lock], channel: str) -> None:
        super().__init__()
        self._table = table
        self._channel = channel

    def release(self) -> None:
        super().release()
        if not self.locked() and not self._waiters:
            self._table.pop(self._channel, None)


def roster(group: TrackedGroup) -> list[Member]:
    return [Member(*split(member), role) for member, role in group.members()]


def events(v: Validated) -> list[Event]:
    """The audit events of a validated commit: who was added, removed or left, whose
    role changed, whether the policy changed."""
    o = v.observed
    actor = split(o.sender)
    found = [Event("added", actor, split(m)) for m, _ in o.added]
    found += [Event("removed", actor, split(m)) for m in o.removed]
    found += [Event("left", split(m), split(m)) for m in o.left]
    if o.roles_changed:
        after = v.group.roles()
        present = {m for m, _ in v.group.members()}
        before = v.roles_before
        for member in sorted(present):
            role = after.role(member)
            if role != before.role(member) and member not in {m for m, _ in o.added}:
                found.append(Event("role", actor, split(member), role))
        if after.members_invite != before.members_invite:
            detail = "members-invite" if after.members_invite else "admins-invite"
            found.append(Event("policy", actor, None, detail))
    return found
