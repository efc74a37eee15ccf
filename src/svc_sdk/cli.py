"""The ``svc`` command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any, cast

from svc_sdk import __version__, account_cli
from svc_sdk._argtypes import whole_number


def _demo(args: argparse.Namespace) -> int:
    from svc_sdk import demo

    demo.run(rounds=args.rounds)
    return 0


def _mcp(args: argparse.Namespace) -> int:
    from svc_integrations import mcp_server

    return int(mcp_server.main())


class _Help(argparse.RawDescriptionHelpFormatter):
    """Shows each option's default after its help, unless there is nothing to show
    (flags, options without a default) or the help already says it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            default is None
            or isinstance(default, bool)
            or default is argparse.SUPPRESS
            or "default" in text
            or not action.option_strings
        ):
            return text
        return f"{text} (default: %(default)s)"


class _Parser(argparse.ArgumentParser):
    """Every ``svc`` parser, subcommands included, formats its help the same way."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Help)
        super().__init__(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="svc", description="End-to-end encrypted messaging for software agents.")
    parser.add_argument("--version", action="version", version=f"svc {__version__}")
    # Every subcommand parser is a _Parser; the helpers that add them take the base type.
    sub = cast(
        "argparse._SubParsersAction[argparse.ArgumentParser]",
        parser.add_subparsers(dest="command", required=True, metavar="COMMAND"),
    )
    demo = sub.add_parser("demo", help="two agents exchange encrypted messages")
    demo.add_argument("--rounds", type=whole_number(1), default=3, help="message round trips")
    demo.set_defaults(func=_demo)
    mcp = sub.add_parser(
        "mcp",
        help="serve the svc tools over MCP (stdio) as the agent SVC_IDENTITY",
        description="An MCP server over stdio with the tools svc_create_channel, svc_invite, "
        "svc_join, svc_send, svc_receive, svc_list_channels, svc_send_envelope and "
        "svc_receive_envelopes. Configured by SVC_IDENTITY, SVC_RELAY, SVC_API_URL, "
        "SVC_API_KEY and SVC_DATA_DIR.",
    )
    mcp.set_defaults(func=_mcp)
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
    except ImportError as exc:  # an optional extra that is not installed names itself
        print(f"svc: runtime error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `svc demo | head`: the reader left, nothing to report
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
