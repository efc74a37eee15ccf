"""Commit validation at the relay beside a member's own cost, and the memory of tracked
groups.

    python bench/membership.py [--sizes 10,100,1000] [--rounds 5] [--repeat 3]

For each group size N, a real group of N agents (one engine and one agent credential
each, from an in-process issuer the relay side trusts) is built by its creator in one
commit; one other member joins from the Welcome and processes every later commit. The
relay side is the relay's own code: ``svc_sdk.mls.GroupTracker`` (mls-rs's external
client) behind ``server/relay/groups.py``'s ``Groups`` over a SQLite log store, following
the group from the creator's GroupInfo like a relay does.

Each round the creator commits an add (N → N+1), the removal of that member (→ N) and a
self-update; each commit is measured

- at the relay: ``TrackedGroup.process`` on a copy (the validation itself),
  ``Groups.validate`` with the group cached and after evicting it (the stored snapshot
  read and loaded first), and the full accept (validate, store commit + new snapshot,
  cache update), which advances the tracked group;
- for the bound, in the same run: the member's ``Group.process_batch`` of the same
  commit in memory (repeated, the state discarded in between), then once with the
  state written (``save``), which advances the member.

Then, per size: the snapshot's bytes, its load and copy time, and the RSS a process
grows by holding K loaded tracked groups of that size (measured in a fresh child
process), against the snapshot bytes the relay's LRU cache counts per group. Times are
medians over ``--rounds`` rounds (times ``--repeat`` for the repeatable ones), in ms.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import gc
import multiprocessing as mp
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from svc_sdk.mls import Engine, Group, GroupTracker, MlsError, PendingCommit, TrackedGroup
from svc_sdk.testing import LocalIssuer

OPS = ("add", "remove", "update")


def rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


def ms(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000


async def ams(aw: Awaitable[object]) -> float:
    start = time.perf_counter()
    await aw
    return (time.perf_counter() - start) * 1000


def jwks(issuer: LocalIssuer) -> dict[str, Any]:
    """The issuer's key as the account API publishes it (what the relay fetches)."""
    x = base64.urlsafe_b64encode(issuer.public_key).rstrip(b"=").decode()
    return {"keys": [{"kty": "OKP", "crv": "Ed25519", "kid": issuer.kid, "x": x}]}


@dataclass
class Samples:
    """Per (size, operation): lists of ms (or bytes), one entry per sample."""

    values: dict[str, list[float]] = field(default_factory=dict)

    def add(self, name: str, value: float) -> None:
        self.values.setdefault(name, []).append(value)

    def median(self, name: str) -> float:
        return statistics.median(self.values[name])


class Agents:
    """Engines with agent credentials from one issuer, made on demand."""

    def __init__(self, root: Path, issuer: LocalIssuer) -> None:
        self.root = root
        self.issuer = issuer
        self.count = 0

    def make(self, prefix: str) -> Engine:
        self.count += 1
        name = f"{prefix}-{self.count}"
        return self.issuer.certify(Engine(self.root / name, name.encode()))

    def many(self, prefix: str, n: int) -> Iterator[Engine]:
        for _ in range(n):
            yield self.make(prefix)


