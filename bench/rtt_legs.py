"""Where a round trip's time goes: the legs of bench/e2e.py's ping, timed in both agents.

    python bench/rtt_legs.py [--pings 1500] [--warm-up 20] [--slowest 8]

A diagnostic beside bench/e2e.py (same stack: a fresh ``svc up`` on free loopback
ports, sender and receiver each in its own process, 256 B pings answered through the
same channel). Both agents record ``time.perf_counter()`` — CLOCK_MONOTONIC, shared by
processes on one machine — at each step, so a round trip splits into:

- **send**: the sender's ``send()`` call;
- **hop out / hop back**: from ``send()`` returning to the other agent's client seeing
  the delivery frame (the native stream both ways and the relay between);
- **receive**: from that frame to the application getting the payload (the hand-off to
  the reading thread, decryption, the state write);
- **reply send**: the receiver's ``send()`` of the answer.

It times private hooks of the client (``RelayLink._on_frame``), so it measures this
version of svc only. The slowest round trips are printed leg by leg: a periodic stall
shows up as evenly spaced ping numbers.

Then the CPU each thread spent per round trip over the same pings (after the warm-up):
the two agents' threads by their Python names (``svc-outbox-<channel>`` is a channel's
outbox pump, ``svc-io`` the relay link's loop) and their native ones by the kernel's,
and the threads of ``svc up``'s process (the relay) by the kernel's names. Read from
``/proc/<pid>/task/<tid>/schedstat`` (nanoseconds, not clock ticks); a thread that ends
during the pings is missed.
"""

from __future__ import annotations

import argparse
import bisect
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from e2e import agent_pair  # bench/e2e.py: the same two agents through a fresh svc up

from svc_sdk._argtypes import whole_number

PING = 256


def _mark_frames(marks: list[float]) -> None:
    """Records the time of every frame the relay link hands to the client."""
    from svc_sdk import relay_link

    original = relay_link.RelayLink._on_frame

    def on_frame(self: relay_link.RelayLink, frame: Any) -> None:
        marks.append(time.perf_counter())
        original(self, frame)

    relay_link.RelayLink._on_frame = on_frame  # type: ignore[method-assign]


def thread_cpu(pid: int | None = None) -> dict[str, int]:
    """CPU time in ns of each thread of process ``pid`` (this one by default), keyed
    ``"<tid> <name>"``: this process's Python threads by their Python name."""
    python_names = {} if pid else {str(t.native_id): t.name for t in threading.enumerate()}
    tasks = Path(f"/proc/{pid or os.getpid()}/task")
    spent = {}
    for task in tasks.iterdir():
        try:
            name = (task / "comm").read_text().strip()
            ns = int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError):
            continue  # the thread ended
        spent[f"{task.name} {python_names.get(task.name, name)}"] = ns
    return spent


