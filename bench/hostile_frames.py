"""What a hostile Publish frame costs the relay's event loop, beside an honest one of the
same size: ``decode_publish``, which the relay applies to every frame it is handed.

    python bench/hostile_frames.py [--calls 30]

The hostile frame is 1 MiB of one-byte messages (349,000: far over the 1,024 a Publish
may carry, refused with counts); the honest one is 1,000 messages of 1,000 bytes. The
bound beside the hostile frame's cost is the honest frame's, measured in the same run.
"""

from __future__ import annotations

import argparse
import statistics
import time

from svc_sdk._argtypes import whole_number
from svc_sdk._relay_pb import relay_pb2 as pb
from svc_sdk.protocol import decode_publish


def median_ms(frame: bytes, calls: int) -> float:
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        decode_publish(frame)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=whole_number(1), default=30)
    args = parser.parse_args()
    frames = {
        "hostile: 349,000 messages of 1 B": [b"x"] * 349_000,
        "honest: 1,000 messages of 1,000 B (the bound)": [b"y" * 1000] * 1000,
    }
    print(f"decode_publish, median of {args.calls} calls")
    print()
    print("| frame | bytes | ms |")
    print("|---|---:|---:|")
    for name, messages in frames.items():
        publish = pb.Publish(channel="bench/hostile/frames", message=messages)
        frame = pb.ClientFrame(request_id=1, publish=publish).SerializeToString()
        print(f"| {name} | {len(frame):,} | {median_ms(frame, args.calls):.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