class SizeRun:
    """One group of ``size`` members, its creator, one joined member and the relay's
    ``Groups`` tracking it."""

    def __init__(self, size: int, root: Path, agents: Agents, groups: Any, store: Any) -> None:
        self.size = size
        self.root = root
        self.agents = agents
        self.groups = groups
        self.store = store
        self.channel = f"bench/membership/n{size}"
        self.samples: dict[str, Samples] = {op: Samples() for op in OPS}
        self.setup: dict[str, float] = {}

    async def build(self) -> None:
        creator = self.agents.make(f"n{self.size}-creator")
        self.creator = creator.create_group(self.channel.encode())
        tracked = await self.groups.observe(
            self.channel, self.creator.group_info(), creator.member_id
        )
        assert await self.groups.create(self.channel, tracked)
        start = time.perf_counter()
        member = self.agents.make(f"n{self.size}-member")
        others = list(self.agents.many(f"n{self.size}", self.size - 2))
        key_packages = [e.generate_key_package() for e in [member, *others]]
        self.setup["make N-1 agents + key packages"] = time.perf_counter() - start
        start = time.perf_counter()
        pending = self.creator.add_members(key_packages)
        self.setup["creator: commit N-1 adds"] = time.perf_counter() - start
        start = time.perf_counter()
        await self.accept(pending)
        self.setup["relay: accept that commit"] = time.perf_counter() - start
        self.creator.apply_pending_commit()
        assert pending.welcome is not None
        start = time.perf_counter()
        self.member: Group = member.join_group(pending.welcome)
        self.setup["member: join"] = time.perf_counter() - start
        assert len(self.member.members()) == self.size

    async def accept(self, pending: PendingCommit) -> None:
        """What the relay does with an accepted Commit frame, after its framing checks:
        validate, store the commit with the new snapshot, update the cache."""
        async with self.groups.lock(self.channel):
            v = await self.groups.validate(self.channel, pending.commit, pending.epoch)
            await self.store.commit(
                self.channel,
                b"bench",
                pending.epoch,
                pending.commit,
                pending.welcome or b"",
                [m for m, _ in v.observed.added],
                (v.version, v.snapshot),
            )
            self.groups.accepted(self.channel, v)

    def commit(self, op: str, joiner: Engine | None, removed: bytes | None) -> PendingCommit:
        if op == "add":
            assert joiner is not None
            return self.creator.add_members([joiner.generate_key_package()])
        if op == "remove":
            assert removed is not None
            return self.creator.remove_members([removed])
        return self.creator.self_update()

    async def round(self, repeat: int) -> None:
        joiner = self.agents.make(f"n{self.size}-joiner")
        assert joiner.member_id is not None
        for op in OPS:
            s = self.samples[op]
            start = time.perf_counter()
            pending = self.commit(op, joiner, joiner.member_id)
            s.add("committer: create", (time.perf_counter() - start) * 1000)
            s.add("commit bytes", len(pending.commit))
            cached = await self.groups.current(self.channel)
            assert cached is not None and cached.group.epoch == pending.epoch
            for _ in range(repeat):
                # The validation itself, on a copy (as Groups.validate does).
                copy = cached.group.copy()
                s.add("relay: process", ms(partial(copy.process, pending.commit)))
                s.add("relay: copy", ms(cached.group.copy))
                validate = partial(self.groups.validate, self.channel, pending.commit)
                async with self.groups.lock(self.channel):
                    s.add("relay: validate (cached)", await ams(validate(pending.epoch)))
                    self.groups.evict(self.channel)
                    s.add("relay: validate (loaded)", await ams(validate(pending.epoch)))
                # The member, in memory; what it processed is forgotten again.
                start = time.perf_counter()
                [received] = self.member.process_batch([pending.commit], save=False)
                s.add("member: process", (time.perf_counter() - start) * 1000)
                assert not isinstance(received, MlsError), received
                self.member.discard_unsaved()
            s.add("relay: accept (validate + store)", await ams(self.accept(pending)))
            self.creator.apply_pending_commit()
            start = time.perf_counter()
            [received] = self.member.process_batch([pending.commit], save=False)
            self.member.save()
            s.add("member: process + save", (time.perf_counter() - start) * 1000)
            assert not isinstance(received, MlsError), received
        assert len(self.member.members()) == self.size

    async def snapshot_figures(self, tracker: GroupTracker, repeat: int) -> dict[str, float]:
        cached = await self.groups.current(self.channel)
        assert cached is not None
        snapshot = cached.group.snapshot()
        loads = [ms(lambda: tracker.load(snapshot)) for _ in range(repeat * 3)]
        copies = [ms(cached.group.copy) for _ in range(repeat * 3)]
        saves = [ms(cached.group.snapshot) for _ in range(repeat * 3)]
        path = self.root / f"snapshot-{self.size}"
        path.write_bytes(snapshot)
        self.snapshot_path = path
        return {
            "bytes": len(snapshot),
            "load": statistics.median(loads),
            "copy": statistics.median(copies),
            "snapshot": statistics.median(saves),
        }


def hold_groups(snapshot: str, count: int, anchors: dict[str, bytes], out: Any) -> None:
    """In a fresh process: the RSS grown by holding ``count`` tracked groups loaded from
    ``snapshot`` (one loaded and dropped first, so the library's own first use is not
    counted)."""
    data = Path(snapshot).read_bytes()
    tracker = GroupTracker()
    tracker.set_trust_anchors(anchors)
    first = tracker.load(data)
    first.members()
    del first
    gc.collect()
    before = rss_kb()
    held: list[TrackedGroup] = [tracker.load(data) for _ in range(count)]
    gc.collect()
    after = rss_kb()
    assert len(held) == count
    out.send((before, after))