def cpu_by_thread(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """ns spent between two ``thread_cpu`` readings, summed by thread name (a channel's
    name dropped from its pump's)."""
    spent: dict[str, int] = {}
    for key, ns in after.items():
        name = key.split(" ", 1)[1]
        if name.startswith("svc-outbox-"):
            name = "svc-outbox (pump)"
        spent[name] = spent.get(name, 0) + ns - before.get(key, 0)
    return spent


def receiver(stack: dict[str, str], channel: str, conn: Any) -> None:
    from svc_sdk import SvcClient

    frames: list[float] = []
    _mark_frames(frames)
    with tempfile.TemporaryDirectory() as root:
        client = SvcClient(stack["relay"], root, b"receiver", stack["key"], stack["api"])
        conn.send(client.generate_key_package())
        chan = client.join_channel(channel, conn.recv())
        conn.send("ready")
        got: list[float] = []
        sent: list[float] = []
        cpu: dict[str, int] = {}
        for payload in chan.messages(timeout=60):
            got.append(time.perf_counter())
            if payload == b"X":
                break
            if payload[:1] == b"P" and not cpu:  # the first ping after the warm-up
                cpu = thread_cpu()
            chan.send(b"p" + payload[1:])
            sent.append(time.perf_counter())
        conn.send((got, sent, frames, cpu_by_thread(cpu, thread_cpu())))
        client.close()


def sender(stack: dict[str, str], channel: str, plan: tuple[int, int], conn: Any) -> None:
    from svc_sdk import SvcClient

    frames: list[float] = []
    _mark_frames(frames)
    with tempfile.TemporaryDirectory() as root:
        client = SvcClient(stack["relay"], root, b"sender", stack["key"], stack["api"])
        chan = client.create_channel(channel)
        conn.send(chan.add_member(conn.recv()))
        assert conn.recv() == "go"
        replies = chan.messages(timeout=60)
        start: list[float] = []
        returned: list[float] = []
        answered: list[float] = []
        pings, warm_up = plan
        relay = int(stack["pid"])
        cpu: dict[str, int] = {}
        relay_cpu: dict[str, int] = {}
        for i in range(pings):
            if i == warm_up:
                cpu, relay_cpu = thread_cpu(), thread_cpu(relay)
            ping = (b"W%08d" if i < warm_up else b"P%08d") % i
            ping += b"x" * (PING - len(ping))
            start.append(time.perf_counter())
            chan.send(ping)
            returned.append(time.perf_counter())
            reply = next(replies)
            answered.append(time.perf_counter())
            assert reply[1:] == ping[1:], "reply does not match its ping"
        spent = cpu_by_thread(cpu, thread_cpu())
        relay_spent = cpu_by_thread(relay_cpu, thread_cpu(relay))
        chan.send(b"X")
        chan.wait_stored(30)
        conn.send((start, returned, answered, frames, spent, relay_spent))
        client.close()


def _before(marks: list[float], t: float) -> float:
    """The last mark at or before ``t``."""
    return marks[bisect.bisect_right(marks, t) - 1]


LEGS = ("send", "hop out", "receive", "reply send", "hop back", "receive back", "round trip")


def legs(sender_marks: Any, receiver_marks: Any, warm_up: int) -> list[tuple[int, list[float]]]:
    """(ping number, the legs in ms) of each ping after the warm-up."""
    start, returned, answered, s_frames = sender_marks[:4]
    got, sent, r_frames = receiver_marks[:3]
    rows = []
    for i in range(warm_up, len(start)):
        arrived = _before(r_frames, got[i])
        back = _before(s_frames, answered[i])
        times = [
            returned[i] - start[i],
            arrived - returned[i],
            got[i] - arrived,
            sent[i] - got[i],
            back - sent[i],
            answered[i] - back,
            answered[i] - start[i],
        ]
        rows.append((i, [t * 1000 for t in times]))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--pings", type=whole_number(1), default=1500)
    parser.add_argument("--warm-up", type=whole_number(0), default=20)
    parser.add_argument("--slowest", type=whole_number(0), default=8)
    args = parser.parse_args()
    if args.pings <= args.warm_up:
        parser.error("--pings must be more than --warm-up")

    sender_marks, receiver_marks = agent_pair(
        "bench/legs", receiver, sender, (args.pings, args.warm_up)
    )

    rows = legs(sender_marks, receiver_marks, args.warm_up)
    print(f"Round trips of {PING} B, {len(rows)} after {args.warm_up} warm-up; ms\n")
    print("| leg | p50 | p90 | p99 |\n|---|---:|---:|---:|")
    for n, name in enumerate(LEGS):
        values = sorted(times[n] for _, times in rows)
        p90, p99 = (values[min(len(values) - 1, int(len(values) * q))] for q in (0.9, 0.99))
        print(f"| {name} | {statistics.median(values):.2f} | {p90:.2f} | {p99:.2f} |")
    if args.slowest:
        print(f"\nThe {args.slowest} slowest round trips, leg by leg (ms):\n")
        print("| ping | " + " | ".join(LEGS) + " |\n|---:|" + "---:|" * len(LEGS))
        for i, times in sorted(rows, key=lambda row: -row[1][-1])[: args.slowest]:
            print(f"| {i} | " + " | ".join(f"{t:.2f}" for t in times) + " |")
    print(f"\nCPU per round trip by thread, over the same {len(rows)} round trips (µs):\n")
    print("| process | thread | µs per round trip |\n|---|---|---:|")
    for process, spent in (
        ("sender", sender_marks[4]),
        ("receiver", receiver_marks[3]),
        ("svc up (relay)", sender_marks[5]),
    ):
        for name, ns in sorted(spent.items(), key=lambda item: -item[1]):
            if ns:
                print(f"| {process} | {name} | {ns / len(rows) / 1000:.0f} |")
        print(f"| {process} | **all** | {sum(spent.values()) / len(rows) / 1000:.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
