"""Messages as a user writes them: one ``Channel.send()`` per message, the receiver
iterating ``messages()`` in another process, through ``svc up`` — beside AGNTCY SLIM with
MLS on, measured the same way in the same invocation.

    python bench/e2e.py [--runs 3] [--messages 20000] [--round-trips 500] [--warm-up 20]
                        [--async] [--slim] [--slim-stock-ffi] [--slim-stock-tcp]
                        [--json results.json]

Each run starts a fresh ``svc up`` on free loopback ports (``svc_sdk.testing.LocalStack``)
and two agents, each in its own process: a sender that creates the channel and a
receiver that joins it from the Welcome and loops over ``channel.messages()``. Then:

- round trips: ``--round-trips`` pings of 256 B, one at a time, after ``--warm-up``; the
  receiver answers each with a 256 B reply through the same channel; p50 and p99 (ms);
- throughput at 256 B and 16 KiB: ``--messages`` messages back to back, one ``send()``
  call each; the clock starts before the first ``send()`` and stops when the receiver's
  reply to the last message arrives (msg/s).

``--slim`` runs the same protocol on AGNTCY SLIM in the same run (``pip install
'svc-sdk[bench]'``, i.e. slim-bindings 3.3.8 from PyPI): its own node process, a receiver
and a sender, a GROUP session with MLS on, one ``publish_async`` per message, the receiver
looping on ``get_message_async``. SLIM is compared at its best: its client sets
TCP_NODELAY off and its node never sets it (round trips of ~88 ms stock), so an
LD_PRELOAD shim (``bench/nodelay/nodelay_shim.c``, compiled here with gcc) forces it on
for SLIM's processes; and the uniffi bindings' byte-by-byte copy of every outgoing
payload is replaced by one memmove (``--slim-stock-ffi`` keeps the stock copy;
``--slim-stock-tcp`` runs SLIM without the shim).

``--async`` adds a column for svc's asyncio API (``svc_sdk.aio``: ``await channel.send``,
``async for payload in channel.messages()``), each agent on ``asyncio.run``'s loop; while
the SDK lacks part of it the column says what, "n/a (no async send())". SLIM's API is
async only: its column uses the same loops (:func:`drive_async`, :func:`serve_async`).

Prints one markdown table: svc, SLIM, svc ÷ SLIM and the issue's target side by side,
medians of ``--runs`` runs, then each run's figures. Not part of the test suite.
"""

from __future__ import annotations

# A blocking agent's process, spawned, imports this module and must load only what a
# user's blocking program would: its peak RSS is one of the figures. So what only the
# parent, SLIM's roles or the async agents use (asyncio, argparse, json, subprocess,
# statistics, importlib.metadata, ...: ~2 MiB in each agent) is imported where it is used.
import importlib
import multiprocessing as mp
import os
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import subprocess

HERE = Path(__file__).resolve().parent
SHIM_SOURCE = HERE / "nodelay" / "nodelay_shim.c"
SLIM_VERSION = "3.3.8"
SLIM_SECRET = "svc-bench-e2e-shared-secret-0123456789abcdef"

# The targets (issue 17), per row of the table.
TARGETS = {
    "tput_256": "≥ 10,000",
    "tput_16384": "≥ 6,600",
    "rtt_p50_ms": "≤ 1.0",
    "rtt_p99_ms": "≤ 1.5",
}

FILL = 0x5A  # every throughput payload is b"T" + FILL * (size - 1)


@dataclass
class Plan:
    messages: int
    round_trips: int
    warm_up: int
    sizes: tuple[int, ...] = (256, 16384)
    ping_size: int = 256
    timeout: float = 120.0  # seconds to wait for any one reply
    # The relay's (svc up's) or SLIM node's process: the sender reads its CPU time over
    # each phase (0: not read).
    server_pid: int = 0


# -- the protocol, the same for svc and SLIM ------------------------------------------
#
# Payloads start with a tag byte. Sender → receiver: P ping (answered with p and the same
# bytes), R<n> reset the count to expect n messages (answered with r), T a throughput
# message (the n-th is answered with "D<n> <corrupt>"), C how many so far (answered with
# c<n>), X stop (answered with x). Throughput messages are checked for corruption.