def memory_per_group(snapshot: Path, count: int, anchors: dict[str, bytes]) -> float:
    """KB of RSS per tracked group, measured in a child process."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=hold_groups, args=(str(snapshot), count, anchors, child))
    proc.start()
    before, after = parent.recv()
    proc.join(60)
    return float(after - before) / count


async def run(args: argparse.Namespace, root: Path) -> None:
    from svc_server.auth.key_packages import CredentialKeys
    from svc_server.relay.groups import Groups
    from svc_server.relay.sqlite_store import SqliteLogStore

    issuer = LocalIssuer()
    agents = Agents(root / "agents", issuer)
    store = SqliteLogStore(root / "relay.sqlite3")
    await store.start()
    groups = Groups(store, CredentialKeys(lambda: jwks(issuer)), 1024 * 1024 * 1024)
    tracker = GroupTracker()
    tracker.set_trust_anchors(issuer.anchors)
    runs = []
    snapshots = {}
    try:
        for size in args.sizes:
            sized = SizeRun(size, root, agents, groups, store)
            await sized.build()
            for _ in range(args.rounds):
                await sized.round(args.repeat)
                print(".", end="", file=sys.stderr, flush=True)
            snapshots[size] = await sized.snapshot_figures(tracker, args.repeat)
            runs.append(sized)
    finally:
        await store.close()
    print(file=sys.stderr)
    memory = {}
    for sized in runs:
        size_bytes = snapshots[sized.size]["bytes"]
        count = max(20, min(1000, int(64 * 1024 * 1024 // size_bytes)))
        memory[sized.size] = (count, memory_per_group(sized.snapshot_path, count, issuer.anchors))

    print(
        f"Commit validation at the relay against a member's cost; suite 1, SQLite log store; "
        f"median of {args.rounds} rounds ({args.repeat} repeats of the in-memory steps); ms\n"
    )
    print(
        "| members | commit | bytes | relay: validate (tracker) | relay: Groups.validate, "
        "cached | relay: Groups.validate, loaded from store | relay: accept (validate + "
        "store + cache) | member: process (bound) | member: process + save | committer: "
        "create | relay validate ÷ member process |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for sized in runs:
        for op in OPS:
            s = sized.samples[op]
            relay = s.median("relay: process")
            member = s.median("member: process")
            print(
                f"| {sized.size:,} | {op} | {s.median('commit bytes'):,.0f} | {relay:.2f} "
                f"| {s.median('relay: validate (cached)'):.2f} "
                f"| {s.median('relay: validate (loaded)'):.2f} "
                f"| {s.median('relay: accept (validate + store)'):.2f} "
                f"| {member:.2f} | {s.median('member: process + save'):.2f} "
                f"| {s.median('committer: create'):.2f} | {relay / member:.2f}x |"
            )
    print()
    print("Tracked group state: what the relay stores and caches per channel\n")
    print(
        "| members | snapshot (bytes) | take snapshot (ms) | load snapshot (ms) "
        "| copy (ms) | groups held "
        "| RSS per tracked group (KB) | RSS ÷ snapshot |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for sized in runs:
        snap = snapshots[sized.size]
        count, per_group = memory[sized.size]
        print(
            f"| {sized.size:,} | {snap['bytes']:,.0f} | {snap['snapshot']:.2f} "
            f"| {snap['load']:.2f} | {snap['copy']:.2f} "
            f"| {count:,} | {per_group:,.1f} | {per_group * 1024 / snap['bytes']:.2f}x |"
        )
    print()
    print("Set-up, once per size (s)\n")
    names = list(runs[0].setup)
    print("| members | " + " | ".join(names) + " |")
    print("|---:|" + "---:|" * len(names))
    for sized in runs:
        print(f"| {sized.size:,} | " + " | ".join(f"{sized.setup[n]:.2f}" for n in names) + " |")


def sizes(text: str) -> list[int]:
    found = [int(s) for s in text.split(",") if s]
    if not found or min(found) < 2:
        raise argparse.ArgumentTypeError("sizes are group sizes of at least 2")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--sizes", type=sizes, default=[10, 100, 1000])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="svc-bench-membership-"))
    try:
        asyncio.run(run(args, root))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
