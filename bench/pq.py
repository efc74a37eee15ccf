"""Post-quantum channels beside suite 1: sizes and times of the MLS engine, one run.

    python bench/pq.py [--rounds 5] [--sizes 10,100,1000] [--messages 512] [--batch 64]

Both suites are measured in the same process, one after the other, with the same agents'
kind (suite-1 data_dirs: the post-quantum suite, 65100 = ML-KEM-768+X25519 with Ed25519
signatures, is a channel option of those agents):

- key package: bytes, and generation time;
- for each group size N: the creator builds a group of N members by adding N-1 key
  packages in commits of at most ``--add-batch`` (default 100) each; then, ``--rounds``
  times, a new agent is added (commit + apply, the creator's cost) and joins from the
  Welcome (the joiner's cost, which validates the whole ratchet tree), and that agent is
  removed again (a commit whose update path is encrypted to the rest of the group);
  sizes of the add commit, the Welcome and the removal commit;
- application messages of 256 B between two members: encrypt and decrypt in batches of
  ``--batch``, as the client sends and receives.

Times are medians over the rounds (µs or ms as labelled); sizes are the last round's
(they vary by a few bytes only). Credentials come from an in-process issuer: the engine
alone is measured.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from svc_sdk.mls import PQ_CIPHER_SUITE, Engine, Group
from svc_sdk.testing import LocalIssuer

SUITES = {1: "1 (X25519)", PQ_CIPHER_SUITE: f"{PQ_CIPHER_SUITE} (ML-KEM-768+X25519)"}


def whole_number(low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, not {value}")
        return value

    return parse


def sizes(text: str) -> list[int]:
    try:
        values = [int(s) for s in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of whole numbers") from None
    if any(v < 2 for v in values):
        raise argparse.ArgumentTypeError("group sizes must be at least 2")
    return values


@dataclass
class Membership:
    build_s: float
    add_ms: float
    join_ms: float
    remove_ms: float
    add_commit: int
    welcome: int
    remove_commit: int


class Bench:
    def __init__(self, root: Path, rounds: int, add_batch: int) -> None:
        self.root = root
        self.rounds = rounds
        self.add_batch = add_batch
        self.count = 0
        self.issuer = LocalIssuer()

    def engine(self, name: str) -> Engine:
        self.count += 1
        ident = f"{name}-{self.count}"
        return self.issuer.certify(Engine(self.root / ident, ident.encode()))

    def key_package(self, suite: int) -> tuple[int, float]:
        """(bytes, µs to generate) of a key package for ``suite``."""
        engine = self.engine("kp")
        samples = []
        for _ in range(self.rounds):
            start = time.perf_counter()
            for _ in range(50):
                kp = engine.generate_key_package(suite)
            samples.append((time.perf_counter() - start) / 50 * 1e6)
        return len(kp), statistics.median(samples)

    def membership(self, suite: int, size: int) -> Membership:
        creator = self.engine("creator")
        group = creator.create_group(f"bench/pq/{suite}/{size}/{self.count}".encode(), suite)
        start = time.perf_counter()
        missing = size - 1
        while missing:
            batch = min(missing, self.add_batch)
            group.add_members([self.engine("m").generate_key_package(suite) for _ in range(batch)])
            group.apply_pending_commit()
            missing -= batch
        build_s = time.perf_counter() - start
        add, join, remove = [], [], []
        sizes = (0, 0, 0)
        for _ in range(self.rounds):
            joiner = self.engine("joiner")
            key_package = joiner.generate_key_package(suite)
            start = time.perf_counter()
            pending = group.add_members([key_package])
            group.apply_pending_commit()
            add.append((time.perf_counter() - start) * 1e3)
            assert pending.welcome is not None
            start = time.perf_counter()
            joined = joiner.join_group(pending.welcome)
            join.append((time.perf_counter() - start) * 1e3)
            assert joined.cipher_suite == suite
            start = time.perf_counter()
            removal = group.remove_members([_member_id(joiner)])
            group.apply_pending_commit()
            remove.append((time.perf_counter() - start) * 1e3)
            sizes = (len(pending.commit), len(pending.welcome), len(removal.commit))
        return Membership(
            build_s,
            statistics.median(add),
            statistics.median(join),
            statistics.median(remove),
            *sizes,
        )

    def throughput(self, suite: int, messages: int, batch: int) -> tuple[float, float]:
        """(encrypt, decrypt) messages/s of 256 B, ``batch`` per call."""
        alice, bob = self.engine("alice"), self.engine("bob")
        group = alice.create_group(f"bench/pq/pair/{suite}/{self.count}".encode(), suite)
        pending = group.add_members([bob.generate_key_package(suite)])
        group.apply_pending_commit()
        assert pending.welcome is not None
        receiver: Group = bob.join_group(pending.welcome)
        payload = b"\x5a" * 256
        enc, dec = [], []
        for _ in range(self.rounds):
            start = time.perf_counter()
            cts = []
            for _ in range(messages // batch):
                cts.extend(group.encrypt_batch([payload] * batch))
            enc.append(len(cts) / (time.perf_counter() - start))
            start = time.perf_counter()
            for i in range(0, len(cts), batch):
                receiver.process_batch(cts[i : i + batch])
            dec.append(len(cts) / (time.perf_counter() - start))
        return statistics.median(enc), statistics.median(dec)


def _member_id(engine: Engine) -> bytes:
    member_id = engine.member_id
    assert member_id is not None
    return member_id


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--rounds", type=whole_number(1), default=5)
    parser.add_argument("--sizes", type=sizes, default=[10, 100, 1000])
    parser.add_argument("--messages", type=whole_number(1), default=512)
    parser.add_argument("--batch", type=whole_number(1), default=64)
    parser.add_argument("--add-batch", type=whole_number(1), default=100)
    args = parser.parse_args(argv)

    root = Path(tempfile.mkdtemp(prefix="svc-bench-pq-"))
    try:
        bench = Bench(root, args.rounds, args.add_batch)
        suites = list(SUITES)
        rows: list[tuple[str, list[str]]] = []

        kps = {s: bench.key_package(s) for s in suites}
        rows.append(("key package (bytes)", [f"{kps[s][0]:,}" for s in suites]))
        rows.append(("key package generation (µs)", [f"{kps[s][1]:,.0f}" for s in suites]))
        for size in args.sizes:
            m = {s: bench.membership(s, size) for s in suites}
            rows += [
                (
                    f"N={size}: build, adds of ≤{args.add_batch} (s)",
                    [f"{m[s].build_s:,.2f}" for s in suites],
                ),
                (f"N={size}: add commit (bytes)", [f"{m[s].add_commit:,}" for s in suites]),
                (f"N={size}: Welcome (bytes)", [f"{m[s].welcome:,}" for s in suites]),
                (f"N={size}: removal commit (bytes)", [f"{m[s].remove_commit:,}" for s in suites]),
                (
                    f"N={size}: add one, commit + apply (ms)",
                    [f"{m[s].add_ms:,.1f}" for s in suites],
                ),
                (f"N={size}: join from Welcome (ms)", [f"{m[s].join_ms:,.1f}" for s in suites]),
                (
                    f"N={size}: remove one, commit + apply (ms)",
                    [f"{m[s].remove_ms:,.1f}" for s in suites],
                ),
            ]
        tput = {s: bench.throughput(s, args.messages, args.batch) for s in suites}
        rows.append(
            (
                f"encrypt 256 B, batches of {args.batch} (msg/s)",
                [f"{tput[s][0]:,.0f}" for s in suites],
            )
        )
        rows.append(
            (
                f"decrypt 256 B, batches of {args.batch} (msg/s)",
                [f"{tput[s][1]:,.0f}" for s in suites],
            )
        )

        print(
            "Post-quantum channels beside suite 1, MLS engine (aws-lc);"
            f" median of {args.rounds} rounds\n"
        )
        print("| | " + " | ".join(f"suite {SUITES[s]}" for s in suites) + " | ratio |")
        print("|---|" + "---:|" * (len(suites) + 1))
        for name, values in rows:
            ratio = _ratio(values)
            print(f"| {name} | " + " | ".join(values) + f" | {ratio} |")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


def _ratio(values: list[str]) -> str:
    try:
        a, b = (float(v.replace(",", "")) for v in values)
    except ValueError:
        return ""
    return f"{b / a:.2f}x" if a else ""


if __name__ == "__main__":
    sys.exit(main())
