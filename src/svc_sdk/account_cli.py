"""``svc signup``, ``svc keys`` and ``svc token``: the account API from the shell."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import httpx

from svc_sdk import credentials


class CliError(Exception):
    pass


def _request(method: str, path: str, *, key: str | None, body: Any = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        response = httpx.request(
            method,
            credentials.api_url() + path,
            headers=headers,
            json=body,
            timeout=10,
            verify=credentials.tls_verify(),
        )
    except httpx.HTTPError as exc:
        raise CliError(f"transport error: cannot reach {credentials.api_url()}: {exc}") from exc
    if response.status_code >= 400:
        try:
            detail = response.json().get("detail") or response.json().get("title")
        except ValueError:
            detail = response.text[:200]
        prefix = "auth error: " if response.status_code == 401 else ""
        raise CliError(f"{prefix}{detail} (HTTP {response.status_code})")
    return response


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


def signup(args: argparse.Namespace) -> None:
    body = {"email": args.email, **({"name": args.name} if args.name else {})}
    data = _request("POST", "/v1/accounts", key=None, body=body).json()
    path = credentials.save_api_key(data["api_key"]["key"])
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


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    def json_flag(p: argparse.ArgumentParser) -> None:
        p.add_argument("--json", action="store_true", help="machine-readable output")

    p = sub.add_parser("signup", help="create an account; writes the API key to ~/.svc/api-key")
    p.add_argument("email")
    p.add_argument("--name", default=None)
    json_flag(p)
    p.set_defaults(func=signup)

    keys = sub.add_parser("keys", help="create, list and revoke API keys")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    p = keys_sub.add_parser("create", help="create a key (shown once)")
    p.add_argument("--name", default="default")
    json_flag(p)
    p.set_defaults(func=keys_create)
    p = keys_sub.add_parser("list", help="active keys, newest first")
    json_flag(p)
    p.set_defaults(func=keys_list)
    p = keys_sub.add_parser("revoke", help="revoke a key by id")
    p.add_argument("id")
    json_flag(p)
    p.set_defaults(func=keys_revoke)

    p = sub.add_parser("token", help="exchange the API key for a relay JWT")
    json_flag(p)
    p.set_defaults(func=token)
