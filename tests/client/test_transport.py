"""The relay stream in the native extension (svc_sdk._native.RelayChannel/RelayStream,
driven by svc_sdk.relay_client.RelayConnection) against relays that misbehave: a real
gRPC server on a free loopback port plays each one. Whatever the relay does, the client's
loop is never blocked, waiting requests fail with a clear error, and the stream ends."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from svc_sdk._native import RECEIVE_HIGH_WATER, RelayChannel, RelayStream
from svc_sdk._relay_pb import relay_pb2 as pb
from svc_sdk.errors import TransportError
from svc_sdk.relay_client import MAX_FRAME, Code, RelayConnection, StreamError
from svc_sdk.testing import LocalStack

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module", autouse=True)
async def one_loop_for_the_module() -> None:
    """Holds one event loop for every test here. grpc.aio's poller thread hands each
    completion to the loop its call started on; a fake relay stopped at one test's end can
    still complete a call after that test's loop has closed, and grpc then raises "Event
    loop is closed" inside whichever test runs next. On one loop, that late completion
    lands on an open loop and is simply done. (anyio keeps its runner, and so its loop, for
    as long as any async fixture is set up.)"""


Behaviour = Callable[[AsyncIterator[bytes], Any], AsyncIterator[bytes]]


async def serve(
    behaviour: Behaviour | Callable[[AsyncIterator[bytes], Any], Awaitable[None]],
    *,
    accept: bool = True,
    tls: tuple[bytes, bytes] | None = None,
) -> tuple[grpc.aio.Server, int]:
    """A relay on a free loopback port whose one stream does ``behaviour`` (raw frames in,
    raw frames out); with ``accept``, after accepting the stream as the relay does, by
    sending its initial metadata. ``tls`` is (certificate, key) in PEM."""
    handler = behaviour
    if accept:

        async def accepted(frames: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
            await context.send_initial_metadata(())
            async for frame in behaviour(frames, context):  # type: ignore[union-attr]
                yield frame

        handler = accepted
    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "svc.relay.v1.Relay", {"Connect": grpc.stream_stream_rpc_method_handler(handler)}
            ),
        )
    )
    if tls is None:
        port = server.add_insecure_port("127.0.0.1:0")
    else:
        cert, key = tls
        port = server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials([(key, cert)]))
    await server.start()
    return server, port


def reply_to(data: bytes) -> bytes:
    request = pb.ClientFrame.FromString(data)
    return pb.ServerFrame(reply=pb.Reply(request_id=request.request_id)).SerializeToString()


async def echo(frames: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
    async for data in frames:
        yield reply_to(data)


async def garbage(frames: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
    """Answers every frame with bytes that are not a ServerFrame."""
    async for _ in frames:
        yield b"\xff\xff\xff"


async def refuse(frames: AsyncIterator[bytes], context: Any) -> None:
    """Refuses the stream as the relay refuses an expired token."""
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, "token expired")


def deaf_until(stop: asyncio.Event) -> Behaviour:
    """Reads nothing and says nothing until ``stop`` is set, then hangs up."""

    async def deaf(frames: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        await stop.wait()
        return
        # Never reached: makes this an async generator.
        yield b""  # type: ignore[unreachable]  # pragma: no cover

    return deaf


async def relay_with(behaviour: Behaviour, test: Callable[[str], Awaitable[None]]) -> None:
    server, port = await serve(behaviour)
    try:
        await test(f"http://127.0.0.1:{port}")
    finally:
        await server.stop(None)


async def test_a_well_behaved_stream_answers_requests_in_order() -> None:
    async def test(url: str) -> None:
        async with RelayConnection(url, "token", b"agent") as conn:
            futures = [await conn.send(pb.Unsubscribe(channel=f"a/b/{i}")) for i in range(200)]
            replies = await asyncio.gather(*futures)
            assert [r.request_id for r in replies] == list(range(1, 201))
            assert conn.closed is not None and not conn.closed.done()

    await relay_with(echo, test)


async def test_a_request_given_up_on_is_forgotten() -> None:
    """A relay that never answers: a request whose wait timed out, or whose future its
    thread cancelled, leaves the map of requests waiting for a Reply."""
    stop = asyncio.Event()

    async def test(url: str) -> None:
        conn = RelayConnection(url, "token", b"agent")
        await conn.open()
        for _ in range(20):
            with pytest.raises(TimeoutError):
                await conn.request(pb.Unsubscribe(channel="a/b/c"), timeout=0.01)
        cancelled = conn.send_threadsafe(pb.Unsubscribe(channel="a/b/c"))
        kept = await conn.send(pb.Unsubscribe(channel="a/b/c"))
        assert conn.waiting == 2
        assert cancelled.cancel()
        await asyncio.sleep(0)  # an asyncio future's callbacks run on the next turn
        assert conn.waiting == 1
        await conn.close()
        with pytest.raises(ConnectionError):
            await kept
        assert conn.waiting == 0
        stop.set()

    await relay_with(deaf_until(stop), test)


async def test_an_unreadable_frame_ends_the_stream_and_fails_waiting_requests() -> None:
    async def test(url: str) -> None:
        conn = RelayConnection(url, "token", b"agent")
        await conn.open()
        with pytest.raises(StreamError, match="unreadable frame"):
            await conn.request(pb.Unsubscribe(channel="a/b/c"), timeout=10)
        assert conn.closed is not None
        error = await conn.closed
        assert error is not None and error.status == Code.INTERNAL
        with pytest.raises(ConnectionError):
            await conn.send(pb.Unsubscribe(channel="a/b/c"))
        await conn.close()

    await relay_with(garbage, test)


async def test_a_frame_over_the_limit_ends_the_stream_without_taking_it() -> None:
    async def huge(frames: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        async for _ in frames:
            yield b"\x00" * (64 * 1024 * 1024 + 1)

    async def test(url: str) -> None:
        conn = RelayConnection(url, "token", b"agent")
        await conn.open()
        with pytest.raises(StreamError) as raised:
            await conn.request(pb.Unsubscribe(channel="a/b/c"), timeout=30)
        assert raised.value.status == Code.OUT_OF_RANGE, raised.value
        await conn.close()

    await relay_with(huge, test)


async def test_a_refusal_keeps_the_relays_status() -> None:
    server, port = await serve(refuse, accept=False)
    try:
        conn = RelayConnection(f"127.0.0.1:{port}", "token", b"agent")
        try:  # refused before or after the headers, as the relay's timing has it
            await conn.open()
            assert conn.closed is not None
            error = await asyncio.wait_for(conn.closed, 10)
        except StreamError as exc:
            error = exc
        assert error is not None and error.status == Code.UNAUTHENTICATED
        assert "token expired" in error.details
    finally:
        await server.stop(None)


async def test_a_relay_that_stops_reading_never_blocks_the_writer() -> None:
    """Writes queue in the native stream; h2's flow control holds them there, not the
    caller's loop."""
    stop = asyncio.Event()
    deaf = deaf_until(stop)

    async def test(url: str) -> None:
        async with RelayConnection(url, "token", b"agent") as conn:
            payload = [b"x" * 100_000]
            started = time.monotonic()
            replies = [  # 10 MB, far past the HTTP/2 windows
                await conn.send(pb.Publish(channel="a/b/c", message=payload, message_id=[b"1"]))
                for _ in range(100)
            ]
            assert time.monotonic() - started < 5.0
            assert not any(r.done() for r in replies)
            stop.set()  # the relay hangs up: nothing was answered
            outcomes = await asyncio.gather(*replies, return_exceptions=True)
            assert all(isinstance(o, ConnectionError) for o in outcomes), outcomes[:3]

    await relay_with(deaf, test)


