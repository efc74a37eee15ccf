"""The account API in a process of its own, for ``svc up``: no request to the API, however
costly to parse or to answer, takes the relay's event loop or its GIL
(docs/performance.md, "API and relay isolation").

The parent binds the listening socket (so it reports a taken port, and the bound port,
itself) and starts ``python -m svc_server.api.process`` with three descriptors: the
listening socket and two socket pairs. Over the control pair the parent sends the
settings once the database is migrated, the child answers that it serves (or why it
cannot), and the parent later tells it to stop. Over the metrics pair the child fetches
the relay's Prometheus exposition for ``/metrics``. A child whose parent dies exits at
once (the control pair reaches end-of-file), so it never holds the API port after
``svc up`` is killed.

A plain subprocess, not ``multiprocessing``: nothing of the caller's ``__main__`` is
imported again in the child, and no gRPC state is forked.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass
from multiprocessing.connection import Connection

import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from ..config import Settings
from ..errors import StartupError

START_TIMEOUT = 60.0


# -- parent side --------------------------------------------------------------------------


@dataclass
class ApiProcess:
    """The child process serving the account API. ``serve()`` hands it the settings and
    waits until it accepts connections; ``stop()`` ends it."""

    process: subprocess.Popen[bytes]
    control: Connection
    metrics: Connection

    @property
    def pid(self) -> int:
        return self.process.pid

    async def serve(
        self, settings: Settings, registry: CollectorRegistry, timeout: float = START_TIMEOUT
    ) -> None:
        """StartupError with the child's reason if it cannot serve."""
        threading.Thread(
            target=_serve_metrics,
            args=(self.metrics, registry),
            name="svc-api-metrics",
            daemon=True,
        ).start()
        with contextlib.suppress(OSError):  # if it has exited, _wait_ready says so
            self.control.send(("start", settings.model_dump(mode="json")))
        status, detail = await asyncio.to_thread(self._wait_ready, timeout)
        if status != "ready":
            raise StartupError(detail)

    def _wait_ready(self, timeout: float) -> tuple[str, str]:
        try:
            if not self.control.poll(timeout):
                return "error", f"account API did not start within {timeout:g} s"
            status, detail = self.control.recv()
        except (EOFError, OSError):
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(5)
            code = self.process.returncode
            return "error", f"account API process exited during start-up (status {code})"
        return str(status), str(detail)

    async def wait(self) -> int:
        """Returns the child's exit status once it has exited."""
        return await asyncio.to_thread(self.process.wait)

    async def stop(self, timeout: float = 10) -> None:
        with contextlib.suppress(OSError):
            self.control.send(("stop", None))
        try:
            await asyncio.to_thread(self.process.wait, timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            await asyncio.to_thread(self.process.wait)
        self.control.close()
        self.metrics.close()


def spawn_api_process(sock: socket.socket) -> ApiProcess:
    """Starts the child on the bound ``sock``; it imports the API while the caller gets
    the database and the relay ready, then waits for ``ApiProcess.serve``."""
    control, child_control = socket.socketpair()
    metrics, child_metrics = socket.socketpair()
    fds = (sock.fileno(), child_control.fileno(), child_metrics.fileno())
    try:
        # -P: the installed svc_server, never a folder of that name in the working directory.
        # A process group of its own: Ctrl-C in a terminal reaches svc up alone, which
        # stops this process in order (even while it is still importing the API).
        process = subprocess.Popen(  # noqa: S603 - our own interpreter, fixed arguments
            [sys.executable, "-P", "-m", __name__, *(str(fd) for fd in fds)],
            pass_fds=fds,
            stdin=subprocess.DEVNULL,
            process_group=0,
        )
    except BaseException:
        for s in (control, metrics):
            s.close()
        raise
    finally:
        child_control.close()
        child_metrics.close()
    return ApiProcess(process, _connection(control), _connection(metrics))


def _connection(sock: socket.socket) -> Connection:
    return Connection(sock.detach())


def _serve_metrics(conn: Connection, registry: CollectorRegistry) -> None:
    """The relay's metrics for the child's ``/metrics``: one exposition per request."""
    try:
        while True:
            conn.recv()
            conn.send_bytes(generate_latest(registry))
    except (EOFError, OSError):
        return


# -- child side ---------------------------------------------------------------------------


class RelayMetricsApp:
    """``/metrics`` in the child: the relay's metrics, fetched from the parent."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._lock = threading.Lock()

    def _fetch(self) -> bytes:
        with self._lock:
            self._conn.send(None)
            return self._conn.recv_bytes()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            body = await asyncio.to_thread(self._fetch)
        except (EOFError, OSError):
            response = Response("relay metrics unavailable", status_code=503)
        else:
            response = Response(body, media_type=CONTENT_TYPE_LATEST)
        await response(scope, receive, send)


def _child(listen_fd: int, control: Connection, metrics: Connection) -> None:
    from svc_sdk.protocol import run_event_loop

    from ..heap import settle
    from . import create_app
    from .serving import Server, uvicorn_options

    try:
        command, values = control.recv()
    except EOFError:
        return  # the parent gave up before the database was ready
    if command != "start":
        return
    sock = socket.socket(fileno=listen_fd)
    try:
        settings = Settings(**values)
        app = create_app(settings)
        app.mount("/metrics", RelayMetricsApp(metrics))
        config = uvicorn.Config(
            app, log_level="warning", lifespan="off", **uvicorn_options(settings)
        )
        server = Server(config)  # stopped by the parent, over the control pair
    except StartupError as exc:
        control.send(("error", str(exc)))
        return
    except Exception as exc:
        control.send(("error", f"account API cannot start: {type(exc).__name__}: {exc}"))
        return

    def watch() -> None:
        try:
            control.recv()
        except (EOFError, OSError):
            os._exit(1)  # the parent is gone without stopping us: follow it at once
        server.should_exit = True

    async def main() -> None:
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:
            if task.done():
                failure = task.exception()
                reason = f": {type(failure).__name__}: {failure}" if failure else ""
                control.send(("error", f"account API stopped during start-up{reason}"))
                return
            await asyncio.sleep(0.01)
        settle()
        control.send(("ready", ""))
        threading.Thread(target=watch, name="svc-api-control", daemon=True).start()
        await task

    run_event_loop(main())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="svc up's account API process (internal)")
    parser.add_argument("fds", type=int, nargs=3, help="listening socket, control, metrics")
    listen_fd, control_fd, metrics_fd = parser.parse_args(argv).fds
    # A SIGINT meant for the whole service (a supervisor signalling each of its processes):
    # the parent stops this process in order.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _child(listen_fd, Connection(control_fd), Connection(metrics_fd))


if __name__ == "__main__":
    main()
