"""State across real process restarts, including a process killed with SIGKILL."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from svc_sdk.errors import ChannelClosedError
from svc_sdk.mls import Engine

from ..conftest import ISSUER, member_id


def certified(data_dir: str | Path, identity: bytes) -> str:
    """A data_dir holding a credential and the issuer's key, for another process to open."""
    ISSUER.certify(Engine(data_dir, identity)).close()
    return str(data_dir)


def run_agent(code: str, *args: str) -> list[bytes]:
    """Runs ``code`` in a fresh interpreter; it prints hex lines, which are returned."""
    script = "import sys\nfrom svc_sdk.mls import Engine\n" + textwrap.dedent(code)
    proc = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=60
    )
    assert proc.stderr == "" or proc.returncode == -9, proc.stderr
    return [bytes.fromhex(line) for line in proc.stdout.split()]


def test_group_survives_restart_and_sigkill(tmp_path: Path) -> None:
    alice_dir = certified(tmp_path / "alice", b"alice")
    bob_dir = certified(tmp_path / "bob", b"bob")
    # Process 1: bob makes a key package and exits.
    (key_package,) = run_agent(
        "print(Engine(sys.argv[1], b'bob').generate_key_package().hex())", bob_dir
    )
    # Process 2: alice creates the channel, adds bob, sends, then dies without cleanup.
    welcome, first = run_agent(
        """
        import os, signal
        group = Engine(sys.argv[1], b"alice").create_group(b"org/ns/svc")
        pending = group.add_members([bytes.fromhex(sys.argv[2])])
        group.apply_pending_commit()
        print(pending.welcome.hex())
        print(group.encrypt(b"before the crash").hex(), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """,
        alice_dir,
        key_package.hex(),
    )
    # Bob (a new process since his key package was made) joins from the Welcome.
    bob = Engine(bob_dir, b"bob").join_group(welcome)
    assert bob.process(first).data == b"before the crash"
    reply = bob.encrypt(b"reply while alice was down")
    # Process 3: alice restarts, resumes the group, reads the reply, sends again.
    (second,) = run_agent(
        """
        engine = Engine(sys.argv[1], b"alice")
        assert engine.group_ids() == [b"org/ns/svc"], engine.group_ids()
        group = engine.group(b"org/ns/svc")
        assert group.process(bytes.fromhex(sys.argv[2])).data == b"reply while alice was down"
        print(group.encrypt(b"after the restart").hex())
        """,
        alice_dir,
        reply.hex(),
    )
    # The restarted sender did not reuse the key generation it used before the crash.
    assert bob.process(second).data == b"after the restart"


def test_pending_commit_survives_restart(tmp_path: Path) -> None:
    alice_dir = certified(tmp_path / "alice", b"alice")
    bob = ISSUER.certify(Engine(tmp_path / "bob", b"bob"))
    (commit,) = run_agent(
        """
        group = Engine(sys.argv[1], b"alice").create_group(b"g")
        print(group.add_members([bytes.fromhex(sys.argv[2])]).commit.hex())
        """,
        alice_dir,
        bob.generate_key_package().hex(),
    )
    group = Engine(alice_dir, b"alice").group(b"g")
    assert group.has_pending_commit
    # The relay's echo of the accepted commit applies it after the restart.
    assert group.process(commit).added == [member_id("bob")]
    assert group.epoch == 1


def test_a_joined_group_deletes_its_key_package_once(
    make_engine: Callable[[str], Engine],
) -> None:
    """Joining erases the key package's secrets; the group's later writes leave the key
    package table alone (mls-rs asks for the delete again at every write of a group it
    joined, which was a statement and a commit of their own per message)."""
    alice, bob = make_engine("alice"), make_engine("bob")
    key_package = bob.generate_key_package()
    db = str(bob.data_dir / "mls.sqlite3")

    def sql(statement: str, *args: str) -> list[list[str]]:
        """Runs ``statement`` from another process: a second SQLite library in this one
        would not see the engine's locks."""
        script = (
            "import sqlite3, sys, json; conn = sqlite3.connect(sys.argv[1]);"
            "args = [bytes.fromhex(a) for a in sys.argv[3:]];"
            "rows = conn.execute(sys.argv[2], args).fetchall(); conn.commit();"
            "print(json.dumps([[v.hex() if isinstance(v, bytes) else v for v in r] for r in rows]))"
        )
        done = subprocess.run(
            [sys.executable, "-c", script, db, statement, *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return json.loads(done.stdout)

    (stored,) = sql("SELECT id, data FROM key_package")
    group = alice.create_group(b"org/ns/svc")
    pending = group.add_members([key_package])
    group.apply_pending_commit()
    assert pending.welcome is not None
    joined = bob.join_group(pending.welcome)
    assert sql("SELECT id FROM key_package") == [], "joining erases the key package's secrets"
    # The row back, behind the engine's back: a repeated delete would take it again.
    sql("INSERT INTO key_package VALUES (?, 0, ?)", *stored)
    for n in range(3):
        assert joined.process(group.encrypt(b"ping %d" % n)).data == b"ping %d" % n
        assert group.process(joined.encrypt(b"pong %d" % n)).data == b"pong %d" % n
    assert sql("SELECT id, data FROM key_package") == [stored]


def test_a_closed_engine_writes_nothing_more_to_its_data_dir(tmp_path: Path) -> None:
    """close() frees the data_dir for the next engine; a group handed out before (a
    thread still sending, say) must not write a ratchet state of its own beside that
    engine's: it raises ChannelClosedError, as the closed client's channels do."""
    data_dir = certified(tmp_path / "alice", b"alice")
    engine = Engine(data_dir, b"alice")
    group = engine.create_group(b"org/ns/svc")
    group.encrypt(b"before")
    engine.close()
    following = Engine(data_dir, b"alice")
    with pytest.raises(ChannelClosedError, match="the engine is closed"):
        group.encrypt(b"after")
    with pytest.raises(ChannelClosedError):
        engine.group(b"org/ns/svc")
    following.group(b"org/ns/svc").encrypt(b"from the next engine")
    following.close()
