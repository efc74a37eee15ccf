"""``svc up``: the account API and the relay in one process, on loopback by default."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
from dataclasses import dataclass

import uvicorn
from prometheus_client import make_asgi_app

from .api import create_app
from .api.deps import Services
from .api.serving import uvicorn_options
from .config import Settings
from .errors import StartupError
from .relay.metrics import RelayMetrics
from .relay.server import RunningRelay, start_relay


@dataclass
class Stack:
    api_url: str
    relay_url: str
    relay: RunningRelay
    api: uvicorn.Server
    api_task: asyncio.Task[None]


async def start_stack(
    settings: Settings, host: str = "127.0.0.1", api_port: int = 8000, relay_port: int = 50051
) -> Stack:
    """Starts both servers (0 picks free ports) and returns when both accept connections."""
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
    try:
        services = await asyncio.to_thread(Services.start, settings)
        metrics = RelayMetrics()
        relay = await start_relay(settings, host, relay_port, services.sessions, metrics)
    except BaseException:
        sock.close()
        raise
    app = create_app(services=services)
    app.mount("/metrics", make_asgi_app(registry=metrics.registry))
    config = uvicorn.Config(app, log_level="warning", lifespan="off", **uvicorn_options(settings))
    api = uvicorn.Server(config)
    task = asyncio.create_task(api.serve(sockets=[sock]))
    while not api.started:
        if task.done():
            await relay.stop()
            task.result()
            raise StartupError("account API stopped during start-up")
        await asyncio.sleep(0.01)
    bound = sock.getsockname()[1]
    scheme = settings.scheme
    return Stack(f"{scheme}://{host}:{bound}", f"{scheme}://{host}:{relay.port}", relay, api, task)


async def stop_stack(stack: Stack) -> None:
    stack.api.should_exit = True
    await stack.relay.stop()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stack.api_task, 10)


async def wait_for_shutdown() -> None:
    """Returns on SIGINT or SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()


async def serve(settings: Settings, host: str, api_port: int, relay_port: int) -> None:
    stack = await start_stack(settings, host, api_port, relay_port)
    print(f"svc account API  {stack.api_url}", flush=True)
    print(f"svc relay        {stack.relay_url}", flush=True)
    print(f"metrics          {stack.api_url}/metrics", flush=True)
    print("ready; Ctrl-C stops", flush=True)
    await wait_for_shutdown()
    await stop_stack(stack)
    print("stopped", flush=True)
