"""``svc api`` runs the account API; ``svc rotate-signing-key`` rotates its JWT key."""

from __future__ import annotations

import argparse


def run_api(args: argparse.Namespace) -> None:
    import uvicorn

    from .api import create_app
    from .config import Settings

    overrides = {"database_url": args.database_url} if args.database_url else {}
    if args.data_dir:
        overrides["data_dir"] = args.data_dir
    settings = Settings(**overrides)
    app = create_app(settings)
    print(f"svc account API on http://{args.host}:{args.port}", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)


def rotate_signing_key(args: argparse.Namespace) -> None:
    from .config import Settings
    from .db import migrate
    from .db.session import make_engine, make_sessionmaker, transaction
    from .services import signing

    overrides = {"database_url": args.database_url} if args.database_url else {}
    settings = Settings(**overrides)
    engine = make_engine(settings)
    migrate.upgrade(engine)
    with transaction(make_sessionmaker(engine)) as session:
        key = signing.rotate(session, settings.token_ttl_seconds)
        kid = key.kid
    engine.dispose()
    # API processes pick the new key up within 30 s; old tokens verify until they expire.
    print(f"new signing key {kid}; the previous key verifies until its tokens expire")


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("api", help="run the account API server")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--database-url", default=None, help="default: SVC_DATABASE_URL or SQLite")
    p.add_argument("--data-dir", default=None, help="default: SVC_DATA_DIR or ~/.svc/server")
    p.add_argument("--log-level", default="warning")
    p.set_defaults(func=run_api)

    p = sub.add_parser("rotate-signing-key", help="rotate the JWT signing key")
    p.add_argument("--database-url", default=None, help="default: SVC_DATABASE_URL or SQLite")
    p.set_defaults(func=rotate_signing_key)
