"""Token exchanges per second for one account-API process, with a real load generator.

    python bench/api_tokens.py [--seconds 10] [--connections 32] [--database-url URL]

Starts ``svc api`` pinned to CPU 0 and drives ``POST /v1/tokens`` with wrk (Debian
package ``wrk``) pinned to CPU 1, so the server has exactly one core. Prints a table
with throughput and latency percentiles beside the bound measured in the same run: the
in-process cost of the two things an exchange must do (look the key up, sign the JWT).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support import PostgresServer, free_port, wait_healthy  # noqa: E402

LUA = """
wrk.method = "POST"
wrk.headers["Authorization"] = "Bearer {key}"
"""


def in_process_bound(data_dir: Path, database_url: str, key: str) -> tuple[float, float]:
    """(µs per key lookup, µs per JWT signature), medians of 5 rounds, in this process."""
    from svc_server.config import Settings
    from svc_server.db.session import make_engine, make_sessionmaker
    from svc_server.services import api_keys, tokens
    from svc_server.services.signing import SignerCache

    settings = Settings(data_dir=data_dir, database_url=database_url)
    engine = make_engine(settings)
    sessions = make_sessionmaker(engine)
    signer = SignerCache(sessions).get()
    with engine.connect() as conn:
        found = api_keys.find_active(conn, key)
        assert found is not None
        account = found.account

    autocommit = {} if settings.is_sqlite else {"isolation_level": "AUTOCOMMIT"}

    def lookup() -> None:
        with engine.connect().execution_options(**autocommit) as conn:
            api_keys.find_active(conn, key)

    def sign() -> None:
        tokens.issue(signer, account, settings, time.time())

    results = []
    for fn, n in ((lookup, 2000), (sign, 2000)):
        rounds = []
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(n):
                fn()
            rounds.append((time.perf_counter() - start) / n * 1e6)
        results.append(statistics.median(rounds))
    engine.dispose()
    return results[0], results[1]


def parse_wrk(output: str) -> dict[str, float]:
    units = {"us": 1e-3, "ms": 1.0, "s": 1e3}
    out: dict[str, float] = {}
    for pct in ("50", "90", "99"):
        m = re.search(rf"^\s+{pct}(?:\.000)?%\s+([\d.]+)(us|ms|s)", output, re.M)
        if m:
            out[f"p{pct}"] = float(m.group(1)) * units[m.group(2)]
    m = re.search(r"Requests/sec:\s+([\d.]+)", output)
    out["rps"] = float(m.group(1)) if m else 0.0
    m = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", output)
    out["errors"] = float(m.group(1)) if m else 0.0
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--database-url", default="", help="default: SQLite in a temp dir")
    parser.add_argument(
        "--postgres", action="store_true", help="start a throwaway PostgreSQL server and use it"
    )
    args = parser.parse_args(argv)
    if args.postgres:
        pg = PostgresServer()
        pg.start()
        try:
            return run(args, pg.create_database("svc_bench"))
        finally:
            pg.stop()
    return run(args, args.database_url)


def run(args: argparse.Namespace, database_url: str) -> int:
    if not shutil.which("wrk"):
        raise SystemExit("wrk is not installed: apt-get install wrk")

    data_dir = Path(tempfile.mkdtemp(prefix="svc-bench-api-"))
    database_url = database_url or f"sqlite:///{data_dir / 'svc.sqlite3'}"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "SVC_AUTH_FAILURE_RATE_LIMIT": "1000000/minute"}
    server = subprocess.Popen(
        [
            "taskset",
            "-c",
            "0",
            sys.executable,
            "-P",
            "-m",
            "svc_sdk.cli",
            "api",
            "--port",
            str(port),
            "--data-dir",
            str(data_dir),
            "--database-url",
            database_url,
        ],
        env=env,
    )
    try:
        wait_healthy(url, server)
        key = httpx.post(f"{url}/v1/accounts", json={"email": "bench@example.com"}).json()[
            "api_key"
        ]["key"]
        script = data_dir / "tokens.lua"
        script.write_text(LUA.format(key=key))
        # Warm up, then measure.
        wrk = [
            "taskset",
            "-c",
            "1",
            "wrk",
            "-t1",
            f"-c{args.connections}",
            "--latency",
            "-s",
            str(script),
        ]
        subprocess.run([*wrk, "-d2s", f"{url}/v1/tokens"], capture_output=True, check=True)
        result = parse_wrk(
            subprocess.run(
                [*wrk, f"-d{args.seconds}s", f"{url}/v1/tokens"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )
        lookup_us, sign_us = in_process_bound(data_dir, database_url, key)
    finally:
        server.terminate()
        server.wait(timeout=10)
        shutil.rmtree(data_dir, ignore_errors=True)

    bound = 1e6 / (lookup_us + sign_us)
    backend = "PostgreSQL" if database_url.startswith("postgresql") else "SQLite"
    print(f"Token exchanges (POST /v1/tokens), one API process on one core, {backend},")
    print(f"wrk: 1 thread, {args.connections} connections, {args.seconds} s, on the other core\n")
    print("| measure | value |")
    print("|---|---:|")
    print(f"| exchanges per second | {result['rps']:,.0f} |")
    print(f"| latency p50 | {result.get('p50', float('nan')):.2f} ms |")
    print(f"| latency p90 | {result.get('p90', float('nan')):.2f} ms |")
    print(f"| latency p99 | {result.get('p99', float('nan')):.2f} ms |")
    print(f"| non-2xx responses | {result['errors']:.0f} |")
    print(f"| bound: key lookup, in process | {lookup_us:.0f} µs |")
    print(f"| bound: JWT sign (EdDSA), in process | {sign_us:.0f} µs |")
    print(f"| bound: exchanges/s if HTTP cost nothing | {bound:,.0f} |")
    print(f"| HTTP + framework share of each exchange | {1 - result['rps'] / bound:.0%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
