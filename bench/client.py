"""End-to-end client benchmark through a real local stack (``svc up`` in its own process):
encrypt → relay (stored durably) → fan-out → decrypt, with every agent in its own
process so no two share a GIL.

    python bench/client.py [--messages 20000] [--rounds 3] [--round-trips 500]
                           [--state-cipher off|on|both]

``--state-cipher on`` gives every agent an encrypted data_dir (SQLCipher, a random state
key); ``both`` runs every path without and with it, interleaved in each round, so the
cost of encryption at rest is measured on the same machine in the same sitting.

Prints one markdown table. Beside each throughput figure are two bounds measured in the
same run, engine only, with the relay out of the picture: the receiver's (batched
decryption of the same payload size in a receiving process) and the sender's (batched
encryption into the durable outbox, rows written with the ratchet state and deleted as
acknowledged, what ``send_batch`` does before a frame leaves). Every figure is the
median of ``--rounds`` rounds.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from svc_sdk import SvcClient
from svc_sdk._argtypes import whole_number
from svc_sdk.mls import Engine
from svc_sdk.testing import LocalIssuer, LocalStack

BATCH = 256  # messages per send_batch call


def decrypt_bound(size: int, n: int = 4000) -> float:
    """Messages/s one process decrypts with process_batch (engine only)."""
    with tempfile.TemporaryDirectory() as root:
        issuer = LocalIssuer()  # engine only: no relay checks these credentials
        a = issuer.certify(Engine(Path(root) / "a", b"a"))
        b = issuer.certify(Engine(Path(root) / "b", b"b"))
        group = a.create_group(b"bench/decrypt/bound")
        pending = group.add_members([b.generate_key_package()])
        group.apply_pending_commit()
        assert pending.welcome is not None
        other = b.join_group(pending.welcome)
        payload = b"x" * size
        cts = group.encrypt_batch([payload] * n)
        start = time.perf_counter()
        for i in range(0, n, BATCH):
            other.process_batch(cts[i : i + BATCH])
        return n / (time.perf_counter() - start)


def encrypt_bound(size: int, n: int = 4000) -> float:
    """Messages/s one process encrypts into the durable outbox (engine only)."""
    with tempfile.TemporaryDirectory() as root:
        issuer = LocalIssuer()
        a = issuer.certify(Engine(Path(root) / "a", b"a"))
        b = issuer.certify(Engine(Path(root) / "b", b"b"))
        group = a.create_group(b"bench/encrypt/bound")
        group.add_members([b.generate_key_package()])
        group.apply_pending_commit()
        payload = b"x" * size
        start = time.perf_counter()
        for i in range(0, n, BATCH):
            group.encrypt_queued(
                [(i + j + 1, (i + j + 1).to_bytes(16, "big"), payload) for j in range(BATCH)]
            )
            group.retire_outbox(i + BATCH)
        return n / (time.perf_counter() - start)


def client_in(stack: dict[str, str], root: str, name: bytes) -> SvcClient:
    """An agent on the stack; with an encrypted data_dir when the run says so."""
    key = stack.get("state_key") or None
    return SvcClient(stack["relay"], root, name, stack["key"], stack["api"], state_key=key)


def receiver(stack: dict[str, str], name: str, channel: str, n: int, size: int, conn: Any) -> None:
    """Joins with a Welcome from the parent, reports when ready, counts ``n`` messages."""
    with tempfile.TemporaryDirectory() as root:
        client = client_in(stack, root, name.encode())
        conn.send(client.generate_key_package())
        chan = client.join_channel(channel, conn.recv())
        bound = decrypt_bound(size)
        conn.send(("ready", bound))
        count = 0
        while count < n:
            batch = chan.next_messages(60)  # block for one, take all that is there
            assert batch, "receiver timed out"
            count += len(batch)
        conn.send(("done", time.perf_counter()))
        client.close()


def echo(stack: dict[str, str], channel: str, rounds: int, conn: Any) -> None:
    with tempfile.TemporaryDirectory() as root:
        client = client_in(stack, root, b"echo")
        conn.send(client.generate_key_package())
        chan = client.join_channel(channel, conn.recv())
        conn.send("ready")
        for _ in range(rounds):
            message = chan.next_message(30)
            assert message is not None
            chan.send(message.data)
        client.close()


def fan_out(stack: dict[str, str], receivers: int, n: int, size: int, tag: str) -> dict[str, float]:
    ctx = mp.get_context("spawn")
    channel = f"bench/client/{tag}-{time.monotonic_ns()}"
    with tempfile.TemporaryDirectory() as root:
        sender = client_in(stack, root, b"sender")
        chan = sender.create_channel(channel)
        pipes, procs = [], []
        for r in range(receivers):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=receiver, args=(stack, f"r{r}", channel, n, size, child))
            proc.start()
            chan_welcome = chan.add_member(parent.recv())
            parent.send(chan_welcome)
            pipes.append(parent)
            procs.append(proc)
        bounds = [p.recv()[1] for p in pipes]
        sender_bound = encrypt_bound(size)
        payload = b"x" * size
        start = time.perf_counter()
        for i in range(0, n, BATCH):
            chan.send_batch([payload] * min(BATCH, n - i))
        ends = [p.recv()[1] for p in pipes]
        for proc in procs:
            proc.join(30)
        sender.close()
    elapsed = max(ends) - start
    return {
        "msgs": n / elapsed,
        "deliveries": n * receivers / elapsed,
        "bound": statistics.median(bounds),
        "sender_bound": sender_bound,
    }


def round_trips(stack: dict[str, str], rounds: int) -> tuple[float, float, float]:
    """p50/p99 (ms) of send → echo → receive at low load, and single send() calls/s."""
    ctx = mp.get_context("spawn")
    channel = f"bench/client/rtt-{time.monotonic_ns()}"
    with tempfile.TemporaryDirectory() as root:
        client = client_in(stack, root, b"pinger")
        chan = client.create_channel(channel)
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=echo, args=(stack, channel, rounds + 500, child))
        proc.start()
        parent.send(chan.add_member(parent.recv()))
        assert parent.recv() == "ready"
        samples = []
        for i in range(rounds):
            start = time.perf_counter()
            chan.send(f"ping {i}".encode())
            message = chan.next_message(30)
            assert message is not None
            samples.append((time.perf_counter() - start) * 1000)
        # Unbatched send(): one durable acknowledgement per call.
        start = time.perf_counter()
        for _ in range(500):
            chan.send(b"x" * 256)
        sends = 500 / (time.perf_counter() - start)
        proc.join(30)
        client.close()
    samples.sort()
    return samples[len(samples) // 2], samples[int(len(samples) * 0.99)], sends


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=whole_number(1), default=20000)
    parser.add_argument("--rounds", type=whole_number(1), default=3)
    parser.add_argument(
        "--round-trips", type=whole_number(1), default=500, help="samples per round"
    )
    parser.add_argument(
        "--state-cipher",
        choices=("off", "on", "both"),
        default="off",
        help="agents' data_dirs encrypted at rest: off, on, or both interleaved",
    )
    args = parser.parse_args()
    modes = {"off": [False], "on": [True], "both": [False, True]}[args.state_cipher]
    with LocalStack() as running:
        plain = {"relay": running.relay_url, "api": running.api_url, "key": running.api_key}
        stacks = {False: plain, True: {**plain, "state_key": secrets.token_hex(32)}}
        rows: dict[str, list[dict[str, float]]] = {}
        rtt_rows: dict[str, list[tuple[float, float, float]]] = {}
        for _ in range(args.rounds):
            for encrypted in modes:
                stack, suffix = stacks[encrypted], " (encrypted state)" if encrypted else ""
                for tag, receivers, size, n in (
                    ("1→1 256 B", 1, 256, args.messages),
                    ("1→1 16 KiB", 1, 16384, args.messages // 4),
                    ("1→10 256 B", 10, 256, args.messages // 10),
                ):
                    rows.setdefault(tag + suffix, []).append(
                        fan_out(stack, receivers, n, size, f"r{receivers}-s{size}")
                    )
                rtt_rows.setdefault("256 B, one at a time" + suffix, []).append(
                    round_trips(stack, args.round_trips)
                )
            print(".", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    print(
        "| path | msg/s (per receiver) | deliveries/s (all receivers) "
        "| receiver decrypt bound (msg/s) | msg/s ÷ decrypt bound "
        "| sender outbox bound (msg/s) | msg/s ÷ lower bound |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for tag, results in rows.items():
        msgs = statistics.median(r["msgs"] for r in results)
        deliveries = statistics.median(r["deliveries"] for r in results)
        bound = statistics.median(r["bound"] for r in results)
        sender = statistics.median(r["sender_bound"] for r in results)
        share = msgs / bound  # each receiver against what one receiver can decrypt
        lower = msgs / min(bound, sender)
        print(
            f"| {tag} | {msgs:,.0f} | {deliveries:,.0f} | {bound:,.0f} | {share:.0%} "
            f"| {sender:,.0f} | {lower:.0%} |"
        )
    print()
    print("| round trip (send → echo → receive) | p50 ms | p99 ms | send() calls/s |")
    print("|---|---:|---:|---:|")
    for tag, rtts in rtt_rows.items():
        p50 = statistics.median(r[0] for r in rtts)
        p99 = statistics.median(r[1] for r in rtts)
        sends = statistics.median(r[2] for r in rtts)
        print(f"| {tag} | {p50:.2f} | {p99:.2f} | {sends:,.0f} |")
    print()
    for tag, rtts in rtt_rows.items():
        print(f"round trips {tag}: {args.rounds} rounds of {args.round_trips}; p50 per round (ms):")
        print(", ".join(f"{r[0]:.2f}" for r in rtts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
