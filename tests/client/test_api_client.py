"""The account API's client (svc_sdk.api_client over svc_sdk._native.HttpClient) against
API servers that misbehave: raw sockets on loopback, so the answers can be anything. The
well-behaved API is everywhere else in the suite (every SvcClient exchanges its key)."""

from __future__ import annotations

import http.server
import os
import select
import signal
import socket
import threading
from collections.abc import Iterator

import pytest

from svc_sdk._native import MAX_API_RESPONSE, HttpClient
from svc_sdk.api_client import ApiClient
from svc_sdk.errors import AuthError, ChannelClosedError, InternalError, TransportError

KEY = "sk_live_" + "k" * 40


@pytest.fixture
def server() -> Iterator[tuple[str, list[bytes], list[bytes]]]:
    """An HTTP server on loopback that answers each connection's requests with the next
    of ``answers`` (raw bytes) and records what it read in ``seen``."""
    listener = socket.create_server(("127.0.0.1", 0))
    answers: list[bytes] = []
    seen: list[bytes] = []

    def run() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                while answers:
                    request = conn.recv(65536)
                    if not request:
                        break
                    seen.append(request)
                    try:
                        conn.sendall(answers.pop(0))
                    except OSError:
                        break

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}", answers, seen
    listener.close()


def answer(status: str, body: bytes, content_type: str = "application/json") -> bytes:
    head = f"HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {len(body)}"
    return head.encode() + b"\r\n\r\n" + body


def test_a_token_is_exchanged_with_the_key_and_kept(
    server: tuple[str, list[bytes], list[bytes]],
) -> None:
    url, answers, seen = server
    answers.append(
        answer("201 Created", b'{"token": "a.b.c", "expires_at": "2099-01-01T00:00:00+00:00"}')
    )
    api = ApiClient(url + "/", KEY)
    assert api.token() == "a.b.c"
    assert api.token() == "a.b.c"  # not close to expiry: no second request
    assert len(seen) == 1
    request = seen[0].decode()
    assert request.startswith("POST /v1/tokens HTTP/1.1\r\n")
    assert f"\r\nauthorization: Bearer {KEY}\r\n" in request
    api.close()
    with pytest.raises(ChannelClosedError, match="the client is closed$"):
        api.refresh()


def test_answers_that_are_not_the_apis_are_clear_errors(
    server: tuple[str, list[bytes], list[bytes]],
) -> None:
    url, answers, _ = server
    api = ApiClient(url, KEY)
    answers.append(answer("401 Unauthorized", b'{"detail": "revoked"}'))
    with pytest.raises(AuthError, match="revoked"):
        api.token()
    answers.append(answer("200 OK", b"<html>not json</html>", "text/html"))
    with pytest.raises(InternalError, match="non-JSON"):
        api.token()
    answers.append(answer("502 Bad Gateway", b"\xff\xfe not utf-8"))
    with pytest.raises(TransportError, match="502"):
        api.token()
    # Announced larger than the bound: refused before its body is read.
    answers.append(f"HTTP/1.1 200 OK\r\ncontent-length: {MAX_API_RESPONSE + 1}\r\n\r\n".encode())
    with pytest.raises(TransportError, match="larger than"):
        api.token()
    answers.append(b"this is not HTTP\r\n\r\n")
    with pytest.raises(TransportError, match="unreachable"):
        api.token()


def test_a_server_that_never_answers_times_out() -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent:
        api = ApiClient(f"http://127.0.0.1:{silent.getsockname()[1]}", KEY, timeout=0.3)
        with pytest.raises(TransportError, match="no answer within"):
            api.token()


def test_bad_arguments_are_refused_before_anything_is_sent() -> None:
    for url in ("ftp://127.0.0.1:1", "127.0.0.1:1", "http://[::1", "http://"):
        with pytest.raises(
            TransportError, match="^transport error: account API address .* not a URL"
        ):
            ApiClient(url, KEY)
    http = HttpClient("http://127.0.0.1:1")
    for method, path, headers in (
        ("G ET", "/", []),
        ("GET", "no-slash", []),
        ("GET", "/", [("x-test", "line\nbreak")]),
        ("GET", "/", [("bad name", "v")]),
    ):
        with pytest.raises(ValueError, match="^invalid"):
            http.request(method, path, headers)
    with pytest.raises(ValueError, match="timeout"):
        HttpClient("http://127.0.0.1:1", timeout=-1.0)
    with pytest.raises(ValueError, match="expected http:// or https://"):
        HttpClient("grpc://127.0.0.1:1")


def test_a_client_used_before_a_fork_works_in_the_child() -> None:
    """A forked child inherits the pool's kept-alive connection, whose driving task ran on
    the parent's runtime: a request on it waited out the whole timeout. The child gets a
    pool of its own."""

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: the parent's connection stays pooled

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("content-length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: object) -> None:
            pass

    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler) as httpd:
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        api = HttpClient(f"http://127.0.0.1:{httpd.server_address[1]}", timeout=5.0)
        assert api.request("GET", "/", []) == (200, b"ok")
        read, write = os.pipe()
        child = os.fork()
        if child == 0:  # pragma: no cover - the child reports through the pipe
            try:
                os.write(write, repr(api.request("GET", "/", [])).encode())
            except BaseException as exc:
                os.write(write, f"{type(exc).__name__}: {exc}".encode())
            finally:
                os._exit(0)
        os.close(write)
        with os.fdopen(read, "rb") as pipe:
            # The child answers within its 5 s timeout either way; a hung child fails
            # this test instead of running into the session's 300 s limit.
            ready, _, _ = select.select([pipe], [], [], 30)
            if not ready:
                os.kill(child, signal.SIGKILL)
            report = pipe.read().decode()
        os.waitpid(child, 0)
        assert report == "(200, b'ok')"  # not "TransportError: no answer within 5s"
        assert api.request("GET", "/", []) == (200, b"ok")  # the parent's pool is intact
        api.close()
        httpd.shutdown()
