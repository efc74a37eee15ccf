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

from svc_sdk.mls import Engine

T = TypeVar("T")


def _timed(fn: Callable[[], T]) -> tuple[T, float]:
    start = time.perf_counter()
    result = fn()
    return result, (time.perf_counter() - start) * 1000


def run(out: Callable[[str], None] = print, rounds: int = 3) -> None:
    """Runs the demo, writing human-readable lines to ``out``."""
    with tempfile.TemporaryDirectory(prefix="svc-demo-") as tmp:
        alice = Engine(Path(tmp, "alice"), b"alice")
        bob = Engine(Path(tmp, "bob"), b"bob")
        out(f"agents: alice and bob, cipher suite {alice.cipher_suite}, private data dirs in {tmp}")

        channel, ms = _timed(lambda: alice.create_group(b"acme/support/triage"))
        out(f"alice created channel acme/support/triage            {ms:7.2f} ms")
        key_package, ms = _timed(bob.generate_key_package)
        out(f"bob generated a key package ({len(key_package)} B)            {ms:7.2f} ms")
        pending, ms = _timed(lambda: channel.add_members([key_package]))
        channel.apply_pending_commit()
        out(f"alice added bob (commit {len(pending.commit)} B)               {ms:7.2f} ms")
        assert pending.welcome is not None
        welcome = pending.welcome
        bob_channel, ms = _timed(lambda: bob.join_group(welcome))
        out(f"bob joined from the Welcome, epoch {bob_channel.epoch}               {ms:7.2f} ms")

        for i in range(rounds):
            for sender, receiver, text in (
                (channel, bob_channel, f"alice -> bob: task {i} is ready"),
                (bob_channel, channel, f"bob -> alice: task {i} acknowledged"),
            ):
                ciphertext, enc_ms = _timed(lambda s=sender, t=text: s.encrypt(t.encode()))
                received, dec_ms = _timed(lambda r=receiver, c=ciphertext: r.process(c))
                assert received.data is not None and received.sender is not None
                out(
                    f"{received.sender.decode():>5} said {received.data.decode()!r:40} "
                    f"{len(ciphertext)} B ciphertext, encrypt {enc_ms:.2f} ms, "
                    f"decrypt {dec_ms:.2f} ms"
                )
        out("done: every message was encrypted by one agent and decrypted by the other")
