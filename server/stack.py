"""``svc up``: the relay, and the account API in a child process of its own, on loopback by
default."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from .api.deps import Services
from .api.process import ApiProcess, spawn_api_process
from .config import Settings
from .errors import StartupError
from .heap import settle
from .relay.metrics import RelayMetrics
from .relay.server import RunningRelay, start_relay

T = TypeVar("T")


@dataclass
class Stack:
    api_url: str
    relay_url: str
    relay: RunningRelay
    api: ApiProcess
    services: Services  # this process's: the relay's database sessions and signing keys


async def start_stack(
    settings: Settings, host: str = "127.0.0.1", api_port: int = 8000, relay_port: int = 50051
) -> Stack:
    """Starts both servers (0 picks free ports) and returns when both accept connections:
    the relay on the calling event loop, the account API in a child process, so that
    neither can stall the other (docs/performance.md, "API and relay isolation")."""
    # Bound here, not by uvicorn, so a taken port is an error we report, not an exit.
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, api_port))
    except OSError as exc:
        sock.close()
        raise StartupError(
            f"account API cannot listen on {host}:{api_port}: {exc.strerror}"
        ) from None
    bound = sock.getsockname()[1]
    try:
        # Started first: it imports the API while this process readies the database.
        api = spawn_api_process(sock)
    finally:
        sock.close()  # the child has its own copy; this process never accepts on it
    try:
        # Migrates the schema and creates the signing keys before the API starts.
        services = await asyncio.to_thread(Services.start, settings)
    except BaseException:
        await api.stop()
        raise
    try:
        metrics = RelayMetrics()
        relay = await start_relay(settings, host, relay_port, services.sessions, metrics)
        try:
            await api.serve(settings, metrics.registry)
        except BaseException:
            await relay.stop()
            raise
    except BaseException:
        await api.stop()
        services.engine.dispose()
        raise
    scheme = settings.scheme
    api_url, relay_url = f"{scheme}://{host}:{bound}", f"{scheme}://{host}:{relay.port}"
    return Stack(api_url, relay_url, relay, api, services)


async def stop_stack(stack: Stack) -> None:
    await asyncio.gather(stack.api.stop(), stack.relay.stop())
    stack.services.engine.dispose()


def shutdown_requested() -> asyncio.Event:
    """An event set on SIGINT or SIGTERM, from now on.

    Each server asks for it before it opens a database or a port: its account API may
    answer, and a supervisor stop it, before it has said it is ready."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    return stop


async def unless_stopped(start: Coroutine[Any, Any, T], shutdown: asyncio.Future[Any]) -> T | None:
    """What ``start`` returns or raises; None if ``shutdown`` completes first, once
    ``start`` is cancelled and has undone what it had started (a hung database connection
    or a slow migration does not hold a stop up)."""
    starting = asyncio.ensure_future(start)
    await asyncio.wait((starting, shutdown), return_when=asyncio.FIRST_COMPLETED)
    if starting.done():
        if shutdown.done() and starting.exception() is not None:
            return None  # failed as the stop came (a signal that reached a child too)
        return starting.result()
    starting.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):  # stopping: nothing to report
        await starting
    return None


async def serve(settings: Settings, host: str, api_port: int, relay_port: int) -> None:
    shutdown = asyncio.ensure_future(shutdown_requested().wait())
    stack = await unless_stopped(start_stack(settings, host, api_port, relay_port), shutdown)
    if stack is None:
        print("stopped", flush=True)
        return
    settle()
    print(f"svc account API  {stack.api_url}", flush=True)
    print(f"svc relay        {stack.relay_url}", flush=True)
    print(f"metrics          {stack.api_url}/metrics", flush=True)
    print("ready; Ctrl-C stops", flush=True)
    api_exited = asyncio.ensure_future(stack.api.wait())
    await asyncio.wait((shutdown, api_exited), return_when=asyncio.FIRST_COMPLETED)
    asked = shutdown.done()
    shutdown.cancel()
    await stop_stack(stack)
    status = await api_exited
    # A supervisor's SIGTERM to every process of the service (systemd's default) may reach
    # the API process first: a stop too.
    if not asked and status != -signal.SIGTERM:
        # The API process died (killed, out of memory): stop the relay too, and fail,
        # so that a supervisor restarts both.
        raise RuntimeError(f"account API process exited with status {status}; svc up stopped")
    print("stopped", flush=True)
