"""The relay as real processes: killed with SIGKILL and restarted, two relay processes
sharing Redis, and `svc up` starting and stopping."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from svc_sdk._relay_pb import relay_pb2 as pb
from svc_sdk.relay_client import RelayConnection

from ..support import (
    PostgresServer,
    RedisCluster,
    RedisServer,
    ScaledOut,
    free_port,
    scaled_out,
    start,
    stop,
    wait_for_file,
    wait_healthy,
)
from .helpers import Member, engine

pytestmark = pytest.mark.anyio
CHANNEL = "acme/ops/alerts"
STALE = 9  # gRPC FAILED_PRECONDITION


async def wait_grpc(target: str, proc: subprocess.Popen[str]) -> None:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        async with grpc.aio.insecure_channel(target) as channel:
            try:
                response = await health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(service="svc.relay.v1.Relay"), timeout=1
                )
                if response.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.aio.AioRpcError:
                pass
        await asyncio.sleep(0.1)
    raise AssertionError(f"relay {target} did not come up")


def signup(api_url: str, email: str) -> tuple[str, str]:
    body = httpx.post(f"{api_url}/v1/accounts", json={"email": email}).json()
    key = body["api_key"]["key"]
    token = httpx.post(f"{api_url}/v1/tokens", headers={"Authorization": f"Bearer {key}"}).json()[
        "token"
    ]
    return key, token


@pytest.fixture
def up_ports(tmp_path: Path) -> tuple[int, int, list[str]]:
    """Free API and relay ports, and the `svc up` arguments that use them."""
    api_port, relay_port = free_port(), free_port()
    args = ["up", "--api-port", str(api_port), "--relay-port", str(relay_port)]
    return api_port, relay_port, [*args, "--data-dir", str(tmp_path / "server")]


async def test_relay_killed_and_restarted_loses_nothing(
    up_ports: tuple[int, int, list[str]], tmp_path: Path
) -> None:
    api_port, relay_port, args = up_ports
    proc = start(args)
    api_url, relay_url = f"http://127.0.0.1:{api_port}", f"127.0.0.1:{relay_port}"
    try:
        wait_healthy(api_url, proc)
        key, token = signup(api_url, "ops@example.com")
        api = (api_url, key)
        alice = Member(
            "alice", engine(tmp_path, "alice", api), RelayConnection(relay_url, token, b"alice")
        )
        bob = Member("bob", engine(tmp_path, "bob", api), RelayConnection(relay_url, token, b"bob"))
        await alice.conn.open()
        await bob.conn.open()
        await alice.create(CHANNEL)
        await alice.add(CHANNEL, bob)
        await bob.join(CHANNEL)
        for i in range(10):
            await alice.send(CHANNEL, f"before {i}")
        for _ in range(4):
            await bob.next()
        # Every acknowledged message is durable: kill without any chance to flush.
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        await alice.conn.close()
        await bob.conn.close()
        proc = start(args)
        wait_healthy(api_url, proc)
        alice.conn = RelayConnection(relay_url, token, b"alice")
        bob.conn = RelayConnection(relay_url, token, b"bob")
        await alice.conn.open()
        await bob.conn.open()
        await alice.subscribe(CHANNEL)
        # Bob resumes from his cursor: the six he had not read, then new ones.
        await bob.subscribe(CHANNEL)
        for i in range(3):
            await alice.send(CHANNEL, f"after {i}")
        for _ in range(9):
            await bob.next()
        assert bob.received == [f"before {i}".encode() for i in range(10)] + [
            f"after {i}".encode() for i in range(3)
        ]
        await asyncio.sleep(0.2)
        assert bob.conn.deliveries.empty(), "no duplicates"
        # The restarted relay tracks the group from the store: it refuses a forged commit
        # and accepts the next real one.
        assert alice.group and bob.group
        update = alice.group.self_update()
        forged = bytearray(update.commit)
        forged[-(2 * 33) - 5] ^= 0x55  # in the signature, before the two tags
        refused = await alice.conn.request(
            pb.Commit(channel=CHANNEL, epoch=update.epoch, commit=bytes(forged)), check=False
        )
        assert refused.code != 0, refused
        await alice.conn.request(
            pb.Commit(channel=CHANNEL, epoch=update.epoch, commit=update.commit)
        )
        alice.group.apply_pending_commit()
        await bob.next()
        assert alice.group.epoch == bob.group.epoch == 2
        await alice.conn.close()
        await bob.conn.close()
    finally:
        stop(proc)


async def one_on_each_relay(
    cluster: ScaledOut, tmp_path: Path, email: str
) -> tuple[Member, Member, str]:
    """alice on relay A creates the channel and adds bob, on relay B: his Welcome
    crosses from one relay to the other. She makes him an admin, so both commit. Also
    the account's relay token."""
    for port, proc in zip(cluster.relay_ports, cluster.relays, strict=True):
        await wait_grpc(f"127.0.0.1:{port}", proc)
    key, token = signup(cluster.api_url, email)
    api = (cluster.api_url, key)
    members = []
    for name, port in zip(("alice", "bob"), cluster.relay_ports, strict=True):
        conn = RelayConnection(f"127.0.0.1:{port}", token, name.encode())
        members.append(Member(name, engine(tmp_path, name, api), conn))
        await conn.open()
    alice, bob = members
    await alice.create(CHANNEL)
    await alice.add(CHANNEL, bob)
    await bob.join(CHANNEL)
    assert alice.group is not None
    await alice.commit(CHANNEL, alice.group.set_role(bob.member_id, "admin"))
    await bob.next()
    return alice, bob, token