def _reply_to(payload: bytes, state: list[int]) -> bytes | None:
    """The receiver's answer to ``payload`` (None: none); ``state`` is [count, expected,
    corrupt, process CPU ns at the reset]."""
    tag = payload[:1]
    if tag == b"T":
        state[0] += 1
        if payload.count(FILL) != len(payload) - 1:
            state[2] += 1
        if state[0] == state[1]:
            cpu_us = (time.process_time_ns() - state[3]) // 1000
            return b"D%d %d %d" % (state[0], state[2], cpu_us)
        return None
    if tag == b"P":
        return b"p" + payload[1:]
    if tag == b"R":
        state[:] = [0, int(payload[1:]), 0, time.process_time_ns()]
        return b"r"
    if tag == b"C":
        return b"c%d" % state[0]
    if tag == b"X":
        return b"x"
    return None


def serve(payloads: Iterator[bytes], send: Callable[[bytes], object]) -> None:
    """The receiver, blocking: answers what :func:`drive` sends until X."""
    state = [0, 0, 0, 0]
    for payload in payloads:
        answer = _reply_to(payload, state)
        if answer is not None:
            send(answer)
            if answer == b"x":
                return


async def serve_async(
    payloads: AsyncIterator[bytes], send: Callable[[bytes], Awaitable[object]]
) -> None:
    """The receiver, asyncio: the same as :func:`serve`."""
    state = [0, 0, 0, 0]
    async for payload in payloads:
        answer = _reply_to(payload, state)
        if answer is not None:
            await send(answer)
            if answer == b"x":
                return


def _ping(i: int, size: int) -> bytes:
    return b"P" + i.to_bytes(8, "big") + b"\0" * (size - 9)