async def test_a_relay_that_never_answers_the_handshake_leaves_open_waiting_not_blocked() -> None:
    with socket.socket() as listener:  # accepts TCP, says nothing
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        conn = RelayConnection(f"127.0.0.1:{port}", "token", b"agent")
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticker = asyncio.create_task(tick())
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(conn.open(), 1.0)
        ticker.cancel()
        assert ticks > 20  # the loop kept running while open() waited
        await conn.close()


async def test_nobody_listening_is_unavailable() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    conn = RelayConnection(f"127.0.0.1:{port}", "token", b"agent")
    with pytest.raises(StreamError) as raised:
        await conn.open()
    assert raised.value.status == Code.UNAVAILABLE


@pytest.mark.parametrize("endpoint", ["http://", "http://host:1/path", "https://", "host"])
def test_a_bad_relay_address_is_a_transport_error(endpoint: str) -> None:
    with pytest.raises(TransportError, match="relay address"):
        RelayChannel(endpoint)


def test_a_ca_file_without_certificates_is_a_transport_error() -> None:
    with pytest.raises(TransportError, match="TLS roots"):
        RelayChannel("https://127.0.0.1:1", b"not a certificate")


@pytest.mark.parametrize(
    ("name", "value"), [("svc-identity", "é"), ("bad name", "x"), ("x", "a\nb")]
)
def test_metadata_that_is_not_header_text_is_a_value_error(name: str, value: str) -> None:
    with pytest.raises(ValueError, match="metadata"):
        RelayStream(RelayChannel("127.0.0.1:1"), [(name, value)])


