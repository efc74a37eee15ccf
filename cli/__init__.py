"""The ``svc`` command: the client's subcommands (``svc_sdk.cli``), the servers'
(``svc_server.cli``) and ``svc mcp`` (``svc_integrations``), composed here, above all
three, so that the library never imports the servers (docs/architecture.md).

Run it as ``svc`` or ``python -m svc_cli``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any, cast

from svc_sdk import __version__, account_cli
from svc_sdk import cli as client_cli
from svc_server import cli as server_cli

__all__ = ["build_parser", "main"]


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
    client_cli.add_commands(sub)
    mcp = sub.add_parser(
        "mcp",
        help="serve the svc tools over MCP (stdio) as the agent SVC_IDENTITY",
        description="An MCP server over stdio with the tools svc_create_channel, svc_invite, "
        "svc_join, svc_send, svc_receive, svc_list_channels, svc_send_envelope and "
        "svc_receive_envelopes. Configured by SVC_IDENTITY, SVC_RELAY, SVC_API_URL, "
        "SVC_API_KEY and SVC_DATA_DIR.",
    )
    mcp.set_defaults(func=_mcp)
    # svc_server ships in the same wheel; only running its commands needs the server extra.
    server_cli.add_commands(sub)
    return parser


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
    except KeyboardInterrupt:
        # Ctrl-C before a command installs its own handlers (a server still starting, a
        # client command): the user asked for it, so no traceback; 128 + SIGINT, as a
        # shell reports a process that SIGINT ended.
        return 130
