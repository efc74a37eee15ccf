"""Where an agent keeps its state: a default folder per OS user, relay, account and
identity; folders and files that are not private to this user refused; one process per
data_dir."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from svc_sdk import SvcChannelManager, SvcClient
from svc_sdk.errors import ChannelClosedError, InternalError
from svc_sdk.local_state import LocalState
from svc_sdk.manager import default_data_dir
from svc_sdk.testing import LocalStack

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="only root can hand a folder to another user"
)
NOBODY = 65534


def test_default_data_dir_names_user_relay_account_and_identity() -> None:
    base = default_data_dir(b"alice", "http://127.0.0.1:50051", "acct-1")
    assert base.startswith("/tmp/svc-") and len(base) == len("/tmp/svc-") + 32
    assert base == default_data_dir(b"alice", "http://127.0.0.1:50051", "acct-1")
    others = {
        default_data_dir(b"bob", "http://127.0.0.1:50051", "acct-1"),
        default_data_dir(b"alice", "http://127.0.0.1:50052", "acct-1"),
        default_data_dir(b"alice", "http://127.0.0.1:50051", "acct-2"),
    }
    assert base not in others and len(others) == 3


@pytest.fixture
def default_dirs() -> Iterator[list[Path]]:
    """Default data_dirs a test made under /tmp, removed afterwards."""
    made: list[Path] = []
    yield made
    for path in made:
        shutil.rmtree(path, ignore_errors=True)


def _default_manager(
    stack: LocalStack, identity: str, api_key: str, monkeypatch: pytest.MonkeyPatch
) -> SvcChannelManager:
    monkeypatch.delenv("SVC_DATA_DIR", raising=False)
    return SvcChannelManager(identity, stack.relay_url, api_key=api_key, api_url=stack.api_url)


def test_state_of_another_account_is_never_reused(
    stack: LocalStack,
    ids: Callable[[str], str],
    channel_name: str,
    default_dirs: list[Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The README's example after a server reset: the same identity on the same relay
    under a new account (what a reset gives) starts from a fresh folder."""
    identity = ids("alice")
    with _default_manager(stack, identity, stack.api_key, monkeypatch) as first:
        first.create(channel_name)
        default_dirs.append(first.client.engine.data_dir)
        assert first.client.engine.data_dir == Path(
            default_data_dir(identity.encode(), stack.relay_url, stack.account_id)
        )
    other = stack.signup()
    with _default_manager(stack, identity, other["api_key"]["key"], monkeypatch) as second:
        default_dirs.append(second.client.engine.data_dir)
        assert second.client.engine.data_dir != default_dirs[0]
        assert second.list_channels() == []
        second.create(channel_name.replace("/ch", "/other"))  # works: nothing stale
    # The first account finds its channel again in its own folder.
    with _default_manager(stack, identity, stack.api_key, monkeypatch) as again:
        assert again.list_channels() == [channel_name]


def _client(stack: LocalStack, data_dir: Path, identity: str) -> SvcClient:
    return SvcClient(
        stack.relay_url,
        data_dir,
        identity.encode(),
        api_key=stack.api_key,
        api_url=stack.api_url,
    )


