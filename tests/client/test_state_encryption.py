"""Encryption at rest of a data_dir (SQLCipher; svc_sdk.state_key): keys and their
sources, failing closed (missing, wrong, unexpected key, damaged files: refused, nothing
written), crash-safe migration and rotation killed at every step, no plaintext or signing
key in any file of an encrypted data_dir, and a client on an encrypted data_dir end to end."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from svc_sdk import SvcClient, state_key
from svc_sdk.errors import InternalError
from svc_sdk.local_state import LocalState
from svc_sdk.mls import Engine
from svc_sdk.testing import LocalIssuer, LocalStack

KEY = bytes(range(32))
OTHER = bytes(range(1, 33))
GROUP = b"acme/tests/at-rest"
ISSUER = LocalIssuer()


def _marker() -> bytes:
    return b"PLAINTEXT-" + uuid.uuid4().hex.encode()


def _secret_key(data_dir: Path, key: bytes | None) -> bytes:
    """The signing key stored in data_dir, read from a decrypted copy if need be."""
    copy = data_dir.parent / f"{data_dir.name}-peek"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(data_dir, copy)
    if key is not None:
        state_key.decrypt(copy, key)
    db = sqlite3.connect(copy / "mls.sqlite3")
    try:
        (secret,) = db.execute("SELECT secret_key FROM svc_identity").fetchone()
    finally:
        db.close()
        shutil.rmtree(copy)
    return bytes(secret)


def _populate(data_dir: Path, key: bytes | None, secret: bytes) -> None:
    """An agent with a group, a queued (outbox) message and an unread inbox message."""
    engine = ISSUER.certify(Engine(data_dir, b"alice", state_key=key))
    group = engine.create_group(GROUP)
    group.encrypt_queued([(1, bytes(16), secret + b"-outbox")])
    state = LocalState.of(engine)
    state.add_channel(GROUP.decode(), 0, 0)
    state.advance(GROUP.decode(), 7, [(7, b"bob", secret + b"-inbox")])
    state.close()
    engine.close()


def _open(data_dir: Path, key: bytes | None) -> tuple[object, ...]:
    """What the agent sees: its groups, its public key, its outbox and its inbox."""
    engine = Engine(data_dir, b"alice", state_key=key)
    try:
        state = LocalState.of(engine)
        inbox = state.inbox(GROUP.decode())
        state.close()
        outbox = [row[3] for row in engine.group(GROUP).outbox()]
        return engine.group_ids(), engine.signature_key, outbox, inbox
    finally:
        engine.close()


def _snapshot(data_dir: Path) -> dict[str, bytes]:
    # The lock file is rewritten with the holder's pid on every attempt; it holds no state.
    return {p.name: p.read_bytes() for p in sorted(data_dir.iterdir()) if p.name != "lock"}


def _all_bytes(data_dir: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(data_dir.iterdir()) if p.is_file())


@pytest.fixture
def plain_dir(tmp_path: Path) -> tuple[Path, bytes]:
    secret = _marker()
    _populate(tmp_path / "agent", None, secret)
    return tmp_path / "agent", secret


@pytest.fixture
def encrypted_dir(tmp_path: Path) -> tuple[Path, bytes]:
    secret = _marker()
    _populate(tmp_path / "agent", KEY, secret)
    return tmp_path / "agent", secret


# -- no plaintext at rest -------------------------------------------------------------


@pytest.mark.parametrize("encrypted", [False, True], ids=["plaintext", "encrypted"])
def test_no_message_plaintext_or_signing_key_in_any_file(tmp_path: Path, encrypted: bool) -> None:
    """Every file of the data_dir (databases, -wal, -shm) is searched, while the engine
    is open and after. The plaintext run is the control: the same search finds both
    there, so the test fails if encryption stops covering a file."""
    data_dir, secret, key = tmp_path / "agent", _marker(), KEY if encrypted else None
    _populate(data_dir, key, secret)
    signing_key = _secret_key(data_dir, key)
    assert len(signing_key) >= 32
    engine = Engine(data_dir, b"alice", state_key=key)  # open: -wal and -shm exist
    state = LocalState.of(engine)
    state.advance(GROUP.decode(), 8, [(8, b"bob", secret + b"-second")])
    names = {p.name for p in data_dir.iterdir()}
    assert {"mls.sqlite3-wal", "client.sqlite3-wal"} <= names
    blobs = [_all_bytes(data_dir)]
    state.close()
    engine.close()
    blobs.append(_all_bytes(data_dir))
    for blob in blobs:
        found = [secret in blob, signing_key in blob, bytes(reversed(signing_key)) in blob]
        if encrypted:
            assert found == [False, False, False]
        else:
            assert found[0] and found[1]
    assert state_key.encryption(data_dir) == ("encrypted" if encrypted else "plaintext")


# -- failing closed ---------------------------------------------------------------------


def test_encrypted_data_dir_without_key_is_refused_and_unchanged(
    encrypted_dir: tuple[Path, bytes],
) -> None:
    data_dir, _ = encrypted_dir
    before = _snapshot(data_dir)
    with pytest.raises(InternalError) as err:
        Engine(data_dir, b"alice")
    message = str(err.value)
    assert message.startswith(f"runtime error: cannot use data_dir {data_dir}: mls.sqlite3 ")
    assert "it is encrypted (or damaged) and no key was given" in message
    assert "SVC_STATE_KEY" in message
    with pytest.raises(InternalError, match="client.sqlite3 is not a usable database without"):
        LocalState(data_dir)
    assert _snapshot(data_dir) == before


def test_wrong_key_is_refused_and_unchanged(
    encrypted_dir: tuple[Path, bytes], capfd: pytest.CaptureFixture[str]
) -> None:
    data_dir, _ = encrypted_dir
    before = _snapshot(data_dir)
    with pytest.raises(InternalError, match="with this state key: the key is wrong") as err:
        Engine(data_dir, b"alice", state_key=OTHER)
    assert str(err.value).startswith("runtime error: ")
    assert KEY.hex() not in str(err.value) and OTHER.hex() not in str(err.value)
    with pytest.raises(InternalError, match="the key is wrong"):
        LocalState(data_dir, OTHER)
    assert _snapshot(data_dir) == before
    # The error says it; SQLCipher's own log ("ERROR CORE sqlcipher_page_cipher: hmac
    # check failed ...") stays off the application's stderr.
    assert capfd.readouterr().err == ""
    assert _open(data_dir, KEY)[0] == [GROUP]


def test_key_on_a_plaintext_data_dir_says_how_to_encrypt(plain_dir: tuple[Path, bytes]) -> None:
    data_dir, _ = plain_dir
    before = _snapshot(data_dir)
    with pytest.raises(InternalError, match="it is not encrypted") as err:
        Engine(data_dir, b"alice", state_key=KEY)
    assert f"svc state encrypt {data_dir}" in str(err.value)
    assert _snapshot(data_dir) == before


def test_half_encrypted_data_dir_is_refused_either_way(
    tmp_path: Path, plain_dir: tuple[Path, bytes]
) -> None:
    """client.sqlite3 encrypted beside a plaintext mls.sqlite3 (files mixed from two
    data_dirs): no key opens it, and neither attempt writes."""
    data_dir, _ = plain_dir
    other = tmp_path / "other"
    _populate(other, KEY, _marker())
    shutil.copy2(other / "client.sqlite3", data_dir / "client.sqlite3")
    for stale in data_dir.glob("client.sqlite3-*"):
        stale.unlink()
    before = _snapshot(data_dir)
    with pytest.raises(InternalError, match="client.sqlite3 is not a usable database without"):
        Engine(data_dir, b"alice")
    with pytest.raises(InternalError, match="mls.sqlite3 is not a usable database with a state"):
        Engine(data_dir, b"alice", state_key=KEY)
    assert _snapshot(data_dir) == before


@pytest.mark.parametrize("keep", [100, 4096, 8192])
def test_truncated_encrypted_database_is_refused_and_unchanged(
    encrypted_dir: tuple[Path, bytes], keep: int
) -> None:
    data_dir, _ = encrypted_dir
    db = data_dir / "mls.sqlite3"
    assert db.stat().st_size > keep
    with db.open("r+b") as f:
        f.truncate(keep)
    before = _snapshot(data_dir)
    with pytest.raises(InternalError) as err:
        Engine(data_dir, b"alice", state_key=KEY)
    assert str(err.value).startswith(f"runtime error: cannot use data_dir {data_dir}: ")
    assert _snapshot(data_dir) == before


def test_new_data_dir_with_a_key_is_encrypted_from_the_start(tmp_path: Path) -> None:
    data_dir = tmp_path / "new"
    Engine(data_dir, b"alice", state_key=KEY).close()
    LocalState(data_dir, KEY).close()
    assert state_key.encryption(data_dir) == "encrypted"
    for name in ("mls.sqlite3", "client.sqlite3"):
        assert not (data_dir / name).read_bytes().startswith(b"SQLite format 3")
        assert (data_dir / name).stat().st_mode & 0o777 == 0o600


# -- key sources ------------------------------------------------------------------------


def test_key_sources_and_their_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SVC_STATE_KEY", raising=False)
    monkeypatch.delenv("SVC_STATE_KEY_FILE", raising=False)
    assert state_key.resolve_state_key() is None
    assert state_key.resolve_state_key(KEY) == KEY
    assert state_key.resolve_state_key(KEY.hex().upper()) == KEY
    for bad in ("abc", "zz" * 32, "correct horse battery staple"):
        with pytest.raises(InternalError, match="state_key must be 64 hexadecimal") as err:
            state_key.resolve_state_key(bad)
        assert bad not in str(err.value)
    with pytest.raises(InternalError, match="got 31 bytes"):
        state_key.resolve_state_key(KEY[:31])
    monkeypatch.setenv("SVC_STATE_KEY", "")
    with pytest.raises(InternalError, match="SVC_STATE_KEY is set but empty"):
        state_key.resolve_state_key()
    monkeypatch.setenv("SVC_STATE_KEY", KEY.hex())
    assert state_key.resolve_state_key() == KEY
    assert state_key.resolve_state_key(OTHER) == OTHER  # the argument wins
    key_file = tmp_path / "key"
    key_file.write_text(OTHER.hex() + "\n")
    key_file.chmod(0o600)
    monkeypatch.setenv("SVC_STATE_KEY_FILE", str(key_file))
    with pytest.raises(InternalError, match="both SVC_STATE_KEY and SVC_STATE_KEY_FILE"):
        state_key.resolve_state_key()
    monkeypatch.delenv("SVC_STATE_KEY")
    assert state_key.resolve_state_key() == OTHER
    key_file.chmod(0o640)
    with pytest.raises(InternalError, match=r"accessible by other users \(mode 640\)"):
        state_key.resolve_state_key()
    key_file.chmod(0o600)
    link = tmp_path / "link"
    link.symlink_to(key_file)
    monkeypatch.setenv("SVC_STATE_KEY_FILE", str(link))
    with pytest.raises(InternalError, match="cannot read the state key file"):
        state_key.resolve_state_key()
    monkeypatch.setenv("SVC_STATE_KEY_FILE", str(tmp_path / "missing"))
    with pytest.raises(InternalError, match="cannot read the state key file"):
        state_key.resolve_state_key()
    monkeypatch.setenv("SVC_STATE_KEY_FILE", str(tmp_path))
    with pytest.raises(InternalError, match="not a regular file"):
        state_key.resolve_state_key()


# -- migration and rotation, killed at every step ----------------------------------------

CONVERT = """
import sys
from svc_sdk import state_key
data_dir, old, new = sys.argv[1], sys.argv[2], sys.argv[3]
old_key = bytes.fromhex(old) if old else None
new_key = bytes.fromhex(new) if new else None
if old_key is None:
    state_key.encrypt(data_dir, new_key)
