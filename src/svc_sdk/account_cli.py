"""``svc signup``, ``svc keys``, ``svc token`` and ``svc channels``: the account API from
the shell."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from svc_sdk import credentials
from svc_sdk._argtypes import whole_number
from svc_sdk.agent_id import AgentId
from svc_sdk.names import check_channel_name

if TYPE_CHECKING:
    import httpx


class CliError(Exception):
    pass


def _request(
    method: str,
    path: str,
    *,
    key: str | None,
    body: Any = None,
    params: dict[str, int] | None = None,
) -> httpx.Response:
    # Imported here: every `svc` process loads this module, the relay's included, and only
    # these commands talk HTTP (docs/architecture.md, the direction of imports).
    import httpx

    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        response = httpx.request(
            method,
            credentials.api_url() + path,
            headers=headers,
            json=body,
            params=params,
            timeout=10,
            verify=credentials.tls_verify(),
        )
    except httpx.HTTPError as exc:
        raise CliError(f"transport error: cannot reach {credentials.api_url()}: {exc}") from exc
    if response.status_code >= 400:
        raise CliError(_problem_text(response))
    return response


def _problem_text(response: httpx.Response) -> str:
    """One line for an RFC 9457 problem, then one line per field it lists in ``errors``."""
    try:
        problem = response.json()
    except ValueError:
        problem = None
    if not isinstance(problem, dict):
        return f"HTTP {response.status_code}: {response.text[:200]}"
    detail = problem.get("detail") or problem.get("title") or "request failed"
    prefix = "auth error: " if response.status_code == 401 else ""
    lines = [f"{prefix}{detail} (HTTP {response.status_code})"]
    for error in problem.get("errors") or ():
        if isinstance(error, dict):
            lines.append(f"  {error.get('field') or '(request)'}: {error.get('detail')}")
    return "\n".join(lines)


def _key() -> str:
    key = credentials.load_api_key()
    if not key:
        raise CliError(
            f"auth error: no API key; set SVC_API_KEY or run `svc signup` "
            f"(which writes {credentials.key_file()})"
        )
    return key


def _table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    cells = [[("" if r.get(c) is None else str(r.get(c))) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(line.rstrip() for line in lines)


def _existing_key_error(path: Path) -> CliError:
    return CliError(
        f"runtime error: {path} already holds an API key; `svc signup --force` replaces "
        "it (keep a copy if it is the only one for its account)"
    )


def signup(args: argparse.Namespace) -> None:
    path = credentials.key_file()
    # Checked before the account is created; the write below re-checks atomically.
    if path.exists() and not args.force:
        raise _existing_key_error(path)
    body = {"email": args.email, **({"name": args.name} if args.name else {})}
    data = _request("POST", "/v1/accounts", key=None, body=body).json()
    try:
        path = credentials.save_api_key(data["api_key"]["key"], replace=args.force)
    except FileExistsError:
        print(f"API key {data['api_key']['key']}")  # shown once: don't lose it
        raise _existing_key_error(path) from None
    # The key is shown here once; afterwards only the key file holds it.
    if args.json:
        data["api_key"]["key_file"] = str(path)
        print(json.dumps(data, indent=2))
        return
    account = data["account"]
    print(f"account {account['id']} ({account['email']}, plan {account['plan']})")
    print(f"API key {data['api_key']['key']}")
    print(f"saved to {path} (mode 0600); it will not be shown again", file=sys.stderr)


def keys_create(args: argparse.Namespace) -> None:
    data = _request("POST", "/v1/keys", key=_key(), body={"name": args.name}).json()
    if args.json:
        print(json.dumps(data, indent=2))
        return
    print(f"created key {data['id']} ({data['name']})")
    print(data["key"])
    print("This is the only time the full key is shown; store it now.", file=sys.stderr)


def keys_list(args: argparse.Namespace) -> None:
    data = _request("GET", "/v1/keys", key=_key()).json()
    if args.json:
        print(json.dumps(data, indent=2))
        return
    columns = ["id", "name", "key_prefix", "created_at", "last_used_at"]
    print(_table(data["keys"], columns))


def keys_revoke(args: argparse.Namespace) -> None:
    _request("DELETE", f"/v1/keys/{args.id}", key=_key())
    if args.json:
        print(json.dumps({"revoked": args.id}))
    else:
        print(f"revoked key {args.id}")


def token(args: argparse.Namespace) -> None:
    data = _request("POST", "/v1/tokens", key=_key()).json()
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        print(data["token"])


def _agent(data: dict[str, Any]) -> str:
    """``name@account``, as the library prints an AgentId."""
    return str(AgentId(str(data["account_id"]), bytes.fromhex(data["identity"])))


def channels_list(args: argparse.Namespace) -> None:
    data = _request("GET", "/v1/channels", key=_key()).json()
    if args.json:
        print(json.dumps(data, indent=2))
        return
    rows = [
        {
            **c,
            "role": c["role"] or "-",
            "agents": ", ".join(a["agent"] for a in c["agents"]) or "-",
        }
        for c in data["channels"]
    ]
    print(_table(rows, ["name", "access", "role", "agents", "member_count", "epoch"]))


def channels_members(args: argparse.Namespace) -> None:
    name = check_channel_name(args.name)
    data = _request("GET", f"/v1/channels/{name}/members", key=_key()).json()
    if args.json:
        print(json.dumps(data, indent=2))
        return
    print(f"{data['channel']} at epoch {data['epoch']}: {len(data['members'])} members")
    print(_table(data["members"], ["agent", "account_id", "role", "since_epoch"]))


def channels_events(args: argparse.Namespace) -> None:
    name = check_channel_name(args.name)
    params = {"after": args.after, "limit": args.limit}
    data = _request("GET", f"/v1/channels/{name}/events", key=_key(), params=params).json()
    if args.json:
        print(json.dumps(data, indent=2))
        return
    rows = [
        {
            **e,
            "actor": _agent(e["actor"]),
            "subject": _agent(e["subject"]) if e["subject"] else "-",
            "detail": e["detail"] or "-",
        }
        for e in data["events"]
    ]
    print(_table(rows, ["id", "epoch", "at", "kind", "actor", "subject", "detail"]))
    if data["next_after"] is not None:
        print(f"more: svc channels events {name} --after {data['next_after']}", file=sys.stderr)


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    def json_flag(p: argparse.ArgumentParser) -> None:
        p.add_argument("--json", action="store_true", help="machine-readable output")

    p = sub.add_parser("signup", help="create an account; writes the API key to ~/.svc/api-key")
    p.add_argument("email", help="the account's email address")
    p.add_argument("--name", default=None, help="a display name for the account")
    p.add_argument("--force", action="store_true", help="replace an existing ~/.svc/api-key")
    json_flag(p)
    p.set_defaults(func=signup)

    keys = sub.add_parser("keys", help="create, list and revoke API keys")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    p = keys_sub.add_parser("create", help="create a key (shown once)")
    p.add_argument("--name", default="default", help="a label for the key")
    json_flag(p)
    p.set_defaults(func=keys_create)
    p = keys_sub.add_parser("list", help="active keys, newest first")
    json_flag(p)
    p.set_defaults(func=keys_list)
    p = keys_sub.add_parser("revoke", help="revoke a key by id")
    p.add_argument("id", help="the key's id, from `svc keys list`")
    json_flag(p)
    p.set_defaults(func=keys_revoke)

    p = sub.add_parser("token", help="exchange the API key for a relay JWT")
    json_flag(p)
    p.set_defaults(func=token)

    chans = sub.add_parser(
        "channels", help="your account's channels, their members and audit trails"
    )
    chans_sub = chans.add_subparsers(dest="channels_command", required=True, metavar="ACTION")
    p = chans_sub.add_parser(
        "list", help="channels with one of your agents in them, or a live invite redemption"
    )
    json_flag(p)
    p.set_defaults(func=channels_list)
    p = chans_sub.add_parser("members", help="a channel's members and their roles")
    p.add_argument("name", help="the channel, org/namespace/service")
    json_flag(p)
    p.set_defaults(func=channels_members)
    p = chans_sub.add_parser(
        "events", help="a channel's audit trail: who added, removed, left, roles, policy"
    )
    p.add_argument("name", help="the channel, org/namespace/service")
    p.add_argument(
        "--after", type=whole_number(0), default=0, help="only events with a larger id than this"
    )
    p.add_argument(
        "--limit", type=whole_number(1, 1000), default=100, help="at most this many (1-1000)"
    )
    json_flag(p)
    p.set_defaults(func=channels_events)
