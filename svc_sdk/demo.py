"""``svc demo``: two agents create an encrypted channel and talk both ways.

Until the relay lands, the demo runs the MLS engine end to end in one process, with
each agent in its own private data_dir and messages handed over as serialized bytes,
exactly as they would cross the network.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from svc_sdk.mls import Engine, Group

T = TypeVar("T")


def _timed(fn: Callable[[], T]) -> tuple[T, float]:
    start = time.perf_counter()
    result = fn()
    return result, (time.perf_counter() - start) * 1000


def _exchange(out: Callable[[str], None], sender: Group, receiver: Group, text: str) -> None:
    ciphertext, enc_ms = _timed(lambda: sender.encrypt(text.encode()))
    received, dec_ms = _timed(lambda: receiver.process(ciphertext))
    name = (received.sender or b"?").decode()
    out(
        f"{name:>5} said {(received.data or b'').decode()!r:40} {len(ciphertext)} B ciphertext, "
        f"encrypt {enc_ms:.2f} ms, decrypt {dec_ms:.2f} ms"
    )


def run(out: Callable[[str], None] = print, rounds: int = 3) -> None:
    """Runs the demo, writing human-readable lines to ``out``."""

    def step(label: str, ms: float) -> None:
        out(f"{label:<48}{ms:8.2f} ms")

    with tempfile.TemporaryDirectory(prefix="svc-demo-") as tmp:
        alice = Engine(Path(tmp, "alice"), b"alice")
        bob = Engine(Path(tmp, "bob"), b"bob")
        out(f"agents: alice and bob, cipher suite {alice.cipher_suite}, private data dirs in {tmp}")

        channel, ms = _timed(lambda: alice.create_group(b"acme/support/triage"))
        step("alice created channel acme/support/triage", ms)
        key_package, ms = _timed(bob.generate_key_package)
        step(f"bob generated a key package ({len(key_package)} B)", ms)
        pending, ms = _timed(lambda: channel.add_members([key_package]))
        channel.apply_pending_commit()
        step(f"alice added bob (commit {len(pending.commit)} B)", ms)
        welcome = pending.welcome or b""
        bob_channel, ms = _timed(lambda: bob.join_group(welcome))
        step(f"bob joined from the Welcome, epoch {bob_channel.epoch}", ms)

        for i in range(rounds):
            for sender, receiver, text in (
                (channel, bob_channel, f"alice -> bob: task {i} is ready"),
                (bob_channel, channel, f"bob -> alice: task {i} acknowledged"),
            ):
                _exchange(out, sender, receiver, text)
        out("done: every message was encrypted by one agent and decrypted by the other")
