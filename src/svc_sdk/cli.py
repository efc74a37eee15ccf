"""The client's subcommands of ``svc``: ``demo``, ``state`` and the account commands. The ``svc``
command itself is composed in ``svc_cli`` (the repository's ``cli/``), above the library
and the servers, so that the library never imports the servers."""

from __future__ import annotations

import argparse

from svc_sdk import account_cli, state_cli
from svc_sdk._argtypes import whole_number

__all__ = ["add_commands"]


def _demo(args: argparse.Namespace) -> int:
    from svc_sdk import demo

    demo.run(rounds=args.rounds)
    return 0


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    demo = sub.add_parser("demo", help="two agents exchange encrypted messages")
    demo.add_argument("--rounds", type=whole_number(1), default=3, help="message round trips")
    demo.set_defaults(func=_demo)
    account_cli.add_commands(sub)
    state_cli.add_commands(sub)
