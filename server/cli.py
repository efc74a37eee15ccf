"""``svc api`` runs the account API; ``svc rotate-signing-key`` rotates its JWT key."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic import ValidationError

    from .config import Settings


# uvicorn.run's exit status when the server did not start (uvicorn logged why).
STARTUP_FAILURE = 3


def run_api(args: argparse.Namespace) -> None:
    import asyncio

    import uvicorn

    from svc_sdk.protocol import run_event_loop

    from .api import create_app
    from .api.serving import Server, uvicorn_options
    from .heap import settle
    from .stack import shutdown_requested, unless_stopped

    settings = _settings(args)
    _ = settings.tls  # fails early, with a clear message, on half or unreadable TLS settings

    async def main() -> None:
        shutdown = asyncio.ensure_future(shutdown_requested().wait())
        # The migration runs to its end in its thread even when a stop comes first.
        app = await unless_stopped(asyncio.to_thread(create_app, settings), shutdown)
        if app is None:
            return
        options = uvicorn_options(settings)
        config = uvicorn.Config(
            app, host=args.host, port=args.port, log_level=args.log_level, **options
        )
        server = Server(config)
        serving = asyncio.ensure_future(server.serve())
        while not server.started:
            if serving.done():
                serving.result()  # raises what stopped it
                raise SystemExit(STARTUP_FAILURE)
            if shutdown.done():
                break  # a stop: uvicorn is told below, and closes what it opened
            await asyncio.sleep(0.01)
        else:
            settle()
            # Said once it serves: a client may connect the moment it reads the line.
            print(f"svc account API on {settings.scheme}://{args.host}:{args.port}", flush=True)
        await asyncio.wait({serving, shutdown}, return_when=asyncio.FIRST_COMPLETED)
        shutdown.cancel()
        server.should_exit = True
        await serving

    run_event_loop(main())


def _settings(args: argparse.Namespace) -> Settings:
    from pydantic import ValidationError

    from .config import Settings
    from .errors import StartupError

    overrides: dict[str, str] = {}
    for name in (
        "database_url",
        "redis_url",
        "data_dir",
        "api_url",
        "tls_cert_file",
        "tls_key_file",
    ):
        value = getattr(args, name, None)
        if value:
            overrides[name] = value
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        raise StartupError(settings_error(exc)) from None


def settings_error(exc: ValidationError) -> str:
    """What ``svc`` prints for settings that do not validate: each by its environment
    variable's name, without its value (settings such as SVC_DATABASE_URL carry
    passwords), instead of pydantic's traceback."""
    problems = [
        "_".join(["SVC", *(str(part).upper() for part in err["loc"])]) + f": {err['msg']}"
        for err in exc.errors()
    ]
    return "configuration error: " + "; ".join(problems)


def run_up(args: argparse.Namespace) -> None:
    from svc_sdk.protocol import run_event_loop

    from .stack import serve

    # The embedded relay reads the signing keys from the database, whatever SVC_API_URL says.
    settings = _settings(args).model_copy(update={"api_url": ""})
    run_event_loop(serve(settings, args.host, args.api_port, args.relay_port))


def run_relay(args: argparse.Namespace) -> None:
    import asyncio

    from prometheus_client import start_http_server

    from svc_sdk.protocol import run_event_loop

    from .heap import settle
    from .relay.metrics import RelayMetrics
    from .relay.server import start_relay
    from .stack import shutdown_requested, unless_stopped

    async def main() -> None:
        shutdown = shutdown_requested()
        settings = _settings(args)
        metrics = RelayMetrics()
        starting = start_relay(settings, args.host, args.port, metrics=metrics)
        running = await unless_stopped(starting, asyncio.ensure_future(shutdown.wait()))
        if running is None:
            return
        settle()
        if args.metrics_port:
            start_http_server(args.metrics_port, addr=args.host, registry=metrics.registry)
        print(f"svc relay on {settings.scheme}://{args.host}:{running.port}", flush=True)
        await shutdown.wait()
        await running.stop()

    run_event_loop(main())


