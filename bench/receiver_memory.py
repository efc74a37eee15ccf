"""Where a receiver's peak memory goes while it takes large messages as fast as they come.

    python bench/receiver_memory.py [--runs 3] [--messages 10000] [--size 16384]

A diagnostic beside bench/e2e.py (same stack: a fresh ``svc up`` on free loopback
ports, sender and receiver each in its own process). The sender calls ``send()`` for
every message; the receiver iterates ``messages()`` and samples itself every 20 ms: its
RSS, its unprocessed deliveries (``Channel._raw``, still encrypted), its inbox, and
glibc's own count of the heap (``mallinfo2``: bytes in use and bytes free but kept). At
the sample with the highest RSS it reports all of them, so a peak splits into what the
receiver holds and what the allocator holds for it (beside the kernel's high-water mark,
VmHWM, which a sample can miss by up to 20 ms). It reads private fields of the
client, so it measures this version of svc only.
"""

from __future__ import annotations

import ctypes
import functools
import tempfile
import threading
import time
from typing import Any

# bench/e2e.py: the same two agents. Like e2e.py, this module is imported by each agent
# process, so what only the parent uses is imported in main().
from e2e import _status_mib, _vmhwm_mib, agent_pair

from svc_sdk._checks import MAX_PAYLOAD

MIB = 1024 * 1024


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


@functools.cache
def _mallinfo2() -> Any:
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    return libc.mallinfo2


def _heap() -> tuple[float, float]:
    """glibc's heap: MiB in use (mmapped chunks included) and MiB free but kept."""
    info = _mallinfo2()()
    return (info.uordblks + info.hblkhd) / MIB, info.fordblks / MIB


def _rss_mib() -> float:
    return _status_mib("self", "VmRSS") or 0.0


def receiver(stack: dict[str, str], channel: str, conn: Any) -> None:
    from svc_sdk import SvcClient

    with tempfile.TemporaryDirectory() as root:
        client = SvcClient(stack["relay"], root, b"receiver", stack["key"], stack["api"])
        conn.send(client.generate_key_package())
        welcome, expected = conn.recv()  # the sender says how many to expect
        chan = client.join_channel(channel, welcome)
        conn.send("ready")
        samples: list[tuple[float, float, float, float, float]] = []
        done = threading.Event()

        def take_sample() -> None:
            used, free = _heap()
            # Read without the channel's lock: a sample may be a frame out of date.
            samples.append(
                (_rss_mib(), chan._raw_bytes / MIB, chan._inbox._bytes / MIB, used, free)
            )

        def sample() -> None:
            while not done.wait(0.02):
                take_sample()

        start = (_rss_mib(), *_heap())
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        count = 0
        for count, _ in enumerate(chan.messages(timeout=120), 1):
            if count == expected:
                break
        done.set()
        sampler.join()
        take_sample()  # a run shorter than one interval still has one
        if count != expected:
            raise RuntimeError(f"received {count} of {expected} messages within 120 s")
        chan.send(b"done")
        client.close()
    peak = max(samples)
    conn.send({"start": start, "peak": peak, "hwm": _vmhwm_mib("self")})


def sender(stack: dict[str, str], channel: str, plan: tuple[int, int], conn: Any) -> None:
    from svc_sdk import SvcClient

    messages, size = plan
    with tempfile.TemporaryDirectory() as root:
        client = SvcClient(stack["relay"], root, b"sender", stack["key"], stack["api"])
        chan = client.create_channel(channel)
        conn.send((chan.add_member(conn.recv()), messages))
        assert conn.recv() == "go"
        payload = b"T" * size
        began = time.perf_counter()
        for _ in range(messages):
            chan.send(payload)
        next(iter(chan.messages(timeout=120)))  # the receiver's "done"
        seconds = time.perf_counter() - began
        client.close()
    conn.send({"msgs_per_s": messages / seconds, "hwm": _vmhwm_mib("self")})


def main() -> None:
    import argparse
    import statistics

    from svc_sdk._argtypes import whole_number

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=whole_number(1), default=3)
    parser.add_argument("--messages", type=whole_number(1), default=10_000)
    parser.add_argument("--size", type=whole_number(1, MAX_PAYLOAD), default=16 * 1024)
    args = parser.parse_args()
    rows = []
    for run in range(1, args.runs + 1):
        sent, got = agent_pair("bench/memory", receiver, sender, (args.messages, args.size))
        rss, backlog, inbox, used, free = got["peak"]
        row = (sent["msgs_per_s"], got["start"][0], got["hwm"], rss, backlog, inbox, used, free)
        rows.append(row)
        print(f"run {run}: " + ", ".join(f"{v:,.1f}" for v in row), flush=True)
    names = (
        "msg/s",
        "receiver RSS before, MiB",
        "receiver peak RSS (VmHWM), MiB",
        "receiver RSS at the highest sample, MiB",
        "at that sample: unprocessed deliveries, MiB",
        "at that sample: inbox, MiB",
        "at that sample: malloc in use, MiB",
        "at that sample: malloc free but kept, MiB",
    )
    print(f"\n{args.messages:,} messages of {args.size:,} B, one send() each; {args.runs} runs\n")
    print("| measure | median | runs |\n|---|---:|---|")
    for i, name in enumerate(names):
        values = [row[i] for row in rows]
        each = ", ".join(f"{v:,.1f}" for v in values)
        print(f"| {name} | {statistics.median(values):,.1f} | {each} |")


if __name__ == "__main__":
    main()
