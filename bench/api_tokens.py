"""Token exchanges and agent-credential issuances per second for one account-API
process, with a real load generator.

    python bench/api_tokens.py [--seconds 10] [--connections 32] [--database-url URL]

Starts ``svc api`` pinned to CPU 0 and drives ``POST /v1/tokens``, then
``POST /v1/agent-credentials`` (one agent's signed request, replayed), with wrk (Debian
package ``wrk``) pinned to CPU 1, so the server has exactly one core. Prints a table
with throughput and latency percentiles beside the bound measured in the same run: the
in-process cost of what each request must do (look the key up, then sign a JWT; or
verify the proof of possession and sign the credential).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support import PostgresServer, free_port, wait_healthy  # noqa: E402

LUA = """
wrk.method = "POST"
wrk.headers["Authorization"] = "Bearer {key}"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{body}'
"""


def credential_request(account: str) -> tuple[Any, bytes, str]:
    """An agent's signed credential request: (request, proof, JSON body)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from svc_sdk.agent_credential import REQUEST_LABEL, CredentialRequest

    key = Ed25519PrivateKey.generate()
    public = key.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    request = CredentialRequest(
        uuid.UUID(account).bytes, b"bench-agent", 1, public, int(time.time())
    )
    proof = key.sign(REQUEST_LABEL + request.encode())
    body = {
        "account": account,
        "identity": base64.b64encode(request.identity).decode(),
        "cipher_suite": 1,
        "signature_key": base64.b64encode(public).decode(),
        "issued_at": request.issued_at,
        "proof": base64.b64encode(proof).decode(),
    }
    return request, proof, json.dumps(body)


def in_process_bound(
    data_dir: Path, database_url: str, key: str, credential: tuple[Any, bytes]
) -> tuple[float, float, float]:
    """(µs per key lookup, µs per JWT signature, µs per credential check and signature),
    medians of 5 rounds, in this process."""
    from svc_server.config import Settings
    from svc_server.db.session import make_engine, make_sessionmaker
    from svc_server.services import agent_credentials, api_keys, tokens
    from svc_server.services.signing import CREDENTIAL, SignerCache

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

    credential_signer = SignerCache(sessions, purpose=CREDENTIAL).get()
    request, proof = credential

    def issue() -> None:
        now = int(time.time())
        agent_credentials.check_request(request, proof, account.id, now)
        agent_credentials.issue(credential_signer, request, now, 86_400)

    results = []
    for fn, n in ((lookup, 2000), (sign, 2000), (issue, 2000)):
        rounds = []
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(n):
                fn()
            rounds.append((time.perf_counter() - start) / n * 1e6)
        results.append(statistics.median(rounds))
    engine.dispose()
    return results[0], results[1], results[2]


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
            "svc_cli",
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
        signed_up = httpx.post(f"{url}/v1/accounts", json={"email": "bench@example.com"}).json()
        key, account = signed_up["api_key"]["key"], signed_up["account"]["id"]
        request, proof, body = credential_request(account)
        results = {}
        for path, sent in (("/v1/tokens", ""), ("/v1/agent-credentials", body)):
            script = data_dir / "load.lua"
            script.write_text(LUA.format(key=key, body=sent))
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
            # Warm up, then measure.
            subprocess.run([*wrk, "-d2s", f"{url}{path}"], capture_output=True, check=True)
            done = subprocess.run(
                [*wrk, f"-d{args.seconds}s", f"{url}{path}"],
                capture_output=True,
                text=True,
                check=True,
            )
            results[path] = parse_wrk(done.stdout)
        lookup_us, sign_us, issue_us = in_process_bound(
            data_dir, database_url, key, (request, proof)
        )
    finally:
        server.terminate()
        server.wait(timeout=10)
        shutil.rmtree(data_dir, ignore_errors=True)

    tokens, creds = results["/v1/tokens"], results["/v1/agent-credentials"]
    bounds = (1e6 / (lookup_us + sign_us), 1e6 / (lookup_us + issue_us))
    backend = "PostgreSQL" if database_url.startswith("postgresql") else "SQLite"
    print(f"One API process on one core, {backend}; wrk: 1 thread, {args.connections}")
    print(f"connections, {args.seconds} s per endpoint, on the other core\n")
    print("| measure | POST /v1/tokens | POST /v1/agent-credentials |")
    print("|---|---:|---:|")
    print(f"| requests per second | {tokens['rps']:,.0f} | {creds['rps']:,.0f} |")
    for pct in ("p50", "p90", "p99"):
        nan = float("nan")
        print(f"| latency {pct} | {tokens.get(pct, nan):.2f} ms | {creds.get(pct, nan):.2f} ms |")
    print(f"| non-2xx responses | {tokens['errors']:.0f} | {creds['errors']:.0f} |")
    print(f"| bound: key lookup, in process | {lookup_us:.0f} µs | {lookup_us:.0f} µs |")
    print(
        f"| bound: the request's own work, in process | {sign_us:.0f} µs (JWT sign) "
        f"| {issue_us:.0f} µs (proof check + credential sign) |"
    )
    print(f"| bound: requests/s if HTTP cost nothing | {bounds[0]:,.0f} | {bounds[1]:,.0f} |")
    print(
        f"| HTTP + framework share of each request | {1 - tokens['rps'] / bounds[0]:.0%} "
        f"| {1 - creds['rps'] / bounds[1]:.0%} |"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
