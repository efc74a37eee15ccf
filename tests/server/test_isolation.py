"""``svc up``'s two servers cannot stall each other: the relay keeps answering quickly
while the account API is flooded with costly request heads."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from svc_sdk._relay_pb import relay_pb2 as pb
from svc_sdk.relay_client import RelayConnection
from svc_server.config import Settings
from svc_server.stack import start_stack, stop_stack

from ..support import free_port, start, stop, wait_for_file, wait_healthy

FIELDS = 9_000


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def flood(address: tuple[str, int], stop: threading.Event, answered: list[int]) -> None:
    """Requests with 9,000 header fields each, one after the other, each on a new
    connection: every one costs the API thousands of parser callbacks and header scans."""
    request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"X-F: v\r\n" * FIELDS + b"\r\n"
    while not stop.is_set():
        try:
            with socket.create_connection(address, timeout=30) as sock:
                sock.sendall(request)
                if sock.recv(16).startswith(b"HTTP/1.1 200"):
                    answered.append(1)
        except OSError:
            time.sleep(0.01)


async def round_trips(conn: RelayConnection, seconds: float) -> list[float]:
    """Sequential relay requests for ``seconds``; each one's round trip in ms."""
    times: list[float] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        started = time.perf_counter()
        await conn.request(pb.Unsubscribe(channel="isolation/probe/c"), timeout=60)
        times.append((time.perf_counter() - started) * 1000)
    return times


@pytest.mark.anyio
async def test_the_relay_answers_promptly_while_the_api_is_flooded(tmp_path: Path) -> None:
    # Limits raised so that every flood request is accepted and costs the API real work:
    # what this measures is the separation of the two servers, not the limits.
    settings = Settings(
        data_dir=tmp_path / "server",
        signup_rate_limit="1000/minute",
        max_header_count=FIELDS + 100,
        max_header_bytes=256 * 1024,
    )
    stack = await start_stack(settings, api_port=0, relay_port=0)
    stop = threading.Event()
    answered: list[int] = []
    flooders: list[threading.Thread] = []
    try:
        async with httpx.AsyncClient(base_url=stack.api_url, timeout=10) as http:
            signup = await http.post("/v1/accounts", json={"email": "ada@example.com"})
            key = signup.json()["api_key"]["key"]
            reply = await http.post("/v1/tokens", headers={"Authorization": f"Bearer {key}"})
        conn = RelayConnection(stack.relay_url, reply.json()["token"], b"probe")
        await conn.open()
        idle = await round_trips(conn, 1.5)

        host, port = stack.api_url.removeprefix("http://").rsplit(":", 1)
        flooders = [
            threading.Thread(target=flood, args=((host, int(port)), stop, answered))
            for _ in range(4)
        ]
        for thread in flooders:
            thread.start()
        await asyncio.sleep(0.5)
        before = len(answered)
        busy = await round_trips(conn, 3)
        during = len(answered) - before
        await conn.close()
    finally:
        stop.set()
        for thread in flooders:
            await asyncio.to_thread(thread.join, 30)
        await stop_stack(stack)

    assert during >= 4, "the flood must have kept the API busy"
    # Generous bounds: with the servers sharing one event loop, the median round trip
    # under this flood was ~20x the idle one (tens of ms, the worst ones seconds);
    # apart, it stays within a few ms of idle.
    assert max(busy) < 2000, f"a relay round trip took {max(busy):.0f} ms during the flood"
    assert statistics.median(busy) < 5 * statistics.median(idle) + 10, (
        f"median round trip {statistics.median(busy):.1f} ms during the flood, "
        f"{statistics.median(idle):.1f} ms idle"
    )


def test_killing_svc_up_takes_its_api_process_along(tmp_path: Path) -> None:
    """The API runs in a child of ``svc up``: SIGKILL on ``svc up`` (no chance to stop
    it) must not leave that child serving, or holding the port a restart needs."""
    api_port = free_port()
    args = ["up", "--api-port", str(api_port), "--relay-port", "0"]
    proc = start([*args, "--data-dir", str(tmp_path / "server")])
    try:
        wait_healthy(f"http://127.0.0.1:{api_port}", proc)
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", api_port), timeout=1).close()
            except ConnectionRefusedError:
                break
            assert time.monotonic() < deadline, "the API still accepts connections"
            time.sleep(0.05)
    finally:
        stop(proc)


def test_svc_up_stops_and_fails_when_its_api_process_dies(tmp_path: Path) -> None:
    """A relay without its API would look alive to a supervisor and serve no new agent:
    svc up stops the relay too and exits with an error, so that it is restarted."""
    api_port = free_port()
    args = ["up", "--api-port", str(api_port), "--relay-port", "0"]
    proc = start([*args, "--data-dir", str(tmp_path / "server")])
    try:
        wait_healthy(f"http://127.0.0.1:{api_port}", proc)
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        assert len(children) == 1
        os.kill(int(children[0]), signal.SIGKILL)
        _, err = proc.communicate(timeout=30)
    finally:
        stop(proc)
    assert proc.returncode == 1
    assert "account API process exited with status -9; svc up stopped" in err


@pytest.mark.parametrize("moment", ["ready", "starting"])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_svc_up_stops_cleanly_on_ctrl_c_or_a_supervisors_sigterm(
    tmp_path: Path, sig: int, moment: str
) -> None:
    """Ctrl-C in a terminal sends SIGINT to svc up's process group (its API process has a
    group of its own); a supervisor may send SIGTERM to each process of the service
    (systemd does), the API process included. Once ready, or while starting (the signal
    sent as soon as the database file exists, the API process already spawned), svc up
    stops in order and exits 0."""
    data_dir = tmp_path / "s"
    command = ["up", "--api-port", str(free_port()), "--relay-port", "0"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "svc_cli", *command, "--data-dir", str(data_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        if moment == "ready":
            for line in proc.stdout:
                if line.startswith("ready"):
                    break
        else:
            wait_for_file(data_dir / "svc.sqlite3", proc)
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        assert len(children) == 1
        os.killpg(proc.pid, sig)
        if sig == signal.SIGTERM:
            os.kill(int(children[0]), sig)
        out, err = proc.communicate(timeout=30)
    finally:
        stop(proc)
    assert proc.returncode == 0, err
    assert out.rstrip().endswith("stopped")
    assert "Traceback" not in err, err