@pytest.mark.parametrize("redis_kind", ["redis_server", "redis_cluster"])
async def test_two_relays_share_one_channel_through_redis(
    tmp_path: Path,
    postgres: PostgresServer | None,
    redis_kind: str,
    request: pytest.FixtureRequest,
) -> None:
    """On one Redis server, and on a Redis Cluster (three primaries, one replica each)."""
    redis_server: RedisServer | RedisCluster | None = request.getfixturevalue(redis_kind)
    if redis_server is None:
        pytest.skip("no redis-server on this machine")
    with scaled_out(tmp_path, postgres, redis_server, "relay") as cluster:
        (_, b_port), relays = cluster.relay_ports, cluster.relays
        alice, bob, token = await one_on_each_relay(cluster, tmp_path, "scale@example.com")
        for i in range(20):
            await alice.send(CHANNEL, f"a{i}")
        for i in range(5):
            await bob.send(CHANNEL, f"b{i}")
        for _ in range(20):
            await bob.next()
        for _ in range(5):
            await alice.next()
        assert bob.received == [f"a{i}".encode() for i in range(20)]
        assert alice.received == [f"b{i}".encode() for i in range(5)]
        # Both relays validate a commit for the same epoch at once: exactly one is stored.
        assert alice.group and bob.group
        commits = [alice.group.self_update(), bob.group.self_update()]
        replies = await asyncio.gather(
            *(
                m.conn.request(
                    pb.Commit(channel=CHANNEL, epoch=c.epoch, commit=c.commit), check=False
                )
                for m, c in zip((alice, bob), commits, strict=True)
            )
        )
        assert sorted(r.code for r in replies) == [0, STALE], replies
        winner, loser = (alice, bob) if replies[0].code == 0 else (bob, alice)
        winner.group.apply_pending_commit()  # type: ignore[union-attr]
        loser.group.clear_pending_commit()  # type: ignore[union-attr]
        await loser.next()  # the winner's commit, through the other relay
        assert alice.group.epoch == bob.group.epoch
        # Relay A dies; alice moves to relay B and resumes without loss.
        relays[0].kill()
        relays[0].wait()
        await alice.conn.close()
        alice.conn = RelayConnection(f"127.0.0.1:{b_port}", token, b"alice")
        await alice.conn.open()
        await alice.subscribe(CHANNEL)
        await bob.send(CHANNEL, "after failover")
        await alice.next()
        assert alice.received[-1] == b"after failover"
        # Relay B validates against the group as stored, whoever accepted the last commit.
        update = alice.group.self_update()
        reply = await alice.conn.request(
            pb.Commit(channel=CHANNEL, epoch=update.epoch, commit=update.commit)
        )
        alice.group.apply_pending_commit()
        await bob.next()
        assert reply.epoch == alice.group.epoch == bob.group.epoch
        await alice.conn.close()
        await bob.conn.close()


