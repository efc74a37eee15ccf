"""MLS engine benchmark: per-operation cost beside the raw signature bound.

    python bench/engine.py [--rounds 5] [--messages 400] [--sizes 10,100,1000]

Prints one markdown table. The bound (aws-lc sign/verify for the engine's cipher suite)
is measured in the same run by bench/crypto_providers, so the ratios compare like with
like on a noisy machine. Every figure is the median of ``--rounds`` rounds.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from svc_sdk.mls import Engine, Group
from svc_sdk.testing import LocalIssuer

ROOT = Path(__file__).resolve().parent.parent
SUITE_NAMES = {1: "X25519/Ed25519 (suite 1)", 2: "P-256 (suite 2)"}


def primitive_bound(suite: int) -> dict[str, float]:
    """Raw aws-lc rates (ops/s) for ``suite``, from the Rust primitive benchmark."""
    subprocess.run(
        ["cargo", "build", "--release", "-q", "-p", "svc-crypto-bench"], cwd=ROOT, check=True
    )
    out = subprocess.run(
        [str(ROOT / "target/release/svc-crypto-bench"), "--json", "awslc", str(suite)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    rates: dict[str, float] = json.loads(out)
    return rates


def median_us(rounds: int, per_round: int, fn: Callable[[], object]) -> float:
    """Median over rounds of the mean time per call, in microseconds."""
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(per_round):
            fn()
        samples.append((time.perf_counter() - start) / per_round * 1e6)
    return statistics.median(samples)


class Bench:
    def __init__(self, root: Path, rounds: int, messages: int, suite: int | None) -> None:
        self.root = root
        self.suite = suite
        self.rounds = rounds
        self.messages = messages
        self.count = 0
        # Credentials signed here: the engine alone is measured, not the account API.
        self.issuer = LocalIssuer()

    def engine(self, name: str) -> Engine:
        self.count += 1
        ident = f"{name}-{self.count}"
        return self.issuer.certify(Engine(self.root / ident, ident.encode(), self.suite))

    def pair(self) -> tuple[Group, Group]:
        alice, bob = self.engine("alice"), self.engine("bob")
        group = alice.create_group(f"bench/pair/{self.count}".encode())
        pending = group.add_members([bob.generate_key_package()])
        group.apply_pending_commit()
        assert pending.welcome is not None
        return group, bob.join_group(pending.welcome)

    def messaging(self, size: int, batch: int) -> tuple[float, float]:
        """(encrypt µs, decrypt µs) per message of ``size`` bytes, ``batch`` per call."""
        sender, receiver = self.pair()
        payload = b"\x5a" * size
        enc, dec = [], []
        for _ in range(self.rounds):
            start = time.perf_counter()
            if batch == 1:
                cts = [sender.encrypt(payload) for _ in range(self.messages)]
            else:
                cts = []
                for _ in range(self.messages // batch):
                    cts.extend(sender.encrypt_batch([payload] * batch))
            enc.append((time.perf_counter() - start) / len(cts) * 1e6)
            start = time.perf_counter()
            if batch == 1:
                for ct in cts:
                    receiver.process(ct)
            else:
                for i in range(0, len(cts), batch):
                    receiver.process_batch(cts[i : i + batch])
            dec.append((time.perf_counter() - start) / len(cts) * 1e6)
        return statistics.median(enc), statistics.median(dec)

    def one_at_a_time(self, size: int) -> tuple[float, float]:
        """(send µs, receive µs) for one 256 B message per call in a group of ``size``:
        the sender's ``encrypt_queued`` (its state and the outbox row in one
        transaction) and a member's ``process`` (its state written) — what a channel's
        size adds to every message an agent sends or reads one at a time."""
        sender = self.engine("sender")
        group = sender.create_group(f"bench/one/{size}/{self.count}".encode())
        member = self.engine("member")
        key_packages = [member.generate_key_package()]
        key_packages += [self.engine("m").generate_key_package() for _ in range(size - 2)]
        pending = group.add_members(key_packages)
        group.apply_pending_commit()
        assert pending.welcome is not None
        receiver = member.join_group(pending.welcome)
        payload = b"\x5a" * 256
        send, receive, pos = [], [], 0
        for _ in range(self.rounds):
            cts = []
            start = time.perf_counter()
            for _ in range(self.messages):
                pos += 1
                cts += group.encrypt_queued([(pos, pos.to_bytes(16, "big"), payload)])[1]
            send.append((time.perf_counter() - start) / len(cts) * 1e6)
            group.retire_outbox(pos)
            start = time.perf_counter()
            for ct in cts:
                receiver.process(ct)
            receive.append((time.perf_counter() - start) / len(cts) * 1e6)
        return statistics.median(send), statistics.median(receive)

    def membership(self, size: int) -> tuple[float, float, int]:
        """(add-member commit µs, join-from-Welcome µs, Welcome bytes) at group ``size``."""
        creator = self.engine("creator")
        group = creator.create_group(f"bench/size/{size}".encode())
        key_packages = [self.engine("m").generate_key_package() for _ in range(size - 1)]
        group.add_members(key_packages)
        group.apply_pending_commit()
        commit_us, join_us, welcome_len = [], [], 0
        for _ in range(self.rounds):
            joiner = self.engine("joiner")
            key_package = joiner.generate_key_package()
            start = time.perf_counter()
            pending = group.add_members([key_package])
            group.apply_pending_commit()
            commit_us.append((time.perf_counter() - start) * 1e6)
            assert pending.welcome is not None
            welcome_len = len(pending.welcome)
            start = time.perf_counter()
            joiner.join_group(pending.welcome)
            join_us.append((time.perf_counter() - start) * 1e6)
        return statistics.median(commit_us), statistics.median(join_us), welcome_len


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--messages", type=int, default=512)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--sizes", default="10,100,1000")
    parser.add_argument("--suite", type=int, default=None, help="cipher suite (default: engine's)")
    args = parser.parse_args(argv)

    root = Path(tempfile.mkdtemp(prefix="svc-bench-"))
    try:
        bench = Bench(root, args.rounds, args.messages, args.suite)
        suite = bench.engine("probe").cipher_suite
        bound = primitive_bound(suite)
        sign_us, verify_us = 1e6 / bound["sign"], 1e6 / bound["verify"]
        # Signatures hash the whole message, so large payloads get a size-matched bound.
        sign_bound = {256: sign_us, 16 * 1024: 1e6 / bound["sign_16k"]}
        verify_bound = {256: verify_us, 16 * 1024: 1e6 / bound["verify_16k"]}
        print(
            f"MLS engine, cipher suite {SUITE_NAMES.get(suite, str(suite))}, aws-lc;"
            f" median of {args.rounds} rounds"
        )
        print(
            f"bound measured in this run (aws-lc, 256 B): sign {sign_us:.1f} µs,"
            f" verify {verify_us:.1f} µs\n"
        )
        print("| operation | µs per op | bound (µs) | ratio to bound |")
        print("|---|---:|---:|---:|")

        def line(name: str, value: float, bound_us: float | None) -> None:
            if bound_us is None:
                print(f"| {name} | {value:,.1f} | | |")
            else:
                print(f"| {name} | {value:,.1f} | {bound_us:.1f} | {value / bound_us:.2f}x |")

        for size, label in ((256, "256 B"), (16 * 1024, "16 KiB")):
            for batch in (1, args.batch):
                enc, dec = bench.messaging(size, batch)
                how = "one call per message" if batch == 1 else f"batches of {batch}"
                line(f"encrypt {label} ({how})", enc, sign_bound[size])
                line(f"decrypt {label} ({how})", dec, verify_bound[size])
        kp_engine = bench.engine("kp")
        line(
            "key package generation",
            median_us(args.rounds, 100, kp_engine.generate_key_package),
            2 * sign_us + 2 * 1e6 / bound["kem_generate"],
        )
        # One message per call: the bound is the same call in a group of two.
        pair_send, pair_receive = bench.one_at_a_time(2)
        for size in [2, *(int(s) for s in args.sizes.split(","))]:
            send_us, receive_us = (
                (pair_send, pair_receive) if size == 2 else bench.one_at_a_time(size)
            )
            line(
                f"send 256 B, one per call (state and outbox row), group of {size}",
                send_us,
                pair_send,
            )
            line(
                f"receive 256 B, one per call (state written), group of {size}",
                receive_us,
                pair_receive,
            )
        for size in (int(s) for s in args.sizes.split(",")):
            commit_us, join_us, welcome_len = bench.membership(size)
            line(f"add-member commit + apply, group of {size}", commit_us, None)
            line(f"join from Welcome ({welcome_len:,} B), group of {size}", join_us, None)
        print(
            "\nBounds, measured above: encrypt = one sign, decrypt = one verify, each over a"
            " message of the same size; key package = two signs (leaf node, package) and two"
            " HPKE key generations (leaf and init keys); a send or receive in a group = the"
            " same call in a group of two."
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