@pytest.mark.parametrize("seconds", [-1.0, float("nan"), float("inf")])
def test_a_keepalive_that_is_not_a_duration_is_a_value_error(seconds: float) -> None:
    with pytest.raises(ValueError, match="keepalive"):
        RelayChannel("127.0.0.1:1", keepalive=seconds)


def test_a_closed_stream_refuses_writes_and_says_it_ended() -> None:
    stream = RelayStream(RelayChannel("127.0.0.1:1"), [])
    stream.close()
    assert stream.write(b"frame") is False
    _, ended, frames = stream.drain()
    assert ended is not None and frames == []


async def test_a_reader_that_stops_draining_holds_one_window_and_the_relay_waits() -> None:
    """While nobody drains, the stream stops reading at RECEIVE_HIGH_WATER: one drain then
    holds at most that and one frame, HTTP/2 flow control stops the relay part-way, and
    draining again lets every frame through, in order."""
    total, size = 64, 1024 * 1024
    sent = 0

    async def flood(frames: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        nonlocal sent
        for i in range(total):
            yield i.to_bytes(4, "big") + b"\0" * (size - 4)
            sent += 1
        async for _ in frames:
            pass

    async def test(url: str) -> None:
        stream = RelayStream(RelayChannel(url), [])
        try:
            await asyncio.sleep(2.0)  # far longer than 64 MiB takes over loopback
            _, ended, frames = stream.drain()
            assert ended is None
            held = sum(len(f) for f in frames)
            assert 0 < held <= RECEIVE_HIGH_WATER + size, held
            assert sent < total  # the relay is held back, not buffered for
            received = list(frames)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 60
            while len(received) < total and loop.time() < deadline:
                await asyncio.sleep(0.01)
                received += stream.drain()[2]
            assert [int.from_bytes(f[:4], "big") for f in received] == list(range(total))
        finally:
            stream.close()

    await relay_with(flood, test)


async def test_requests_written_from_many_threads_each_get_their_own_reply() -> None:
    """``send_threadsafe`` writes from the caller's thread, not via the loop; the Reply
    still settles the right future."""

    async def test(url: str) -> None:
        async with RelayConnection(url, "token", b"agent") as conn:

            def burst(n: int) -> list[int]:
                futures = [conn.send_threadsafe(pb.Unsubscribe(channel="a/b/c")) for _ in range(n)]
                return [f.result(timeout=30).request_id for f in futures]

            ids = await asyncio.gather(*(asyncio.to_thread(burst, 300) for _ in range(8)))
            flat = [i for batch in ids for i in batch]
            assert sorted(flat) == list(range(1, 2401))
            for batch in ids:  # each thread's frames left in its call order
                assert batch == sorted(batch)

    await relay_with(echo, test)


async def test_a_request_written_from_a_thread_fails_when_the_stream_ends() -> None:
    stop = asyncio.Event()

    async def silent(frames: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        await stop.wait()
        await context.abort(grpc.StatusCode.UNAVAILABLE, "relay backend unavailable")
        yield b""  # pragma: no cover

    async def test(url: str) -> None:
        conn = RelayConnection(url, "token", b"agent")
        await conn.open()
        future = await asyncio.to_thread(conn.send_threadsafe, pb.Unsubscribe(channel="a/b/c"))
        stop.set()
        with pytest.raises(StreamError) as raised:
            await asyncio.wrap_future(future)
        assert raised.value.status == Code.UNAVAILABLE
        with pytest.raises(ConnectionError):
            await asyncio.to_thread(conn.send_threadsafe, pb.Unsubscribe(channel="a/b/c"))
        await conn.close()

    await relay_with(silent, test)


def test_the_client_imports_neither_pythons_grpc_nor_an_http_stack() -> None:
    """grpcio is the relay's; the client's stream is native, and so are its account API
    connections. Importing grpc costs an agent ~21 MiB of RSS, httpx ~7 MiB
    (docs/performance.md)."""
    code = (
        "import sys, svc_sdk, svc_sdk.aio, svc_sdk.relay_link, svc_sdk.manager\n"
        "heavy = ('grpc', 'httpx', 'httpcore', 'h11')\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in heavy)\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_a_blocking_agent_loads_no_event_loop_no_openssl_and_no_protobuf(
    stack: LocalStack,
) -> None:
    """An agent that uses the blocking client — connected, in a channel, sending and
    receiving — imports neither asyncio (with ssl, ~9 MiB of an agent's RSS), nor
    Python's OpenSSL bindings (hashlib's or ssl's, ~3 MiB for libcrypto), nor protobuf
    (~5 MiB): its relay link runs on threads, its TLS is the native extension's, and so
    is its frames' codec."""
    code = (
        "import sys, tempfile\n"
        "from svc_sdk import SvcClient\n"
        "relay, api, key = sys.argv[1:4]\n"
        "with tempfile.TemporaryDirectory() as ra, tempfile.TemporaryDirectory() as rb:\n"
        "    a, b = SvcClient(relay, ra, b'a', key, api), SvcClient(relay, rb, b'b', key, api)\n"
        "    with a, b:\n"
        "        chan = a.create_channel('acme/tests/no-loop')\n"
        "        joined = b.join_channel(chan.name, chan.add_member(b.generate_key_package()))\n"
        "        chan.send(b'hello')\n"
        "        assert joined.next_message(timeout=10).data == b'hello'\n"
        "heavy = ('asyncio', 'uvloop', 'ssl', '_ssl', 'hashlib', '_hashlib', 'anyio', 'google')\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in heavy)\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run(
        [sys.executable, "-c", code, stack.relay_url, stack.api_url, stack.api_key],
        check=True,
        timeout=120,
    )


def certificate(names: list[str], *, expired: bool = False) -> tuple[bytes, bytes]:
    """A self-signed CA certificate (as `openssl req -x509` makes) for ``names``."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "svc transport test")])
    now = datetime.datetime.now(datetime.UTC)
    start, end = (
        (now - datetime.timedelta(days=2), now - datetime.timedelta(days=1))
        if (expired)
        else (now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=1))
    )
    sans: list[x509.GeneralName] = [
        x509.IPAddress(ipaddress.ip_address(n)) if n[0].isdigit() else x509.DNSName(n)
        for n in names
    ]
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


@pytest.mark.parametrize(
    ("names", "expired", "trusted"),
    [
        (["127.0.0.1"], False, True),
        (["relay.example"], False, False),  # another name
        (["127.0.0.1"], True, False),  # past its validity
    ],
)
async def test_a_self_signed_certificate_in_the_ca_file_is_trusted_only_as_issued(
    names: list[str], expired: bool, trusted: bool
) -> None:
    cert_pem, key_pem = certificate(names, expired=expired)

    server, port = await serve(echo, tls=(cert_pem, key_pem))
    try:
        url = f"https://127.0.0.1:{port}"
        conn = RelayConnection(url, "token", b"agent", channel=RelayChannel(url, cert_pem))
        if trusted:
            await conn.open()
            await conn.request(pb.Unsubscribe(channel="a/b/c"), timeout=10)
            await conn.close()
        else:
            with pytest.raises(StreamError) as raised:
                await conn.open()
            assert raised.value.status == Code.UNAVAILABLE
            assert "certificate" in raised.value.details.lower(), raised.value.details
    finally:
        await server.stop(None)


async def test_a_frame_over_the_limit_is_refused_and_the_stream_goes_on() -> None:
    async def test(url: str) -> None:
        async with RelayConnection(url, "token", b"agent") as conn:
            huge = pb.Publish(channel="a/b/c", message=[b"x" * MAX_FRAME], message_id=[b"1"])
            with pytest.raises(ValueError, match="over the"):
                await conn.send(huge)
            with pytest.raises(ValueError, match="over the"):
                await asyncio.to_thread(conn.send_threadsafe, huge)
            reply = await conn.request(pb.Unsubscribe(channel="a/b/c"), timeout=10)
            assert reply.code == 0 and not conn._pending

    await relay_with(echo, test)
