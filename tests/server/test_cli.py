"""``svc signup``, ``svc keys`` and ``svc token`` against a running API."""

from __future__ import annotations

import argparse
import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..support import RunningApi


def svc(
    api: RunningApi, home: Path, *args: str, key: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "SVC_API_KEY"}
    env.update({"HOME": str(home), "SVC_API_URL": api.url})
    if key is not None:
        env["SVC_API_KEY"] = key
    return subprocess.run(
        [sys.executable, "-P", "-m", "svc_cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_signup_keys_and_token(api: RunningApi, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    result = svc(api, home, "signup", "cli@example.com", "--name", "CLI")
    assert result.returncode == 0, result.stderr
    key_file = home / ".svc" / "api-key"
    key = key_file.read_text().strip()
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(key_file.parent.stat().st_mode) == 0o700
    assert result.stdout.count(key) == 1, "the key is printed once"
    assert "cli@example.com" in result.stdout

    created = svc(api, home, "keys", "create", "--name", "second", "--json")
    assert created.returncode == 0, created.stderr
    second = json.loads(created.stdout)
    listed = svc(api, home, "keys", "list")
    assert listed.returncode == 0
    assert listed.stdout.splitlines()[0].split() == [
        "ID",
        "NAME",
        "KEY_PREFIX",
        "CREATED_AT",
        "LAST_USED_AT",
    ]
    assert second["id"] in listed.stdout and key not in listed.stdout
    as_json = json.loads(svc(api, home, "keys", "list", "--json").stdout)
    assert [k["name"] for k in as_json["keys"]] == ["second", "default"]

    token = svc(api, home, "token")
    assert token.returncode == 0 and token.stdout.count(".") == 2
    # SVC_API_KEY wins over the key file.
    via_env = svc(api, home, "token", "--json", key=second["key"])
    assert "expires_at" in json.loads(via_env.stdout)

    revoked = svc(api, home, "keys", "revoke", second["id"])
    assert revoked.returncode == 0, revoked.stderr
    denied = svc(api, home, "token", key=second["key"])
    assert denied.returncode == 1
    assert denied.stderr.startswith("svc: auth error: API key is unknown or revoked")


def test_cli_errors(api: RunningApi, tmp_path: Path) -> None:
    home = tmp_path / "empty-home"
    home.mkdir()
    missing = svc(api, home, "token")
    assert missing.returncode == 1 and "auth error: no API key" in missing.stderr
    bad = svc(api, home, "signup", "not-an-email")
    assert bad.returncode == 1 and "HTTP 422" in bad.stderr
    # The field and the reason, from the problem's errors list.
    reason = "email: An email address must have an @-sign."
    assert f"svc: invalid request: {reason} (HTTP 422)\n  {reason}\n" == bad.stderr
    assert not (home / ".svc").exists(), "nothing saved for a failed signup"
    env = {**os.environ, "HOME": str(home), "SVC_API_URL": "http://127.0.0.1:9"}
    unreachable = subprocess.run(
        [sys.executable, "-m", "svc_cli", "signup", "x@example.com"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert unreachable.returncode == 1 and "transport error: cannot reach" in unreachable.stderr


def test_rotate_signing_key_command(api: RunningApi, tmp_path: Path) -> None:
    import httpx

    before = {k["kid"] for k in httpx.get(f"{api.url}/.well-known/jwks.json").json()["keys"]}
    env = {**os.environ, "SVC_DATA_DIR": str(api.settings.data_dir)}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "svc_cli",
            "rotate-signing-key",
            "--database-url",
            api.settings.database_url,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    new_kid = result.stdout.split()[3].rstrip(";")
    after = {k["kid"] for k in httpx.get(f"{api.url}/.well-known/jwks.json").json()["keys"]}
    assert after == before | {new_kid}


def test_signup_keeps_an_existing_key_file(api: RunningApi, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    assert svc(api, home, "signup", "first@example.com").returncode == 0
    key_file = home / ".svc" / "api-key"
    first = key_file.read_text()

    again = svc(api, home, "signup", "second@example.com")
    assert again.returncode == 1
    assert f"{key_file} already holds an API key" in again.stderr
    assert "--force" in again.stderr
    assert key_file.read_text() == first
    # Refused before the account was made: the address is still free.
    forced = svc(api, home, "signup", "second@example.com", "--force")
    assert forced.returncode == 0, forced.stderr
    assert key_file.read_text() != first
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert sorted(p.name for p in key_file.parent.iterdir()) == ["api-key"]


def test_version_and_help(tmp_path: Path) -> None:
    from svc_cli import build_parser
    from svc_sdk import __version__

    version = subprocess.run(
        [sys.executable, "-P", "-m", "svc_cli", "--version"], capture_output=True, text=True
    )
    assert version.returncode == 0 and version.stdout.strip() == f"svc {__version__}"
    assert __version__ != "0.0.0"

    def parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
        yield parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for child in action.choices.values():
                    yield from parsers(child)

    seen = 0
    for parser in parsers(build_parser()):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                continue
            assert action.help, f"{parser.prog}: {action.dest} has no help line"
            seen += 1
    assert seen > 40
    up = build_parser().parse_args(["up"])
    help_text = _help("up")
    assert "(default: 127.0.0.1)" in help_text and "(default: 8000)" in help_text
    assert "(default: 50051)" in help_text and up.relay_port == 50051
    assert "(default: 50051)" in _help("relay") and "(default: 8000)" in _help("api")
    assert "(default: None)" not in help_text


def _help(command: str) -> str:
    done = subprocess.run(
        [sys.executable, "-P", "-m", "svc_cli", command, "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_ctrl_c_in_a_command_exits_130_without_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A KeyboardInterrupt out of a command (the user pressed Ctrl-C) ends it with 128 +
    SIGINT, as a shell reports an interrupted command, and says nothing more."""
    import svc_cli

    def interrupted(args: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(svc_cli, "_mcp", interrupted)
    assert svc_cli.main(["mcp"]) == 130
    assert capsys.readouterr().err == ""


def test_a_bad_setting_is_named_without_a_traceback_or_its_value(tmp_path: Path) -> None:
    """A server command given settings that do not validate says which, by the
    environment variable to fix, and exits 1; values are not echoed (a database URL
    carries its password)."""
    env = {
        **os.environ,
        "HOME": str(tmp_path),
        "SVC_DATA_DIR": str(tmp_path / "data"),
        "SVC_SUBSCRIBER_BUFFER_BYTES": "5",
        "SVC_RETENTION_SECONDS": "a week",
        "SVC_DATABASE_URL": "postgresql://svc:hunter2@db.invalid/svc",
    }
    for command in ("up", "relay", "api"):
        done = subprocess.run(
            [sys.executable, "-P", "-m", "svc_cli", command],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 1, (command, done.stderr)
        assert done.stderr.startswith("svc: configuration error: SVC_RETENTION_SECONDS: ")
        assert "SVC_SUBSCRIBER_BUFFER_BYTES: Input should be greater than or equal to" in (
            done.stderr
        )
        assert "Traceback" not in done.stderr and "hunter2" not in done.stderr
        assert not (tmp_path / "data").exists(), "nothing started"
