"""A member's relay round trips while another account floods the relay with requests.

    python bench/refused_requests.py [--streams 50] [--pings 300] [--runs 3]

Starts one ``svc up`` (SQLite) on free loopback ports. A member of a channel times
``--pings`` round trips of 256 bytes (a publish, and its delivery to a second stream of
its account), one at a time: first with nothing else going on (the bound), then while a
second account, in a process of its own at nice 19, keeps ``--streams`` streams busy
sending one request after another:

- **needing no check:** ``Unsubscribe`` of a channel it is not in, which the relay
  answers without asking anything (what any account can always send);
- **refused:** ``Subscribe`` to the member's channel, which the account may not use:
  each needs an access check, and is refused (PERMISSION_DENIED) until the account's
  budget of refusals is spent, then answered without a check (RESOURCE_EXHAUSTED,
  server/relay/denials.py).

Prints the round trip's median and p99 for each phase, medians over ``--runs`` runs,
and the requests per second the flood got answered, with their codes.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import multiprocessing as mp
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from svc_sdk._argtypes import whole_number
from svc_sdk._relay_pb import relay_pb2 as pb
from svc_sdk.mls import Engine
from svc_sdk.relay_client import RelayConnection
from svc_sdk.relay_frames import code_name
from svc_sdk.testing import LocalStack, certify_with_api

CHANNEL = "bench/refused/requests"


async def _token(api_url: str, key: str) -> str:
    async with httpx.AsyncClient(base_url=api_url) as http:
        response = await http.post("/v1/tokens", headers={"Authorization": f"Bearer {key}"})
        token: str = response.raise_for_status().json()["token"]
        return token


def flood(relay_url: str, token: str, kind: str, streams: int, seconds: float, out: Any) -> None:
    """The other account: ``streams`` streams, each sending ``kind`` requests one after
    another for ``seconds``; sends back the answers' codes, counted."""
    os.nice(19)

    async def run() -> collections.Counter[int]:
        codes: collections.Counter[int] = collections.Counter()
        request = getattr(pb, kind)(channel=CHANNEL)
        deadline = time.monotonic() + seconds

        async def one(n: int) -> None:
            async with RelayConnection(relay_url, token, f"flood{n}".encode()) as conn:
                while time.monotonic() < deadline:
                    codes[(await conn.request(request, check=False)).code] += 1

        await asyncio.gather(*(one(n) for n in range(streams)))
        return codes

    out.send(dict(asyncio.run(run())))


async def round_trips(
    stack: LocalStack, root: str, pings: int, phases: list[str], streams: int
) -> dict[str, tuple[float, float, float, dict[int, int]]]:
    token = await _token(stack.api_url, stack.api_key)
    engine = certify_with_api(Engine(Path(root) / "m", b"m"), stack.api_url, stack.api_key)
    group = engine.create_group(CHANNEL.encode())
    results = {}
    async with (
        RelayConnection(stack.relay_url, token, b"m") as sender,
        RelayConnection(stack.relay_url, token, b"reader") as reader,
    ):
        await sender.request(pb.CreateChannel(channel=CHANNEL, group_info=group.group_info()))
        await reader.request(pb.Subscribe(channel=CHANNEL))
        message = group.encrypt(b"x" * 256)
        async with httpx.AsyncClient(base_url=stack.api_url) as http:
            other = await http.post("/v1/accounts", json={"email": "flood@example.com"})
            other_token = await _token(stack.api_url, other.json()["api_key"]["key"])
        for phase in phases:
            ctx = mp.get_context("spawn")
            parent, child = ctx.Pipe()
            worker = None
            if phase != "quiet":
                # Long enough for the pings; the flood ends by itself.
                args = (stack.relay_url, other_token, phase, streams, pings * 0.05 + 5, child)
                worker = ctx.Process(target=flood, args=args)
                worker.start()
                await asyncio.sleep(2)  # its streams open and busy
            times = []
            for _ in range(pings):
                start = time.perf_counter()
                await sender.request(pb.Publish(channel=CHANNEL, message=[message]))
                await asyncio.wait_for(reader.deliveries.get(), 30)
                times.append((time.perf_counter() - start) * 1000)
            times.sort()
            codes: dict[int, int] = {}
            rate = 0.0
            if worker is not None:
                codes = await asyncio.to_thread(parent.recv)
                worker.join()
                rate = sum(codes.values()) / (pings * 0.05 + 5)
            results[phase] = (
                statistics.median(times),
                times[int(len(times) * 0.99)],
                rate,
                codes,
            )
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=whole_number(1), default=50)
    parser.add_argument("--pings", type=whole_number(100), default=300)
    parser.add_argument("--runs", type=whole_number(1), default=3)
    args = parser.parse_args()
    phases = ["quiet", "Unsubscribe", "Subscribe"]
    runs = []
    for _ in range(args.runs):
        with LocalStack() as stack, tempfile.TemporaryDirectory() as root:
            runs.append(asyncio.run(round_trips(stack, root, args.pings, phases, args.streams)))
    names = {
        "quiet": "nothing else (the bound)",
        "Unsubscribe": f"{args.streams} streams of another account: requests needing no check",
        "Subscribe": f"{args.streams} streams of another account: requests it is refused",
    }
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"A member's round trips beside another account's flood; {when}; medians of {args.runs}")
    print()
    print(
        "| beside | round trip p50, ms | p99, ms | flood answered, per s | codes of the last run |"
    )
    print("|---|---:|---:|---:|---|")
    for phase in phases:
        p50 = statistics.median(r[phase][0] for r in runs)
        p99 = statistics.median(r[phase][1] for r in runs)
        rate = statistics.median(r[phase][2] for r in runs)
        codes = ", ".join(f"{code_name(c)} {n:,}" for c, n in sorted(runs[-1][phase][3].items()))
        shown = f"{rate:,.0f}" if phase != "quiet" else ""
        print(f"| {names[phase]} | {p50:.2f} | {p99:.2f} | {shown} | {codes} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