elif new_key is None:
    state_key.decrypt(data_dir, old_key)
else:
    state_key.rekey(data_dir, old_key, new_key)
"""


def _convert(data_dir: Path, old: bytes | None, new: bytes | None, crash_at: int | None) -> int:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SVC_STATE")}
    if crash_at is not None:
        env["SVC_STATE_CONVERT_CRASH_AT"] = str(crash_at)
    args = [sys.executable, "-c", CONVERT, str(data_dir), (old or b"").hex(), (new or b"").hex()]
    return subprocess.run(args, env=env, timeout=60, capture_output=True).returncode


@pytest.mark.parametrize(
    ("old", "new"),
    [(None, KEY), (KEY, OTHER), (KEY, None)],
    ids=["encrypt", "rekey", "decrypt"],
)
def test_conversion_killed_at_every_step_loses_nothing(
    tmp_path: Path, old: bytes | None, new: bytes | None
) -> None:
    """The conversion runs in a child killed (SIGKILL) at step 1, 2, … until one run
    finishes. After every kill the data_dir opens under exactly one of the two keys with
    everything in it; running the conversion again then completes it."""
    original, secret = tmp_path / "original", _marker()
    _populate(original, old, secret)
    expected = _open(original, old)
    assert expected[0] == [GROUP] and expected[2] == [secret + b"-outbox"]
    assert expected[3] == [(7, b"bob", secret + b"-inbox")]
    crashes = 0
    for step in range(1, 50):
        data_dir = tmp_path / f"step{step}"
        shutil.copytree(original, data_dir)
        code = _convert(data_dir, old, new, crash_at=step)
        if code == 0:
            break
        assert code == -9, f"step {step}: exit {code}"
        crashes += 1
        # Opening recovers first: the data_dir is under the old key, or under the new one.
        try:
            seen = _open(data_dir, old)
            under = "old"
        except InternalError:
            seen = _open(data_dir, new)
            under = "new"
        assert seen == expected, f"step {step} ({under} key)"
        leftovers = {p.name for p in data_dir.iterdir()} - {
            "lock", "mls.sqlite3", "client.sqlite3", "mls.sqlite3-wal", "mls.sqlite3-shm",
            "client.sqlite3-wal", "client.sqlite3-shm",
        }  # fmt: skip
        assert not leftovers, f"step {step}: {leftovers}"
        if under == "old":  # not committed yet: running it again converts
            assert _convert(data_dir, old, new, crash_at=None) == 0
        assert _open(data_dir, new) == expected, f"step {step}, after the rerun"
        with pytest.raises(InternalError):
            _open(data_dir, old)
    else:
        pytest.fail("the conversion never finished")
    assert crashes >= 6  # every step was reached: exports, journal, each rename
    assert _open(data_dir, new) == expected


def test_rekey_with_the_wrong_old_key_changes_nothing(encrypted_dir: tuple[Path, bytes]) -> None:
    data_dir, _ = encrypted_dir
    before = _snapshot(data_dir)
    with pytest.raises(InternalError, match="the key is wrong"):
        state_key.rekey(data_dir, OTHER, KEY)
    with pytest.raises(InternalError, match="encrypted already; change its key with"):
        state_key.encrypt(data_dir, OTHER)
    assert _snapshot(data_dir) == before


def test_conversion_of_a_data_dir_in_use_is_refused(encrypted_dir: tuple[Path, bytes]) -> None:
    data_dir, _ = encrypted_dir
    engine = Engine(data_dir, b"alice", state_key=KEY)
    try:
        with pytest.raises(InternalError, match="in use by another process"):
            state_key.rekey(data_dir, KEY, OTHER)
    finally:
        engine.close()
    state_key.rekey(data_dir, KEY, OTHER)
    assert _open(data_dir, OTHER)[0] == [GROUP]


def test_cli_encrypt_status_rekey(plain_dir: tuple[Path, bytes], tmp_path: Path) -> None:
    data_dir, secret = plain_dir
    env = {k: v for k, v in os.environ.items() if not k.startswith("SVC_STATE")}

    def svc(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "svc_cli", "state", *args],
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=60,
        )

    key_file = tmp_path / "state.key"
    assert svc("keygen", "--file", str(key_file)).returncode == 0
    assert key_file.stat().st_mode & 0o777 == 0o600
    assert svc("keygen", "--file", str(key_file)).returncode == 1  # never overwritten
    assert svc("status", str(data_dir)).stdout.strip().endswith("plaintext")
    missing = svc("encrypt", str(data_dir))
    assert missing.returncode == 1 and "needs a state key" in missing.stderr
    done = svc("encrypt", str(data_dir), SVC_STATE_KEY_FILE=str(key_file))
    assert done.returncode == 0, done.stderr
    assert svc("status", str(data_dir)).stdout.strip().endswith("encrypted")
    assert secret not in _all_bytes(data_dir)
    new = state_key.generate_key()
    rotated = svc("rekey", str(data_dir), SVC_STATE_KEY_FILE=str(key_file), SVC_NEW_STATE_KEY=new)
    assert rotated.returncode == 0, rotated.stderr
    assert new not in rotated.stdout + rotated.stderr
    assert _open(data_dir, bytes.fromhex(new))[3] == [(7, b"bob", secret + b"-inbox")]
    assert "state" in svc("--help").stdout


# -- end to end -------------------------------------------------------------------------


def test_encrypted_clients_exchange_messages_and_restart(
    stack: LocalStack, ids: Callable[[str], str], channel_name: str, tmp_path: Path
) -> None:
    """Alice and bob on encrypted data_dirs (key by argument, and by key file) talk
    through the relay; bob's unread message waits in his encrypted inbox across a
    restart; without the key his data_dir does not open."""
    key_file = tmp_path / "bob.key"
    key_file.write_text(OTHER.hex())
    key_file.chmod(0o600)

    def client(who: str, **kwargs: object) -> SvcClient:
        return SvcClient(
            stack.relay_url,
            tmp_path / who,
            ids(who).encode(),
            stack.api_key,
            stack.api_url,
            **kwargs,  # type: ignore[arg-type]
        )

    secret = _marker()
    alice = client("alice", state_key=KEY)
    os.environ["SVC_STATE_KEY_FILE"] = str(key_file)
    try:
        bob = client("bob")
    finally:
        del os.environ["SVC_STATE_KEY_FILE"]
    with alice:
        chan_a = alice.create_channel(channel_name)
        with bob:
            welcome = chan_a.add_member(bob.generate_key_package())
            chan_b = bob.join_channel(channel_name, welcome)
            chan_a.send(b"hello")
            got = chan_b.next_message(10)
            assert got is not None and got.data == b"hello"
            chan_a.send(secret)
            chan_a.wait_stored()
            assert chan_b._deliveries.wait(20)
            chan_b._deliveries.process_pending()  # nobody reading: into the inbox
            assert secret not in _all_bytes(tmp_path / "bob")
        with pytest.raises(InternalError, match="no key was given"):
            client("bob")
        with client("bob", state_key=OTHER) as again:
            msg = again.channel(channel_name).next_message(10)
            assert msg is not None and msg.data == secret
            again.channel(channel_name).send(b"back")
        back = chan_a.next_message(10)
        assert back is not None and back.data == b"back"
    for who in ("alice", "bob"):
        assert state_key.encryption(tmp_path / who) == "encrypted"


def test_odd_paths_and_key_lengths(tmp_path: Path) -> None:
    """A data_dir whose path has quotes (it is spliced into ATTACH as an SQL string) is
    converted; the engine itself refuses a key of the wrong length before touching the
    folder."""
    data_dir, secret = tmp_path / 'o\'brien "x" ;--', _marker()
    _populate(data_dir, None, secret)
    state_key.encrypt(data_dir, KEY)
    assert _open(data_dir, KEY)[3] == [(7, b"bob", secret + b"-inbox")]
    fresh = tmp_path / "fresh"
    for bad in (b"", KEY[:16], KEY + b"x"):
        with pytest.raises(InternalError, match="bad state key: a state key is 32 bytes"):
            Engine(fresh, b"alice", state_key=bad)
    assert not fresh.exists()
