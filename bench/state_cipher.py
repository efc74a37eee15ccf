"""What encryption at rest (SQLCipher) costs the client's storage paths, without the relay:
the same work on a plaintext and an encrypted data_dir, interleaved in one run.

    python bench/state_cipher.py [--messages 4000] [--rounds 3] [--sizes 256,16384]

- send: ``Group.encrypt_queued`` one message at a time (``Channel.send``'s engine call:
  encrypts and writes the ratchet state and the outbox row in one transaction), then
  ``retire_outbox`` as the relay's acknowledgement does;
- receive: ``Group.process_batch`` of 256 messages (decrypt, write the state), then the
  inbox write of those messages with the cursor (``LocalState.advance``), as a listener
  with no reader waiting does;
- open: ``Engine(...)`` of an existing data_dir (SQLCipher keys each connection).

Prints one markdown table: medians of ``--rounds`` rounds, msg/s or ms.
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

from svc_sdk._argtypes import whole_number
from svc_sdk.local_state import LocalState
from svc_sdk.mls import Engine
from svc_sdk.testing import LocalIssuer

BATCH = 256


def one_round(root: Path, key: bytes | None, n: int, size: int) -> dict[str, float]:
    issuer = LocalIssuer()
    a = issuer.certify(Engine(root / "a", b"a", state_key=key))
    b = issuer.certify(Engine(root / "b", b"b", state_key=key))
    group = a.create_group(b"bench/state/cipher")
    pending = group.add_members([b.generate_key_package()])
    group.apply_pending_commit()
    assert pending.welcome is not None
    other = b.join_group(pending.welcome)
    inbox = LocalState.of(b)
    inbox.add_channel("bench/state/cipher", 0, 0)
    payload = b"x" * size
    cts: list[bytes] = []
    start = time.perf_counter()
    for i in range(n):
        _, out = group.encrypt_queued([(i + 1, i.to_bytes(16, "big"), payload)])
        cts.extend(out)
        group.retire_outbox(i + 1)
    send = n / (time.perf_counter() - start)
    start = time.perf_counter()
    for i in range(0, n, BATCH):
        received = other.process_batch(cts[i : i + BATCH])
        rows = []
        for j, r in enumerate(received):
            assert not isinstance(r, Exception) and r.data is not None
            rows.append((i + j + 1, b"a", r.data))
        inbox.advance("bench/state/cipher", i + len(rows), rows)
    receive = n / (time.perf_counter() - start)
    inbox.close()
    a.close()
    b.close()
    start = time.perf_counter()
    Engine(root / "b", b"b", state_key=key).close()
    return {"send": send, "receive": receive, "open": (time.perf_counter() - start) * 1000}


def sizes_list(text: str) -> list[int]:
    count = whole_number(1)
    try:
        return [count(part) for part in text.split(",")]
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"sizes: {exc}") from None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=whole_number(1), default=4000)
    parser.add_argument("--rounds", type=whole_number(1), default=3)
    parser.add_argument(
        "--sizes", type=sizes_list, default="256,16384", help="payload sizes, comma-separated"
    )
    args = parser.parse_args()
    sizes: list[int] = args.sizes
    key = secrets.token_bytes(32)
    results: dict[tuple[int, bool], list[dict[str, float]]] = {}
    for _ in range(args.rounds):
        for size in sizes:
            for encrypted in (False, True):
                with tempfile.TemporaryDirectory() as root:
                    run = one_round(Path(root), key if encrypted else None, args.messages, size)
                results.setdefault((size, encrypted), []).append(run)
        print(".", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    print(
        "| payload | send msg/s plain / encrypted | receive msg/s plain / encrypted "
        "| open ms plain / encrypted |"
    )
    print("|---|---:|---:|---:|")
    for size in sizes:
        plain, enc = results[(size, False)], results[(size, True)]

        def med(rs: list[dict[str, float]], k: str) -> float:
            return statistics.median(r[k] for r in rs)

        cells = []
        for k, fmt in (("send", ",.0f"), ("receive", ",.0f"), ("open", ".1f")):
            p, e = med(plain, k), med(enc, k)
            change = (e / p - 1) * 100
            cells.append(f"{p:{fmt}} / {e:{fmt}} ({change:+.0f}%)")
        print(f"| {size:,} B | " + " | ".join(cells) + " |")
    print(f"\n{args.rounds} rounds of {args.messages} messages; medians")
    return 0


if __name__ == "__main__":
    sys.exit(main())
