"""Server processes freeze their start-up heap out of the cyclic collector's reach
(server/heap.py), and keep collecting what they make afterwards."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ..support import free_port

# Runs the svc command and prints, as it exits, how many objects are frozen.
REPORTING_SVC = textwrap.dedent(
    """
    import atexit, gc, sys
    atexit.register(lambda: print("frozen", gc.get_freeze_count(), flush=True))
    from svc_cli import main
    sys.exit(main(sys.argv[1:]))
    """
)


def test_settle_freezes_what_start_up_made_and_later_cycles_are_still_collected() -> None:
    # In a child: freezing is for the life of the process, not this test run's.
    code = textwrap.dedent(
        """
        import gc, weakref
        from svc_server.heap import settle

        gc.disable()  # no automatic collection: only settle's own can free the garbage

        class Node:
            pass

        def cycle():
            a, b = Node(), Node()
            a.other, b.other = b, a
            return weakref.ref(a)

        before = cycle()          # garbage at start-up: collected by settle, not frozen
        kept = [Node() for _ in range(1000)]
        frozen = settle()
        assert before() is None, "settle froze garbage"
        assert frozen >= 1000, frozen
        collectable = {id(o) for o in gc.get_objects()}  # the permanent generation is not in it
        assert not any(id(k) in collectable for k in kept)
        after = cycle()           # made after settle: an ordinary collection frees it
        gc.collect()
        assert after() is None, "a cycle made after settle was not collected"
        print("ok", frozen)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ok ")


@pytest.mark.parametrize(
    ("command", "ready"),
    [
        (["relay", "--port", "{port}"], "svc relay on"),
        (["up", "--api-port", "{port}", "--relay-port", "{port2}"], "ready; Ctrl-C stops"),
        (["api", "--port", "{port}"], "svc account API on"),
    ],
    ids=["svc relay", "svc up", "svc api"],
)
def test_a_server_process_freezes_its_start_up_heap(
    command: list[str], ready: str, tmp_path: Path
) -> None:
    ports = {"port": str(free_port()), "port2": str(free_port())}
    args = [a.format(**ports) for a in command] + ["--data-dir", str(tmp_path / "server")]
    proc = subprocess.Popen(
        [sys.executable, "-P", "-c", REPORTING_SVC, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if ready in line:
                break
        else:
            raise AssertionError(f"{args[0]} did not start: {proc.stderr.read()}")  # type: ignore[union-attr]
        # SIGINT, as Ctrl-C: each server prints its line with its handlers in place, and
        # exits through atexit.
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    frozen = [line for line in out.splitlines() if line.startswith("frozen ")]
    assert frozen, err
    # A server's start-up heap is ~100,000 objects; an unfrozen process reports 0.
    assert int(frozen[0].split()[1]) > 10_000, frozen
