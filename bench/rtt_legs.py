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
"""

from __future__ import annotations

import argparse
import bisect
import statistics
import tempfile
import time
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
        for payload in chan.messages(timeout=60):
            got.append(time.perf_counter())
            if payload == b"X":
                break
            chan.send(b"p" + payload[1:])
            sent.append(time.perf_counter())
        conn.send((got, sent, frames))
        client.close()


def sender(stack: dict[str, str], channel: str, pings: int, conn: Any) -> None:
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
        for i in range(pings):
            ping = b"P%08d" % i
            ping += b"x" * (PING - len(ping))
            start.append(time.perf_counter())
            chan.send(ping)
            returned.append(time.perf_counter())
            reply = next(replies)
            answered.append(time.perf_counter())
            assert reply[1:] == ping[1:], "reply does not match its ping"
        chan.send(b"X")
        chan.wait_stored(30)
        conn.send((start, returned, answered, frames))
        client.close()


def _before(marks: list[float], t: float) -> float:
    """The last mark at or before ``t``."""
    return marks[bisect.bisect_right(marks, t) - 1]


LEGS = ("send", "hop out", "receive", "reply send", "hop back", "receive back", "round trip")


def legs(sender_marks: Any, receiver_marks: Any, warm_up: int) -> list[tuple[int, list[float]]]:
    """(ping number, the legs in ms) of each ping after the warm-up."""
    start, returned, answered, s_frames = sender_marks
    got, sent, r_frames = receiver_marks
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

    sender_marks, receiver_marks = agent_pair("bench/legs", receiver, sender, args.pings)

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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
