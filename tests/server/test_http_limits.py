"""The API's HTTP protocol bounds what a client may send and how slowly: request heads
too large or with too many fields are answered 431, and clients that trickle a head or
a body are disconnected. Real sockets against a real server on a free loopback port."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from svc_server.config import Settings

from ..support import RunningApi, run_api


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Any]:
    """Starts an API with the given setting overrides (SQLite in tmp_path)."""
    running: list[Any] = []

    def start(**overrides: Any) -> RunningApi:
        settings = Settings(data_dir=tmp_path / "server", **overrides)
        context = run_api(settings)
        api = context.__enter__()
        running.append(context)
        return api

    yield start
    for context in reversed(running):
        context.__exit__(None, None, None)


def address(api: RunningApi) -> tuple[str, int]:
    host, port = api.url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def assert_problem(response: httpx.Response, status: int, slug: str) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body = response.json()
    assert body["status"] == status and body["type"] == f"urn:svc:problem:{slug}"
    assert response.headers["connection"] == "close"


def read_until_closed(sock: socket.socket, seconds: float) -> tuple[bytes, float]:
    """What the server sends until it closes the connection, and when it closed it
    (seconds from now); fails if it is still open after ``seconds``."""
    start = time.monotonic()
    sock.settimeout(seconds)
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except ConnectionResetError:
        pass
    except TimeoutError:
        pytest.fail(f"the server kept the connection open for {seconds} s: {received[:80]!r}")
    return received, time.monotonic() - start


def test_an_oversized_head_is_answered_431_and_the_api_keeps_serving(serve: Any) -> None:
    api = serve()
    with httpx.Client(base_url=api.url, timeout=10) as http:
        started = time.monotonic()
        too_big = http.get("/healthz", headers={"X-Big": "a" * 40_000})
        assert_problem(too_big, 431, "header-too-large")
        assert "32768 bytes" in too_big.json()["detail"]
        # Just under the limit is fine, and the API answers the next request.
        assert http.get("/healthz", headers={"X-Big": "a" * 30_000}).status_code == 200
        assert http.get("/healthz").status_code == 200
    assert time.monotonic() - started < 5


def test_a_huge_head_is_cut_off_at_once(serve: Any) -> None:
    """64 MiB of one header: the server stops reading after the limit (and a little
    lingering) instead of parsing it all, whatever the client still sends."""
    api = serve()
    sent = 0
    started = time.monotonic()
    with socket.create_connection(address(api), timeout=10) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Huge: ")
        chunk = b"a" * 1024 * 1024
        try:
            while sent < 64 * 1024 * 1024:
                sock.sendall(chunk)
                sent += len(chunk)
        except OSError:  # reset or broken pipe: the server has closed the connection
            pass
        else:
            answer, _ = read_until_closed(sock, 10)
            assert answer.startswith(b"HTTP/1.1 431 ")
    assert sent < 16 * 1024 * 1024, "the server read far past its limit"
    assert time.monotonic() - started < 10
    with httpx.Client(base_url=api.url, timeout=10) as http:
        assert http.get("/healthz").status_code == 200


def test_too_many_header_fields_are_answered_431(serve: Any) -> None:
    api = serve(max_header_count=50)
    with httpx.Client(base_url=api.url, timeout=10) as http:
        # httpx adds five of its own (host, accept, accept-encoding, connection, user-agent).
        few = {f"X-H{i}": "v" for i in range(40)}
        assert http.get("/healthz", headers=few).status_code == 200
        many = {f"X-H{i}": "v" for i in range(60)}
        response = http.get("/healthz", headers=many)
        assert_problem(response, 431, "too-many-headers")
        assert "more than 50 header fields" in response.json()["detail"]
        assert http.get("/healthz").status_code == 200


def test_the_default_header_count_limit_is_100(serve: Any) -> None:
    api = serve()
    with httpx.Client(base_url=api.url, timeout=10) as http:
        response = http.get("/healthz", headers={f"X-H{i}": "v" for i in range(120)})
        assert_problem(response, 431, "too-many-headers")


def trickle(sock: socket.socket, data: bytes, every: float, stop: threading.Event) -> None:
    for i in range(len(data)):
        if stop.wait(every):
            return
        try:
            sock.send(data[i : i + 1])
        except OSError:
            return


def test_a_client_trickling_its_head_is_disconnected(serve: Any) -> None:
    api = serve(header_timeout_seconds=1)
    stop = threading.Event()
    with socket.create_connection(address(api), timeout=10) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        # One byte every 0.1 s: never idle long, never done.
        sender = threading.Thread(target=trickle, args=(sock, b"X-Slow: a" * 1000, 0.1, stop))
        sender.start()
        try:
            answer, after = read_until_closed(sock, 10)
        finally:
            stop.set()
            sender.join()
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert b"urn:svc:problem:request-timeout" in answer
    assert after < 5
    with httpx.Client(base_url=api.url, timeout=10) as http:
        assert http.get("/healthz").status_code == 200


def test_a_connection_that_sends_nothing_is_closed(serve: Any) -> None:
    api = serve(header_timeout_seconds=1)
    with socket.create_connection(address(api), timeout=10) as sock:
        answer, after = read_until_closed(sock, 10)
    assert answer == b"" and after < 5


def test_a_client_trickling_its_body_is_disconnected(serve: Any) -> None:
    api = serve(body_timeout_seconds=1)
    stop = threading.Event()
    with socket.create_connection(address(api), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/accounts HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000\r\n\r\n"
        )
        sender = threading.Thread(target=trickle, args=(sock, b" " * 1000, 0.1, stop))
        sender.start()
        try:
            _, after = read_until_closed(sock, 10)
        finally:
            stop.set()
            sender.join()
    assert after < 5


def test_keep_alive_requests_are_not_cut_by_the_head_deadline(serve: Any) -> None:
    """The head deadline runs per request, not per connection: a connection that keeps
    sending requests, each promptly, stays open past it."""
    api = serve(header_timeout_seconds=1)
    with httpx.Client(base_url=api.url, timeout=10) as http:
        for _ in range(6):
            assert http.get("/healthz").status_code == 200
            time.sleep(0.3)
