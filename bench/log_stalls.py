"""The tail of a durable commit: the relay log's appends, one at a time, beside writeback.

    python bench/log_stalls.py [--seconds 4] [--rounds 3] [--dir DIR]

A round trip's slowest hops are the relay's: each stores the message before it fans it
out, and a lone publish is stored on the relay's event loop: journaled, and committed
with the others of the last 10 ms (server/relay/sqlite_store.py, sqlite_journal.py).
This drives the relay's own ``SqliteLogStore`` as a round trip does — one 300 B message
at a time, 0.4 ms apart: ~1,900 a second, where round trips here make ~1,700 — and times
every append in three setups, each in a fresh directory under ``--dir`` (the system's
temporary directory by default, where the end-to-end benchmark's relay keeps its log;
use the relay's data disk to measure that one), in turn, in the same run:

- **relay**: the store as the relay runs it, its checkpoint thread included (a PASSIVE
  checkpoint every ~1,000 pages as the store estimates them, ~250 appends: with
  ``synchronous=NORMAL`` the checkpoint is where the WAL and the database file are
  synced to the disk);
- **no checkpoints**: the same store with the checkpoint thread's thresholds out of
  reach, so nothing is synced while it runs (the WAL grows; not a way to run a relay);
- **writeback only**: no checkpoints, and a thread that writes 1.2 MB to another file
  of the same filesystem and ``fdatasync``s it every 150 ms — a checkpoint's I/O without
  SQLite.

The last two columns are the bound: what the same appends cost at the tail when nothing
syncs, and when something else on the filesystem does. Medians of ``--rounds`` rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from svc_sdk._argtypes import whole_number
from svc_server.relay import sqlite_checkpoints
from svc_server.relay.sqlite_store import SqliteLogStore

CHANNEL = "bench/log/stalls"
SENDER = b"s" * 32
PACE_SECONDS = 0.0004  # between appends, by time.sleep (the loop's timers round up to 1 ms)
SLOW_SECONDS = 0.0005
SETUPS = ("relay", "no checkpoints", "writeback only")


@contextmanager
def _checkpoints_off() -> Iterator[None]:
    pages, idle = sqlite_checkpoints.PAGES, sqlite_checkpoints.IDLE_SECONDS
    sqlite_checkpoints.PAGES = sys.maxsize
    sqlite_checkpoints.IDLE_SECONDS = 3600.0
    try:
        yield
    finally:
        sqlite_checkpoints.PAGES, sqlite_checkpoints.IDLE_SECONDS = pages, idle


@contextmanager
def _writeback(directory: Path) -> Iterator[None]:
    """Another file of the filesystem, written and synced every 150 ms meanwhile."""
    stop = threading.Event()
    failed: list[OSError] = []
    fd = os.open(directory / "other", os.O_RDWR | os.O_CREAT, 0o600)

    def run() -> None:
        block, offset = os.urandom(4096), 0
        try:
            while not stop.wait(0.15):
                for _ in range(300):
                    os.pwrite(fd, block, offset)
                    offset += len(block)
                os.fdatasync(fd)
        except OSError as exc:  # a column that measured no writeback must not pass as one
            failed.append(exc)

    thread = threading.Thread(target=run, name="bench-writeback", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        os.close(fd)
    if failed:
        raise SystemExit(f"the writeback thread failed: {failed[0]}")


async def _appends(path: Path, seconds: int) -> tuple[list[float], int]:
    """Append latencies (s) over ``seconds``, and the checkpoints run meanwhile.

    The pause between appends blocks the loop (``time.sleep``): ``asyncio.sleep`` would
    wait at least a millisecond. An append committed inline (or journaled) is settled
    before its ``await`` returns, and one that went to the writer thread is awaited
    before the pause. Each latency also covers one turn of the loop after the append
    (``asyncio.sleep(0)``), where the commit of the journal's open transaction runs when
    it is due: loop time a relay would spend there too."""
    store = SqliteLogStore(path)
    await store.start()
    message, latencies = os.urandom(300), []
    try:
        end = time.perf_counter() + seconds
        n = 0
        while time.perf_counter() < end:
            n += 1
            started = time.perf_counter()
            await store.append_many(CHANNEL, SENDER, [(message, 0)], [n.to_bytes(16, "big")])
            await asyncio.sleep(0)
            latencies.append(time.perf_counter() - started)
            time.sleep(PACE_SECONDS)
        checkpointer = store._checkpointer
        return latencies, checkpointer.checkpoints if checkpointer else 0
    finally:
        await store.close()


def _round(setup: str, seconds: int, parent: Path | None) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="svc-log-stalls-", dir=parent) as scratch:
        directory = Path(scratch)
        path = directory / "log.sqlite3"
        if setup == "relay":
            latencies, checkpoints = asyncio.run(_appends(path, seconds))
        elif setup == "no checkpoints":
            with _checkpoints_off():
                latencies, checkpoints = asyncio.run(_appends(path, seconds))
        else:
            with _checkpoints_off(), _writeback(directory):
                latencies, checkpoints = asyncio.run(_appends(path, seconds))
    latencies.sort()
    n = len(latencies)
    return {
        "appends": n,
        "rate": n / seconds,
        "p50": latencies[n // 2] * 1e6,
        "p99": latencies[int(n * 0.99)] * 1e6,
        "p99.9": latencies[int(n * 0.999)] * 1e6,
        "max": latencies[-1] * 1e6,
        "slow": sum(1 for x in latencies if x > SLOW_SECONDS),
        "checkpoints": checkpoints,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--seconds", type=whole_number(1, 600), default=4, help="per setup and round"
    )
    parser.add_argument("--rounds", type=whole_number(1), default=3)
    parser.add_argument(
        "--dir", type=Path, default=None, help="where the logs go (default: the temp dir)"
    )
    args = parser.parse_args()
    if args.dir is not None and not args.dir.is_dir():
        parser.error(f"--dir: {args.dir} is not a directory")
    runs: dict[str, list[dict[str, float]]] = {setup: [] for setup in SETUPS}
    for _ in range(args.rounds):
        for setup in SETUPS:  # in turn, so a noisy minute falls on all three
            runs[setup].append(_round(setup, args.seconds, args.dir))
    rows = (
        ("appends", "appends", "{:,.0f}"),
        ("appends per second", "rate", "{:,.0f}"),
        ("append p50, µs", "p50", "{:,.0f}"),
        ("append p99, µs", "p99", "{:,.0f}"),
        ("append p99.9, µs", "p99.9", "{:,.0f}"),
        ("append max, µs", "max", "{:,.0f}"),
        (f"appends over {SLOW_SECONDS * 1e6:.0f} µs", "slow", "{:,.0f}"),
        ("checkpoints", "checkpoints", "{:,.0f}"),
    )
    where = args.dir or Path(tempfile.gettempdir())
    print(
        f"The relay log's appends, one 300 B message at a time, {PACE_SECONDS * 1e3:.1f} ms "
        f"apart, {args.seconds} s per setup, in {where}; median of {args.rounds} rounds\n"
    )
    print("| measure | " + " | ".join(SETUPS) + " |")
    print("|---|" + "---:|" * len(SETUPS))
    for label, key, fmt in rows:
        cells = [fmt.format(statistics.median(r[key] for r in runs[s])) for s in SETUPS]
        print(f"| {label} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
