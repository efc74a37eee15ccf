"""A real HTTP CONNECT proxy on loopback, for the tests of agents behind one."""

from __future__ import annotations

import socket
import threading


class ConnectProxy:
    """Tunnels each ``CONNECT host:port`` to its target and pipes bytes both ways,
    recording the target, the ``Proxy-Authorization`` header and every byte it piped.
    With ``answer``, it answers every CONNECT with that response instead and closes."""

    def __init__(self, answer: bytes | None = None) -> None:
        self._answer = answer
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.tunnels: list[tuple[str, str | None]] = []
        self.piped = bytearray()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, name="test-proxy", daemon=True).start()

    def targets(self) -> set[str]:
        with self._lock:
            return {target for target, _ in self.tunnels}

    def close(self) -> None:
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                sock.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self._sockets.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
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
        with self._lock:
            self._sockets.append(upstream)
        conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
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
