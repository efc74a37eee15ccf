"""Shared by the fuzz targets: the Hypothesis settings, and mutations of valid seeds.

Each target builds a small corpus of valid inputs once (real key packages, commits,
frames, request bodies) and fuzzes with mutations of them — bit flips, overwritten,
inserted and deleted bytes, truncation, extension and splices of two seeds — so that the
cases get past the first length or tag check and into the code behind it. Hypothesis
draws a seed and a number; the edits come from a PRNG seeded with that number, since
Hypothesis's own overhead (~1.3 ms an example here) is more than most targets' work —
the cheap targets run several cases per example (``batches``).

``SVC_FUZZ_EXAMPLES`` sets the cases per target (default 10,000, the CI figure).
Runs are derandomized, so CI sees the same cases every time and a failure reproduces;
``SVC_FUZZ_RANDOM=1`` draws new cases each run, for fuzzing longer by hand."""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

EXAMPLES = int(os.environ.get("SVC_FUZZ_EXAMPLES", "10000"))

FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    derandomize=not os.environ.get("SVC_FUZZ_RANDOM"),
    # No shrinking budget wasted on a passing run; explain needs tracing (slow).
    phases=[Phase.explicit, Phase.generate, Phase.shrink],
    suppress_health_check=list(HealthCheck),
    print_blob=True,
)


def mutate(data: bytearray, rng: random.Random, seeds: Sequence[bytes], max_ops: int) -> None:
    """1 to ``max_ops`` random edits of ``data``, in place."""
    for _ in range(rng.randint(1, max_ops)):
        op = rng.choice(OPS)
        at = rng.randrange(len(data)) if data else 0
        if op == "flip" and data:
            data[at] ^= 1 << rng.randrange(8)
        elif op == "set" and data:
            data[at] = rng.randrange(256)
        elif op == "interesting" and data:
            # Values that break length fields: 0, max, one past a boundary.
            width = rng.randint(1, 4)
            data[at : at + width] = bytes([rng.choice(INTERESTING)]) * width
        elif op == "insert":
            data[at:at] = rng.randbytes(rng.randint(1, 16))
        elif op == "delete" and data:
            del data[at : at + rng.randint(1, 16)]
        elif op == "truncate":
            del data[at:]
        elif op == "extend":
            data += rng.randbytes(rng.randint(1, 64))
        elif op == "splice":
            other = rng.choice(seeds)
            data[at:] = other[rng.randint(0, len(other)) :]


OPS = ["flip", "set", "interesting", "insert", "delete", "truncate", "extend", "splice"]
INTERESTING = [0x00, 0x01, 0x3F, 0x40, 0x7F, 0x80, 0xFE, 0xFF]


def mutations(seeds: Sequence[bytes], max_ops: int = 4) -> st.SearchStrategy[bytes]:
    """One seed, changed by 1 to ``max_ops`` edits; never any of the seeds.

    Hypothesis draws only which seed and a 64-bit number; the edits come from a PRNG
    seeded with it. Drawing each edit from Hypothesis took ~2.4 ms a case, more than
    most targets themselves; this takes a few µs and keeps runs reproducible (the
    failing case's bytes are in the assertion; Hypothesis replays the two draws)."""
    seeds = [bytes(s) for s in seeds]
    genuine = set(seeds)

    def build(choice: tuple[int, int]) -> bytes:
        index, number = choice
        rng = random.Random(number)
        data = bytearray(seeds[index])
        mutate(data, rng, seeds, max_ops)
        # Never a genuine input: a splice can rebuild another seed whole.
        while bytes(data) in genuine:
            data.append(0)
        return bytes(data)

    return st.tuples(st.integers(0, len(seeds) - 1), st.integers(0, 2**64 - 1)).map(build)


# Cases per Hypothesis example in the targets whose own work is cheaper than the ~1.3 ms
# Hypothesis spends on an example (measured on the 2-core CI machine).
BATCH = 8


def batches(
    seeds: Sequence[bytes], size: int = BATCH, max_ops: int = 4
) -> st.SearchStrategy[list[bytes]]:
    """``size`` mutated seeds from one draw (see ``mutations``)."""
    seeds = [bytes(s) for s in seeds]
    genuine = set(seeds)

    def many(number: int) -> list[bytes]:
        rng = random.Random(number)
        out = []
        for _ in range(size):
            data = bytearray(rng.choice(seeds))
            mutate(data, rng, seeds, max_ops)
            while bytes(data) in genuine:
                data.append(0)
            out.append(bytes(data))
        return out

    return st.integers(0, 2**64 - 1).map(many)


def settings_for(size: int) -> settings:
    """FUZZ, with as many examples as make EXAMPLES cases at ``size`` cases each."""
    return settings(FUZZ, max_examples=-(-EXAMPLES // size))


class Counter:
    """Counts the cases a target ran, so the test can show it ran them all."""

    def __init__(self, expected: int = EXAMPLES) -> None:
        self.expected = expected
        self.cases = 0
        self.started = time.monotonic()

    def __call__(self) -> None:
        self.cases += 1

    def check(self, what: str) -> None:
        elapsed = time.monotonic() - self.started
        print(f"fuzz {what}: {self.cases} cases in {elapsed:.1f} s")
        assert self.cases >= self.expected, f"{what}: {self.cases} of {self.expected} cases ran"


@contextmanager
def counted(what: str, expected: int = EXAMPLES) -> Iterator[Counter]:
    counter = Counter(expected)
    yield counter
    counter.check(what)