def test_second_user_of_one_data_dir_is_refused(
    stack: LocalStack, ids: Callable[[str], str], tmp_path: Path
) -> None:
    identity, data_dir = ids("alice"), tmp_path / "agent"
    with _client(stack, data_dir, identity):
        with pytest.raises(InternalError, match=f"pid {os.getpid()}") as in_process:
            _client(stack, data_dir, identity)
        assert str(in_process.value).startswith("runtime error: data_dir ")
        assert "in use by another process" in str(in_process.value)
        other = subprocess.run(
            [
                sys.executable,
                "-P",
                "-c",
                "import sys\nfrom svc_sdk import SvcClient\n"
                "SvcClient(sys.argv[1], sys.argv[2], sys.argv[3].encode(), "
                "api_key=sys.argv[4], api_url=sys.argv[5])",
                stack.relay_url,
                str(data_dir),
                identity,
                stack.api_key,
                stack.api_url,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert other.returncode != 0
        assert f"runtime error: data_dir {data_dir} is in use by another process" in other.stderr
    # Closed: the folder is free again.
    with _client(stack, data_dir, identity) as again:
        assert again.channels() == []


def test_data_dir_others_can_read_is_refused(
    stack: LocalStack, ids: Callable[[str], str], tmp_path: Path
) -> None:
    identity, data_dir = ids("alice"), tmp_path / "agent"
    _client(stack, data_dir, identity).close()
    data_dir.chmod(0o755)
    with pytest.raises(InternalError, match=r"other users can access it \(mode 755\)") as err:
        _client(stack, data_dir, identity)
    assert f"chmod 700 {data_dir}" in str(err.value)
    data_dir.chmod(0o700)
    (data_dir / "client.sqlite3").chmod(0o644)
    with pytest.raises(InternalError, match="client.sqlite3 in it is readable by other users"):
        _client(stack, data_dir, identity)
    (data_dir / "client.sqlite3").chmod(0o600)
    _client(stack, data_dir, identity).close()


@needs_root
def test_data_dir_another_user_made_is_refused_and_untouched(
    stack: LocalStack, ids: Callable[[str], str], tmp_path: Path
) -> None:
    """The attack: another local user creates the (predictable) folder in advance, with
    an inbox file of theirs in it, hoping to read what the agent decrypts."""
    identity, data_dir = ids("alice"), tmp_path / "planted"
    data_dir.mkdir(mode=0o700)
    inbox = data_dir / "client.sqlite3"
    inbox.touch(mode=0o666)
    os.chown(inbox, NOBODY, NOBODY)
    os.chown(data_dir, NOBODY, NOBODY)
    with pytest.raises(InternalError, match=f"owned by uid {NOBODY}, not by you") as err:
        _client(stack, data_dir, identity)
    assert str(err.value).startswith(f"runtime error: cannot use data_dir {data_dir}: ")
    assert sorted(p.name for p in data_dir.iterdir()) == ["client.sqlite3"]
    assert inbox.stat().st_size == 0

    # Our own private folder, but with a file of theirs planted in it.
    os.chown(data_dir, os.geteuid(), os.getegid())
    with pytest.raises(InternalError, match=f"client.sqlite3 in it is owned by uid {NOBODY}"):
        _client(stack, data_dir, identity)
    assert inbox.stat().st_size == 0


def test_new_files_are_private_from_the_start(
    stack: LocalStack, ids: Callable[[str], str], tmp_path: Path
) -> None:
    data_dir = tmp_path / "agent"
    old = os.umask(0)  # the loosest umask: modes come from the create calls alone
    try:
        _client(stack, data_dir, ids("alice")).close()
    finally:
        os.umask(old)
    assert data_dir.stat().st_mode & 0o777 == 0o700
    for path in data_dir.iterdir():
        assert path.stat().st_mode & 0o077 == 0, path


@pytest.mark.parametrize("damage", ["garbage", "folder"])
def test_a_corrupt_client_database_is_a_runtime_error(
    stack: LocalStack, ids: Callable[[str], str], tmp_path: Path, damage: str
) -> None:
    """client.sqlite3 overwritten with garbage, or replaced by a folder: the client says
    which file it cannot use (it raised sqlite3.DatabaseError or OperationalError, outside
    the error contract; tests/client/test_error_contract.py found it)."""
    data_dir, identity = tmp_path / "agent", ids("alice")
    _client(stack, data_dir, identity).close()
    inbox = data_dir / "client.sqlite3"
    for stale in data_dir.glob("client.sqlite3-*"):
        stale.unlink()
    if damage == "folder":
        inbox.unlink()
        inbox.mkdir(mode=0o700)
    else:
        inbox.write_bytes(os.urandom(4096))
    with pytest.raises(InternalError, match="client.sqlite3 is not a usable database") as err:
        _client(stack, data_dir, identity)
    assert str(err.value).startswith(f"runtime error: cannot use data_dir {data_dir}: ")
    # The folder is free again (the engine's lock was released): a fixed file works.
    shutil.rmtree(inbox) if damage == "folder" else inbox.unlink()
    _client(stack, data_dir, identity).close()


def test_a_closed_local_state_says_it_is_closed(tmp_path: Path) -> None:
    """Once closed (its client was), the client database refuses every call as closed,
    the error a closed channel raises, not as a storage failure."""
    state = LocalState(tmp_path)
    state.add_channel("acme/tests/closed", 0, 0)
    assert state.channels() == [("acme/tests/closed", 0, 0)]
    state.close()
    with pytest.raises(ChannelClosedError):
        state.channels()
    with pytest.raises(ChannelClosedError):
        state.advance("acme/tests/closed", 1, [(1, b"sender", b"payload")])