def rotate_signing_key(args: argparse.Namespace) -> None:
    from .db.session import make_sessionmaker, open_database, transaction
    from .services import signing

    settings = _settings(args)
    engine = open_database(settings)
    with transaction(make_sessionmaker(engine)) as session:
        key = signing.rotate(session, settings.token_ttl_seconds, args.purpose)
        kid = key.kid
    engine.dispose()
    # API processes pick the new key up within 30 s.
    if args.purpose == signing.TOKEN:
        print(f"new signing key {kid}; the previous key verifies until its tokens expire")
    else:
        print(f"new credential key {kid}; the previous key stays published for old credentials")


def _tls_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tls-cert-file", default=None, help="PEM certificate (SVC_TLS_CERT_FILE)")
    p.add_argument("--tls-key-file", default=None, help="PEM private key (SVC_TLS_KEY_FILE)")


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("api", help="run the account API server")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=8000, help="port to listen on")
    p.add_argument(
        "--database-url",
        default=None,
        help="accounts database (default: SVC_DATABASE_URL, else SQLite in the data dir)",
    )
    p.add_argument(
        "--data-dir",
        default=None,
        help="where the server keeps its state (default: SVC_DATA_DIR, else ~/.svc/server)",
    )
    p.add_argument(
        "--log-level",
        default="warning",
        choices=["critical", "error", "warning", "info", "debug", "trace"],
        help="uvicorn's log level",
    )
    _tls_arguments(p)
    p.set_defaults(func=run_api)

    p = sub.add_parser(
        "rotate-signing-key", help="rotate the key that signs relay JWTs or agent credentials"
    )
    p.add_argument(
        "--purpose",
        choices=["token", "credential"],
        default="token",
        help="which key: relay JWTs (token) or agent credentials (credential)",
    )
    p.add_argument(
        "--database-url",
        default=None,
        help="accounts database (default: SVC_DATABASE_URL, else SQLite in the data dir)",
    )
    p.set_defaults(func=rotate_signing_key)

    p = sub.add_parser("up", help="run the account API and the relay together")
    p.add_argument("--host", default="127.0.0.1", help="address both servers listen on")
    p.add_argument("--api-port", type=int, default=8000, help="account API port (0: any free)")
    p.add_argument("--relay-port", type=int, default=50051, help="relay port (0: any free)")
    p.add_argument(
        "--data-dir",
        default=None,
        help="where the server keeps its state (default: SVC_DATA_DIR, else ~/.svc/server)",
    )
    p.add_argument(
        "--database-url",
        default=None,
        help="accounts database (default: SVC_DATABASE_URL, else SQLite in the data dir)",
    )
    p.add_argument(
        "--redis-url",
        default=None,
        help="relay log in Redis; redis+cluster://host:port,... for a cluster (SVC_REDIS_URL)",
    )
    _tls_arguments(p)
    p.set_defaults(func=run_up)

    p = sub.add_parser("relay", help="run one relay process")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=50051, help="port to listen on (0: any free)")
    p.add_argument(
        "--data-dir",
        default=None,
        help="where the server keeps its state (default: SVC_DATA_DIR, else ~/.svc/server)",
    )
    p.add_argument("--database-url", default=None, help="channel registry (SVC_DATABASE_URL)")
    p.add_argument(
        "--redis-url",
        default=None,
        help="shared log for several relays; redis+cluster://host:port,... for a Redis "
        "Cluster (SVC_REDIS_URL)",
    )
    p.add_argument("--api-url", default=None, help="account API for the JWKS (SVC_API_URL)")
    p.add_argument(
        "--metrics-port", type=int, default=0, help="Prometheus /metrics port; 0 turns it off"
    )
    _tls_arguments(p)
    p.set_defaults(func=run_relay)