async def test_a_redis_primary_failover_loses_nothing_acknowledged(
    tmp_path: Path, postgres: PostgresServer | None, redis_cluster: RedisCluster | None
) -> None:
    """Agents on two relays keep sending while the Redis Cluster primary that holds the
    channel hands over to its replica (CLUSTER FAILOVER: the primary stops writes, the
    replica catches up and takes over). Every message whose send was acknowledged is
    delivered exactly once, in order; commits go on against the promoted replica."""
    if redis_cluster is None:
        pytest.skip("no redis-server on this machine")
    with scaled_out(tmp_path, postgres, redis_cluster, "failover") as cluster:
        alice, bob, _ = await one_on_each_relay(cluster, tmp_path, "failover@example.com")
        primary = redis_cluster.primary_of("svc:{" + CHANNEL + "}:log")
        sent: dict[str, list[str]] = {"alice": [], "bob": []}
        acked: dict[str, list[str]] = {"alice": [], "bob": []}

        async def keep_sending(member: Member, count: int) -> None:
            for i in range(count):
                text = f"{member.name}{i}"
                sent[member.name].append(text)
                try:
                    await member.send(CHANNEL, text)
                except Exception:
                    continue  # not acknowledged: may or may not be delivered
                acked[member.name].append(text)
                await asyncio.sleep(0.005)

        senders = asyncio.gather(keep_sending(alice, 200), keep_sending(bob, 200))
        await asyncio.sleep(0.3)
        promoted = await asyncio.to_thread(redis_cluster.failover, primary)
        await senders
        assert redis_cluster.primary_of("svc:{" + CHANNEL + "}:log") == promoted != primary
        for receiver, sender in ((alice, bob), (bob, alice)):
            seqs = []
            while True:
                try:
                    seqs.append((await receiver.next(timeout=3)).seq)
                except TimeoutError:
                    break
            got = [m.decode() for m in receiver.received]
            assert len(got) == len(set(got)), f"{receiver.name} got duplicates"
            assert set(acked[sender.name]) <= set(got), f"{receiver.name} lost acknowledged"
            assert got == [t for t in sent[sender.name] if t in got], "out of order"
            assert seqs == sorted(seqs)
        assert len(acked["alice"]) > 150 and len(acked["bob"]) > 150
        # Commits and messages go on through both relays against the promoted replica.
        assert alice.group and bob.group
        update = bob.group.self_update()
        await bob.conn.request(pb.Commit(channel=CHANNEL, epoch=update.epoch, commit=update.commit))
        bob.group.apply_pending_commit()
        await alice.next()
        assert alice.group.epoch == bob.group.epoch
        await alice.send(CHANNEL, "after the failover")
        await bob.next()
        assert bob.received[-1] == b"after the failover"
        await alice.conn.close()
        await bob.conn.close()


def test_svc_up_prints_addresses_and_stops_on_sigterm(up_ports: tuple[int, int, list[str]]) -> None:
    api_port, relay_port, args = up_ports
    proc = start(args)
    try:
        wait_healthy(f"http://127.0.0.1:{api_port}", proc)
        metrics = httpx.get(f"http://127.0.0.1:{api_port}/metrics/", timeout=5).text
        assert "svc_relay_connected_streams" in metrics
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=15)
    finally:
        stop(proc)
    assert proc.returncode == 0, err
    assert f"svc account API  http://127.0.0.1:{api_port}" in out
    assert f"svc relay        http://127.0.0.1:{relay_port}" in out
    assert out.rstrip().endswith("stopped")


STARTING = [
    (["up", "--api-port", "0", "--relay-port", "0"], "svc.sqlite3"),
    (["api", "--port", "0"], "svc.sqlite3"),
    (["relay", "--port", "0"], "relay.sqlite3"),
]