def _percentiles(samples_ms: list[float]) -> tuple[float, float]:
    import statistics

    ordered = sorted(samples_ms)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def _process_cpu_ns(pid: int) -> int | None:
    """User and system CPU time of process ``pid``, all its threads (None: not readable)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    ticks = int(fields[11]) + int(fields[12])  # utime and stime, the stat's 14th and 15th
    return ticks * 1_000_000_000 // os.sysconf("SC_CLK_TCK")


class _Phase:
    """CPU time of this process and of the server (``plan.server_pid``) over a phase."""

    def __init__(self, plan: Plan) -> None:
        self._pid = plan.server_pid
        self.cpu_ns = time.process_time_ns()
        self.server_ns = _process_cpu_ns(self._pid) if self._pid else None

    def end(self) -> tuple[int, int | None]:
        cpu = time.process_time_ns() - self.cpu_ns
        server = _process_cpu_ns(self._pid) if self._pid else None
        if server is None or self.server_ns is None:
            return cpu, None
        return cpu, server - self.server_ns


def _throughput(
    size: int,
    n: int,
    received: int,
    start: float,
    end: float,
    reply: bytes,
    cpu: tuple[int, int | None],
) -> dict[str, Any]:
    """One size's figures; ``cpu``: the sender's and the server's CPU time over the
    phase, in ns. CPU per message is the figure that noise on a shared machine moves
    least."""
    cpu_ns, server_ns = cpu
    fields = reply.split()
    done = reply[:1] == b"D"
    return {
        "size": size,
        "n": n,
        "received": received,
        "msgs_per_s": received / (end - start),
        "seconds": end - start,
        "corrupt": int(fields[1]) if done else None,
        "sender_cpu_us": cpu_ns / 1000 / received if received else None,
        "receiver_cpu_us": int(fields[2]) / received if done and received else None,
        "server_cpu_us": None if server_ns is None or not received else server_ns / 1000 / received,
    }


def _round_trips(samples_ms: list[float], cpu: tuple[int, int | None]) -> dict[str, Any]:
    """The round trips' figures: p50 and p99, and the sender's and the server's CPU time
    per round trip (a ping and its answer: two messages through the server, each alone,
    so nothing is shared with another message's work)."""
    p50, p99 = _percentiles(samples_ms)
    cpu_ns, server_ns = cpu
    n = len(samples_ms)
    return {
        "rtt_p50_ms": p50,
        "rtt_p99_ms": p99,
        "rtt_sender_cpu_us": cpu_ns / 1000 / n,
        "rtt_server_cpu_us": None if server_ns is None else server_ns / 1000 / n,
        "tput": {},
    }


def drive(send: Callable[[bytes], object], replies: Iterator[bytes], plan: Plan) -> dict[str, Any]:
    """The sender, blocking: round trips, then throughput at each size."""

    def expect(tag: bytes) -> bytes:
        for payload in replies:
            if payload[:1] == tag:
                return payload
        raise TimeoutError(f"no {tag!r} reply within {plan.timeout} s")

    samples = []
    phase = _Phase(plan)
    for i in range(plan.warm_up + plan.round_trips):
        if i == plan.warm_up:
            phase = _Phase(plan)
        ping = _ping(i, plan.ping_size)
        start = time.perf_counter()
        send(ping)
        answer = expect(b"p")
        elapsed = time.perf_counter() - start
        assert answer[1:] == ping[1:], "reply does not match its ping"
        if i >= plan.warm_up:
            samples.append(elapsed * 1000)
    result = _round_trips(samples, phase.end())
    for size in plan.sizes:
        send(b"R%d" % plan.messages)
        expect(b"r")
        body = b"T" + bytes([FILL]) * (size - 1)
        start, phase = time.perf_counter(), _Phase(plan)
        for _ in range(plan.messages):
            send(body)
        try:
            done, received = expect(b"D"), plan.messages
        except TimeoutError:
            send(b"C")
            done = expect(b"c")
            received = int(done[1:])
        end, cpu = time.perf_counter(), phase.end()
        result["tput"][str(size)] = _throughput(
            size, plan.messages, received, start, end, done, cpu
        )
    send(b"X")
    expect(b"x")
    return result


async def drive_async(
    send: Callable[[bytes], Awaitable[object]], replies: AsyncIterator[bytes], plan: Plan
) -> dict[str, Any]:
    """The sender, asyncio: the same as :func:`drive`."""

    async def expect(tag: bytes) -> bytes:
        async for payload in replies:
            if payload[:1] == tag:
                return payload
        raise TimeoutError(f"no {tag!r} reply within {plan.timeout} s")

    samples = []
    phase = _Phase(plan)
    for i in range(plan.warm_up + plan.round_trips):
        if i == plan.warm_up:
            phase = _Phase(plan)
        ping = _ping(i, plan.ping_size)
        start = time.perf_counter()
        await send(ping)
        answer = await expect(b"p")
        elapsed = time.perf_counter() - start
        assert answer[1:] == ping[1:], "reply does not match its ping"
        if i >= plan.warm_up:
            samples.append(elapsed * 1000)
    result = _round_trips(samples, phase.end())
    for size in plan.sizes:
        await send(b"R%d" % plan.messages)
        await expect(b"r")
        body = b"T" + bytes([FILL]) * (size - 1)
        start, phase = time.perf_counter(), _Phase(plan)
        for _ in range(plan.messages):
            await send(body)
        try:
            done, received = await expect(b"D"), plan.messages
        except TimeoutError:
            await send(b"C")
            done = await expect(b"c")
            received = int(done[1:])
        end, cpu = time.perf_counter(), phase.end()
        result["tput"][str(size)] = _throughput(
            size, plan.messages, received, start, end, done, cpu
        )
    await send(b"X")
    await expect(b"x")
    return result


def _peak_rss_mib() -> float:
    """This process's peak RSS. Not ru_maxrss: Linux carries that across exec, so a child
    would report at least what its parent held when it started the child."""
    return _vmhwm_mib("self") or 0.0


# -- svc ------------------------------------------------------------------------------
#
# The agents import svc_sdk themselves (the SLIM processes below never load it).


def svc_receiver(stack: dict[str, str], channel: str, conn: Any) -> None:
    from svc_sdk import SvcClient

    with tempfile.TemporaryDirectory() as root:
        client = SvcClient(stack["relay"], root, b"receiver", stack["key"], stack["api"])
        conn.send(client.generate_key_package())
        chan = client.join_channel(channel, conn.recv())
        conn.send("ready")
        serve(chan.messages(timeout=300), chan.send)
        client.close()
    conn.send({"maxrss_mib": _peak_rss_mib()})


def svc_sender(stack: dict[str, str], channel: str, plan: Plan, conn: Any) -> None:
    from svc_sdk import SvcClient

    with tempfile.TemporaryDirectory() as root:
        client = SvcClient(stack["relay"], root, b"sender", stack["key"], stack["api"])
        chan = client.create_channel(channel)
        conn.send(chan.add_member(conn.recv()))
        assert conn.recv() == "go"
        plan = replace(plan, server_pid=int(stack["pid"]))
        result = drive(chan.send, chan.messages(timeout=plan.timeout), plan)
        client.close()
    result["maxrss_mib"] = _peak_rss_mib()
    conn.send(result)


def svc_async_api() -> str | None:
    """Why svc's asyncio API cannot run this benchmark (None: it can): it needs
    ``svc_sdk.aio.AsyncSvcClient`` and an ``AsyncChannel`` with ``await send()`` and
    ``async for`` over ``messages()``."""
    import inspect

    try:
        aio = importlib.import_module("svc_sdk.aio")
    except ImportError:
        return "no async API"
    channel = getattr(aio, "AsyncChannel", None)
    if channel is None or not hasattr(aio, "AsyncSvcClient"):
        return "no async API"
    if not inspect.iscoroutinefunction(getattr(channel, "send", None)):
        return "no async send()"
    return None


# The asyncio API is reached through importlib (an Any): the benchmark type-checks
# against SDKs without it, or without all of it.


def svc_async_receiver(stack: dict[str, str], channel: str, conn: Any) -> None:
    import asyncio

    asyncio.run(_svc_async_receiver(stack, channel, conn))


async def _svc_async_receiver(stack: dict[str, str], channel: str, conn: Any) -> None:
    aio = importlib.import_module("svc_sdk.aio")
    with tempfile.TemporaryDirectory() as root:
        client = await aio.AsyncSvcClient.connect(
            stack["relay"], root, b"receiver", stack["key"], stack["api"]
        )
        conn.send(client.generate_key_package())
        chan = await client.join_channel(channel, conn.recv())
        conn.send("ready")
        await serve_async(chan.messages(timeout=300), chan.send)
        await client.aclose()
    conn.send({"maxrss_mib": _peak_rss_mib()})


def svc_async_sender(stack: dict[str, str], channel: str, plan: Plan, conn: Any) -> None:
    import asyncio

    asyncio.run(_svc_async_sender(stack, channel, plan, conn))


async def _svc_async_sender(stack: dict[str, str], channel: str, plan: Plan, conn: Any) -> None:
    aio = importlib.import_module("svc_sdk.aio")
    with tempfile.TemporaryDirectory() as root:
        client = await aio.AsyncSvcClient.connect(
            stack["relay"], root, b"sender", stack["key"], stack["api"]
        )
        chan = await client.create_channel(channel)
        conn.send(await chan.add_member(conn.recv()))
        assert conn.recv() == "go"
        plan = replace(plan, server_pid=int(stack["pid"]))
        result = await drive_async(chan.send, chan.messages(timeout=plan.timeout), plan)
        await client.aclose()
    result["maxrss_mib"] = _peak_rss_mib()
    conn.send(result)


def bytecode_as_installed() -> None:
    """Writes svc_sdk's bytecode where Python looks for it, as pip does when it installs
    the package. Agents then load the SDK as a user's do: one that compiles its ~9,000
    lines at start (an editable install with PYTHONDONTWRITEBYTECODE set, as on the
    project's machine) holds ~1.7 MiB more. Up-to-date files are left as they are."""
    import compileall

    import svc_sdk

    compileall.compile_dir(Path(svc_sdk.__file__).parent, quiet=1)


def agent_pair(
    prefix: str,
    receive: Callable[..., None],
    send: Callable[..., None],
    send_arg: Any,
) -> tuple[Any, Any]:
    """Runs a receiver and a sender, each in its own process, through a fresh ``svc up``;
    returns what each sent back last. ``receive(stack, channel, conn)`` sends its key
    package, gets the Welcome, says "ready", then its result; ``send(stack, channel,
    send_arg, conn)`` gets the key package, sends the Welcome, waits for "go", then sends
    its result. ``prefix`` starts the channel's name."""
    import uuid

    from svc_sdk.testing import LocalStack

    bytecode_as_installed()
    ctx = mp.get_context("spawn")
    channel = f"{prefix}/{uuid.uuid4().hex[:12]}"
    with LocalStack() as running:
        stack = {
            "relay": running.relay_url,
            "api": running.api_url,
            "key": running.api_key,
            "pid": str(running.pid),
        }
        to_receiver, receiver_end = ctx.Pipe()
        to_sender, sender_end = ctx.Pipe()
        receiver = ctx.Process(target=receive, args=(stack, channel, receiver_end))
        sender = ctx.Process(target=send, args=(stack, channel, send_arg, sender_end))
        receiver.start()
        sender.start()
        try:
            to_sender.send(to_receiver.recv())  # key package
            to_receiver.send(to_sender.recv())  # Welcome
            assert to_receiver.recv() == "ready"
            to_sender.send("go")
            return to_sender.recv(), to_receiver.recv()
        finally:
            for proc in (sender, receiver):
                proc.join(30)
                if proc.is_alive():
                    proc.kill()


def svc_run(plan: Plan, use_async: bool = False) -> dict[str, Any]:
    """One run through a fresh ``svc up``: sender and receiver in their own processes,
    with the blocking API or (``use_async``) the asyncio one."""
    receive, send = (
        (svc_async_receiver, svc_async_sender) if use_async else (svc_receiver, svc_sender)
    )
    result, received = agent_pair("bench/e2e", receive, send, plan)
    result["receiver_maxrss_mib"] = received["maxrss_mib"]
    assert isinstance(result, dict)
    return result


# -- SLIM -----------------------------------------------------------------------------
#
# Three processes of this script (--role): the node, the receiver, the sender. Only they
# import slim_bindings, which has no type information: it is an Any here.


def _slim() -> Any:
    return importlib.import_module("slim_bindings")


def _fast_ffi() -> None:
    """uniffi's generated Python copies every outgoing bytes argument into the RustBuffer
    one byte at a time (``_UniffiRustBufferBuilder.write``); one memmove instead."""
    import ctypes

    ns = importlib.import_module("slim_bindings._slim_bindings.slim_bindings")

    def write(self: Any, value: bytes) -> None:
        n = len(value)
        if n == 0:
            return
        with self._reserve(n):
            dst = ctypes.cast(self.rbuf.data, ctypes.c_void_p).value
            assert dst is not None
            ctypes.memmove(dst + self.rbuf.len, bytes(value), n)

    ns._UniffiRustBufferBuilder.write = write


async def _slim_node(address: str) -> None:
    import asyncio

    s = _slim()
    s.initialize_with_defaults()
    await s.get_global_service().run_server_async(s.new_insecure_server_config(address))
    print("slim node up", flush=True)
    while True:
        await asyncio.sleep(3600)


async def _slim_app(endpoint: str, name: str, fast_ffi: bool) -> tuple[Any, Any, Any]:
    import asyncio

    s = _slim()
    if fast_ffi:
        _fast_ffi()
    s.uniffi_set_event_loop(asyncio.get_running_loop())
    tracing = s.new_tracing_config()
    tracing.log_level = "warn"
    s.initialize_with_configs(
        tracing_config=tracing,
        runtime_config=s.new_runtime_config(),
        service_config=[s.new_service_config()],
    )
    service = s.get_global_service()
    conn = await service.connect_async(s.new_insecure_client_config(endpoint))
    own = s.Name.from_string(name)
    app = service.create_app_with_secret(own, SLIM_SECRET)  # _async panics in 3.3.8
    await app.subscribe_async(own, conn)
    return s, conn, app


class _SlimMessages:
    """A SLIM session's incoming payloads as an async iterator, like ``messages()``: it
    ends (for this ``async for``; the next one goes on) after ``timeout`` s of silence."""

    def __init__(self, session: Any, timeout: float) -> None:
        import datetime

        self._session = session
        self._timeout = datetime.timedelta(seconds=timeout)

    def __aiter__(self) -> _SlimMessages:
        return self

    async def __anext__(self) -> bytes:
        try:
            message = await self._session.get_message_async(self._timeout)
        except Exception:  # SLIM raises its own error on timeout
            raise StopAsyncIteration from None
        return bytes(message.payload)


def _publisher(session: Any) -> Callable[[bytes], Awaitable[object]]:
    def send(payload: bytes) -> Awaitable[object]:
        return session.publish_async(payload, None, None)  # type: ignore[no-any-return]

    return send


async def _slim_receiver(endpoint: str, out: str, fast_ffi: bool) -> None:
    import asyncio
    import json

    _, _, app = await _slim_app(endpoint, "bench/e2e/receiver", fast_ffi)
    print("READY", flush=True)
    session = await app.listen_for_session_async(None)
    await serve_async(_SlimMessages(session, 300), _publisher(session))
    await asyncio.sleep(0.3)  # let the last reply leave
    Path(out).write_text(json.dumps({"maxrss_mib": _peak_rss_mib()}))


async def _slim_sender(endpoint: str, out: str, fast_ffi: bool, plan: Plan) -> None:
    import datetime
    import json
    import uuid

    s, conn, app = await _slim_app(endpoint, "bench/e2e/sender", fast_ffi)
    peer = s.Name.from_string("bench/e2e/receiver")
    mls = s.MlsSettings(
        header_integrity_validation_percent=100, max_seen_control_message_ids_size=None
    )
    config = s.SessionConfig(
        session_type=s.SessionType.GROUP,
        max_retries=5,
        interval=datetime.timedelta(seconds=1),
        metadata={},
        mls_settings=mls,
    )
    created = await app.create_session_async(
        config, s.Name.from_string(f"bench/e2e/chan-{uuid.uuid4().hex[:8]}")
    )
    await created.completion.wait_async()
    session = created.session
    await app.set_route_async(peer, conn)
    await (await session.invite_async(peer)).wait_async()
    result = await drive_async(_publisher(session), _SlimMessages(session, plan.timeout), plan)
    result["maxrss_mib"] = _peak_rss_mib()
    Path(out).write_text(json.dumps(result))


def slim_role(argv: list[str]) -> None:
    import argparse
    import asyncio
    import json

    parser = argparse.ArgumentParser(prog="e2e.py --role")
    parser.add_argument("--role", choices=["slim-node", "slim-recv", "slim-send"])
    parser.add_argument("--address", required=True)
    parser.add_argument("--out", default="")
    parser.add_argument("--fast-ffi", action="store_true")
    parser.add_argument("--plan", default="{}")
    args = parser.parse_args(argv)
    endpoint = f"http://{args.address}"
    if args.role == "slim-node":
        asyncio.run(_slim_node(args.address))
    elif args.role == "slim-recv":
        asyncio.run(_slim_receiver(endpoint, args.out, args.fast_ffi))
    else:
        fields = json.loads(args.plan)
        plan = Plan(**{**fields, "sizes": tuple(fields["sizes"])})
        asyncio.run(_slim_sender(endpoint, args.out, args.fast_ffi, plan))


def build_shim(directory: Path) -> Path:
    """Compiles the TCP_NODELAY shim for SLIM's processes."""
    import shutil
    import subprocess

    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        raise SystemExit("--slim needs gcc (or cc) to build bench/nodelay/nodelay_shim.c")
    library = directory / "nodelay_shim.so"
    subprocess.run(
        [gcc, "-O2", "-shared", "-fPIC", "-o", str(library), str(SHIM_SOURCE), "-ldl"], check=True
    )
    return library


def _wait_for(proc: subprocess.Popen[bytes], log: Path, needle: str, seconds: float) -> None:
    """Polls a log file (a full pipe would block the child) for ``needle``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if needle in log.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            raise RuntimeError(f"{log.name}: exited with {proc.returncode}: {log.read_text()}")
        time.sleep(0.02)
    raise TimeoutError(f"{log.name}: no {needle!r} in {seconds} s")


def _free_port() -> int:
    sys.path.insert(0, str(HERE.parent))
    from tests.support import free_port

    return free_port()


def slim_run(plan: Plan, shim: Path | None, fast_ffi: bool, scratch: Path) -> dict[str, Any]:
    """One run on a fresh SLIM node: node, receiver and sender in their own processes,
    all with TCP_NODELAY forced by the shim (unless it is None)."""
    import json
    import subprocess
    import uuid

    address = f"127.0.0.1:{_free_port()}"
    env = dict(os.environ)
    if shim is not None:
        env["LD_PRELOAD"] = str(shim)
    me = [sys.executable, str(Path(__file__).resolve())]
    flags = ["--address", address, *(["--fast-ffi"] if fast_ffi else [])]
    run = scratch / uuid.uuid4().hex[:8]
    run.mkdir()
    procs: list[subprocess.Popen[bytes]] = []

    def start(role: str, *extra: str) -> tuple[subprocess.Popen[bytes], Path]:
        log = run / f"{role}.log"
        with log.open("wb") as sink:
            proc = subprocess.Popen(
                [*me, "--role", role, *flags, *extra], env=env, stdout=sink, stderr=sink
            )
        procs.append(proc)
        return proc, log

    try:
        node, node_log = start("slim-node")
        _wait_for(node, node_log, "slim node up", 30)
        receiver, receiver_log = start("slim-recv", "--out", str(run / "recv.json"))
        _wait_for(receiver, receiver_log, "READY", 30)
        plan_json = json.dumps(asdict(replace(plan, server_pid=node.pid)))
        sender, sender_log = start(
            "slim-send", "--out", str(run / "send.json"), "--plan", plan_json
        )
        if sender.wait(900) != 0:
            raise RuntimeError(f"SLIM sender failed: {sender_log.read_text()}")
        receiver.wait(30)
        result: dict[str, Any] = json.loads((run / "send.json").read_text())
        result["receiver_maxrss_mib"] = json.loads((run / "recv.json").read_text())["maxrss_mib"]
        result["node_vmhwm_mib"] = _vmhwm_mib(node.pid)
        return result
    finally:
        for proc in reversed(procs):  # only what this run started
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def _vmhwm_mib(pid: int | str) -> float | None:
    return _status_mib(pid, "VmHWM")


def _status_mib(pid: int | str, field: str) -> float | None:
    """A memory field of ``/proc/<pid>/status`` (VmRSS, VmHWM, ...) in MiB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


# -- the table ------------------------------------------------------------------------


def _median(runs: list[dict[str, Any]], key: str) -> float | None:
    import statistics

    values = [_value(r, key) for r in runs]
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _value(run: dict[str, Any], key: str) -> float | None:
    if key.startswith("tput_"):
        return float(run["tput"][key.removeprefix("tput_")]["msgs_per_s"])
    if key.startswith(("sender_cpu_us_", "receiver_cpu_us_", "server_cpu_us_")):
        field, _, size = key.rpartition("_")
        value = run["tput"][size].get(field)
        return None if value is None else float(value)
    value = run.get(key)
    return None if value is None else float(value)


def _cell(value: float | None, key: str) -> str:
    if value is None:
        return "-"
    if key.startswith("tput_"):
        return f"{value:,.0f}"
    return f"{value:.1f}" if key.endswith("mib") or "_cpu_us" in key else f"{value:.2f}"


ROWS = [
    ("tput_256", "256 B, msg/s, one send per message"),
    ("tput_16384", "16 KiB, msg/s, one send per message"),
    ("rtt_p50_ms", "round trip 256 B, p50 ms"),
    ("rtt_p99_ms", "round trip 256 B, p99 ms"),
    ("maxrss_mib", "sender peak RSS, MiB"),
    ("receiver_maxrss_mib", "receiver peak RSS, MiB"),
    # Process CPU time (all threads) over a phase: the round trips ÷ round trips (two
    # messages each, one at a time), a throughput phase ÷ messages. The server is svc
    # up's process (the relay; the account API is a child, idle meanwhile) or SLIM's
    # node, read from /proc in clock ticks (10 ms): over 500 round trips its figure is
    # good to about ±40 µs; compare servers with --round-trips 2000 or more.
    ("rtt_sender_cpu_us", "sender CPU µs per round trip"),
    ("rtt_server_cpu_us", "relay / node CPU µs per round trip"),
    ("sender_cpu_us_256", "sender CPU µs per message, 256 B"),
    ("receiver_cpu_us_256", "receiver CPU µs per message, 256 B"),
    ("server_cpu_us_256", "relay / node CPU µs per message, 256 B"),
    ("sender_cpu_us_16384", "sender CPU µs per message, 16 KiB"),
    ("receiver_cpu_us_16384", "receiver CPU µs per message, 16 KiB"),
    ("server_cpu_us_16384", "relay / node CPU µs per message, 16 KiB"),
]


def print_table(columns: dict[str, list[dict[str, Any]] | str], runs: int) -> None:
    names = list(columns)
    svc, peer = columns["svc (sync)"], next((columns[n] for n in names if "SLIM" in n), None)
    ratio = isinstance(svc, list) and isinstance(peer, list) and bool(peer)
    extra = " svc ÷ SLIM |" if ratio else ""
    print(f"| measure (median of {runs} runs) | " + " | ".join(names) + f" |{extra} target |")
    print("|---|" + "---:|" * (len(names) + 1 + ratio))
    for key, label in ROWS:
        cells = []
        for name in names:
            column = columns[name]
            cells.append(column if isinstance(column, str) else _cell(_median(column, key), key))
        if ratio:
            assert isinstance(svc, list) and isinstance(peer, list)
            mine, theirs = _median(svc, key), _median(peer, key)
            cells.append(f"{mine / theirs:.2f}x" if mine is not None and theirs else "-")
        target = TARGETS.get(key, "")
        print(f"| {label} | " + " | ".join(cells) + f" | {target} |")
    for name, column in columns.items():
        if isinstance(column, str) or not column:
            continue
        print(f"\n{name}, each run:")
        for key, label in ROWS[:4]:
            print(f"  {label}: " + ", ".join(_cell(_value(r, key), key) for r in column))
        lost = [
            f"{t['size']} B: {t['received']}/{t['n']}, {t['corrupt']} corrupt"
            for r in column
            for t in r["tput"].values()
            if t["received"] != t["n"] or t["corrupt"]
        ]
        if lost:
            print("  NOT ALL RECEIVED INTACT: " + "; ".join(lost))


def main() -> int:
    if "--role" in sys.argv[1:]:
        slim_role(sys.argv[1:])
        return 0
    import argparse
    import datetime
    import importlib.metadata
    import json
    import shutil

    from svc_sdk._argtypes import whole_number

    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=whole_number(1), default=3)
    parser.add_argument("--messages", type=whole_number(1), default=20000)
    parser.add_argument("--round-trips", type=whole_number(1), default=500)
    parser.add_argument("--warm-up", type=whole_number(0), default=20)
    parser.add_argument(
        "--async", dest="use_async", action="store_true", help="add svc's asyncio API rows"
    )
    parser.add_argument("--slim", action="store_true", help="run AGNTCY SLIM beside svc")
    parser.add_argument(
        "--slim-stock-ffi", action="store_true", help="keep uniffi's byte-by-byte copy"
    )
    parser.add_argument(
        "--slim-stock-tcp",
        action="store_true",
        help="run SLIM without the TCP_NODELAY shim (round trips of ~88 ms)",
    )
    parser.add_argument("--json", type=Path, help="write every run's figures here")
    args = parser.parse_args()
    plan = Plan(args.messages, args.round_trips, args.warm_up)
    columns: dict[str, list[dict[str, Any]] | str] = {"svc (sync)": []}
    if args.use_async:
        missing = svc_async_api()
        columns["svc (async)"] = [] if missing is None else f"n/a ({missing})"
    scratch = Path(tempfile.mkdtemp(prefix="svc-e2e-"))
    try:
        shim = None
        if args.slim:
            try:
                installed = importlib.metadata.version("slim-bindings")
            except importlib.metadata.PackageNotFoundError:
                raise SystemExit(
                    "--slim needs slim-bindings: pip install 'svc-sdk[bench]'"
                ) from None
            tcp = "stock TCP" if args.slim_stock_tcp else "TCP_NODELAY forced"
            slim_name = f"SLIM {installed}, MLS ({tcp})"
            columns[slim_name] = []
            shim = None if args.slim_stock_tcp else build_shim(scratch)
        print(f"load before: {Path('/proc/loadavg').read_text().split()[:3]}", file=sys.stderr)
        for i in range(args.runs):
            svc_column = columns["svc (sync)"]
            assert isinstance(svc_column, list)
            svc_column.append(svc_run(plan))
            _progress(f"run {i + 1} svc", svc_column[-1])
            async_column = columns.get("svc (async)")
            if isinstance(async_column, list):
                async_column.append(svc_run(plan, use_async=True))
                _progress(f"run {i + 1} svc async", async_column[-1])
            if args.slim:
                slim_column = columns[slim_name]
                assert isinstance(slim_column, list)
                slim_column.append(slim_run(plan, shim, not args.slim_stock_ffi, scratch))
                _progress(f"run {i + 1} SLIM", slim_column[-1])
        print(f"load after: {Path('/proc/loadavg').read_text().split()[:3]}", file=sys.stderr)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(
        f"End to end, {args.messages:,} messages per size, round trips {args.round_trips} "
        f"after {args.warm_up} warm-up; {os.cpu_count()} cores; "
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC"
    )
    if args.slim:
        ffi = "stock uniffi copy" if args.slim_stock_ffi else "uniffi byte loop replaced by memmove"
        tcp = "stock TCP (Nagle on)" if args.slim_stock_tcp else "TCP_NODELAY forced (LD_PRELOAD)"
        print(f"SLIM: GROUP session, MLS on, {tcp}, {ffi}")
    print()
    print_table(columns, args.runs)
    if args.json:
        args.json.write_text(json.dumps({k: v for k, v in columns.items()}, indent=1))
    return 0


def _progress(what: str, run: dict[str, Any]) -> None:
    figures = ", ".join(f"{label} {_cell(_value(run, key), key)}" for key, label in ROWS[:4])
    print(f"{what}: {figures}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
