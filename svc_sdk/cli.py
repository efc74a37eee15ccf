"""The ``svc`` command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from svc_sdk import account_cli


def _demo(args: argparse.Namespace) -> int:
    from svc_sdk import demo

    demo.run(rounds=args.rounds)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="svc", description="End-to-end encrypted messaging for software agents."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = sub.add_parser("demo", help="two agents exchange encrypted messages")
    demo.add_argument("--rounds", type=int, default=3, help="message round trips (default 3)")
    demo.set_defaults(func=_demo)
    account_cli.add_commands(sub)
    _server_commands(sub)
    return parser


def _server_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    try:
        from svc_server import cli as server_cli
    except ImportError:  # pragma: no cover - svc_server ships in the same wheel
        return
    server_cli.add_commands(sub)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (RuntimeError, account_cli.CliError) as exc:  # messages carry their subsystem prefix
        print(f"svc: {exc}", file=sys.stderr)
        return 1
    except ModuleNotFoundError as exc:
        print(
            f"svc: runtime error: {exc.name} is not installed; the server commands need "
            "the server extra: pip install 'svc-sdk[server]'",
            file=sys.stderr,
        )
        return 1
    except BrokenPipeError:  # `svc demo | head`: the reader left, nothing to report
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