@pytest.mark.parametrize(("command", "database"), STARTING, ids=["up", "api", "relay"])
def test_a_server_stops_cleanly_on_a_sigterm_sent_while_it_starts(
    tmp_path: Path, command: list[str], database: str
) -> None:
    """A supervisor may stop a server at any moment, before it says it is ready (`svc
    up`'s account API answers before the process has finished starting). The signal is
    sent as soon as the server's database file exists, mid-start: the start is called off,
    what it had opened is closed, and the process exits 0, not killed by the signal."""
    data_dir = tmp_path / "server"
    proc = start([*command, "--data-dir", str(data_dir)])
    try:
        wait_for_file(data_dir / database, proc)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        stop(proc)
    assert proc.returncode == 0, err
    assert "Traceback" not in err, err
    if command[0] == "up":
        assert out.rstrip().endswith("stopped")


def test_a_stop_calls_off_a_start_that_hangs(tmp_path: Path) -> None:
    """A relay whose Redis accepts the connection and never answers hangs in its start;
    a SIGTERM then calls the start off and the relay exits 0, instead of waiting for the
    start to fail (exit 1, after Redis's timeouts)."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        redis_url = f"redis://127.0.0.1:{silent.getsockname()[1]}/0"
        args = ["relay", "--port", "0", "--redis-url", redis_url]
        proc = start([*args, "--data-dir", str(tmp_path / "server")])
        try:
            silent.settimeout(30)
            connection, _ = silent.accept()  # the relay's ping, never answered
            time.sleep(0.5)
            assert proc.poll() is None
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=30)
            connection.close()
        finally:
            stop(proc)
    assert proc.returncode == 0, err
    assert "Traceback" not in err, err
    assert "svc relay on" not in out


def said_it_serves(proc: subprocess.Popen[str], prefix: str) -> None:
    """Reads the server's first line, which must start with ``prefix``; kills it and
    fails with its stderr otherwise."""
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith(prefix):
        proc.kill()
        raise AssertionError(f"{prefix.strip()}: not started: {line}{proc.communicate()[1]}")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_svc_api_serves_once_it_says_so_and_stops_on_a_signal_sent_then(
    tmp_path: Path, sig: signal.Signals
) -> None:
    """`svc api` prints its address once it accepts connections, with its signal
    handlers in place: a request sent on reading the line is answered, and a signal
    sent right after ends the process cleanly (exit 0), not killed."""
    port = free_port()
    proc = start(["api", "--port", str(port), "--data-dir", str(tmp_path / "server")])
    try:
        said_it_serves(proc, "svc account API on ")
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=15)
    finally:
        stop(proc)
    assert proc.returncode == 0, err


def test_svc_relay_stops_cleanly_on_a_sigterm_sent_as_it_says_it_serves(tmp_path: Path) -> None:
    """A supervisor may stop the relay the moment it reports its address: the signal
    handlers are in place by then, so it closes the relay and exits 0, not killed."""
    proc = start(["relay", "--port", str(free_port()), "--data-dir", str(tmp_path / "server")])
    try:
        said_it_serves(proc, "svc relay on ")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
    finally:
        stop(proc)
    assert proc.returncode == 0, err


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (
            ["up", "--api-port", "{busy}", "--relay-port", "{free}"],
            "account API cannot listen on 127.0.0.1:{busy}",
        ),
        (
            ["up", "--api-port", "{free}", "--relay-port", "{busy}"],
            "relay cannot listen on 127.0.0.1:{busy}",
        ),
        (
            ["relay", "--port", "{free}", "--redis-url", "redis://127.0.0.1:1/0"],
            "cannot use Redis at redis://127.0.0.1:1/0",
        ),
        (
            ["api", "--port", "{free}", "--database-url", "nonsense://x"],
            "invalid database URL nonsense://x",
        ),
        (
            [
                "relay",
                "--port",
                "{free}",
                "--database-url",
                "postgresql://svc:hunter2@127.0.0.1:1/db",
            ],
            "cannot use the database at postgresql://svc:***@127.0.0.1:1/db",
        ),
    ],
)
def test_start_up_failures_are_one_clear_line(
    tmp_path: Path, command: list[str], expected: str
) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        ports = {"busy": str(busy.getsockname()[1]), "free": str(free_port())}
        args = [part.format(**ports) for part in command] + ["--data-dir", str(tmp_path / "server")]
        proc = start(args)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    assert "Traceback" not in err and "hunter2" not in err + out
    # One line: ours, with nothing before it (gRPC's C core logs a failed bind itself).
    (line,) = err.strip().splitlines()
    assert line.startswith(f"svc: {expected.format(**ports)}")
