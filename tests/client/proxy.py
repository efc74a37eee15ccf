"""A real HTTP CONNECT proxy on loopback, for the tests of agents behind one."""

from __future__ import annotations

import contextlib
import socket
import threading

import pytest

#: What the agents read to choose a proxy (each also in lower case).
VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")


def clear_proxy_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """No proxy variable, and no CGI marker, for this test."""
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    monkeypatch.delenv("REQUEST_METHOD", raising=False)


class ConnectProxy:
    """Tunnels each ``CONNECT host:port`` to its target and pipes bytes both ways,
    recording the target, the ``Proxy-Authorization`` header and every byte it piped.
    With ``answer``, it answers every CONNECT with that response instead and closes.
    With ``early``, it waits briefly for the target to speak first (an HTTP/2 server
    sends its SETTINGS at once) and sends that in the same write as its 200, as a proxy
    may: the client must not lose what follows the response's head."""

    def __init__(self, answer: bytes | None = None, *, early: bool = False) -> None:
        self._answer = answer
        self._early = early
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.tunnels: list[tuple[str, str | None]] = []
        self.early: dict[str, int] = {}  # target: bytes sent with the 200 (early mode)
        self.piped = bytearray()
        self._closed = False
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, name="test-proxy", daemon=True).start()

    def targets(self) -> set[str]:
        with self._lock:
            return {target for target, _ in self.tunnels}

    def close(self) -> None:
        # shutdown() first: close() alone does not wake a thread blocked in accept or recv.
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        with self._lock:
            self._closed = True
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            if self._keep(conn):
                threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _keep(self, sock: socket.socket) -> bool:
        """Tracks ``sock`` for close(); closes it at once if close() has run."""
        with self._lock:
            if not self._closed:
                self._sockets.append(sock)
                return True
        sock.close()
        return False

    def _serve(self, conn: socket.socket) -> None:
        # A socket close() shut, or a target that refuses: the tunnel ends, quietly (an
        # exception escaping a thread would be reported as a test warning).
        try:
            self._tunnel(conn)
        except OSError:
            conn.close()

    def _tunnel(self, conn: socket.socket) -> None:
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = conn.recv(4096)
            if not chunk:
                conn.close()
                return
            head += chunk
        request, *lines = head.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
        method, target, _ = request.split(" ")
        headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines)}
        auth = headers.get("proxy-authorization")
        with self._lock:
            self.tunnels.append((target if method == "CONNECT" else request, auth))
        if self._answer is not None or method != "CONNECT":
            conn.sendall(self._answer or b"HTTP/1.1 405 Method Not Allowed\r\n\r\n")
            conn.close()
            return
        host, _, port = target.rpartition(":")
        upstream = socket.create_connection((host.strip("[]"), int(port)))
        if not self._keep(upstream):
            conn.close()
            return
        established = b"HTTP/1.1 200 Connection established\r\n\r\n"
        if self._early:
            upstream.settimeout(0.3)
            try:
                first = upstream.recv(65536)
            except TimeoutError:
                first = b""  # a server that waits for the client (HTTP/1.1, TLS)
            upstream.settimeout(None)
            with self._lock:
                self.piped += first
                self.early[target] = len(first)
            established += first
        conn.sendall(established)
        threading.Thread(target=self._pipe, args=(upstream, conn), daemon=True).start()
        self._pipe(conn, upstream)

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while chunk := source.recv(65536):
                with self._lock:
                    self.piped += chunk
                sink.sendall(chunk)
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass
