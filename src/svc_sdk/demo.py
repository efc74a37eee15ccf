"""``svc demo``: a local stack, two agents in two processes, an invite, and encrypted
messages both ways with timings.

The parent starts the account API and the relay (:class:`~svc_sdk.testing.LocalStack`),
then runs each agent as ``python -m svc_sdk.demo <role>`` with only ``SVC_*`` settings
in its environment, as a real deployment would. Alice creates a channel and prints an
invite token; the parent hands the token to Bob, who joins with it; then they talk.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from svc_sdk.manager import SvcChannelManager

CHANNEL = "demo/agents/chat"


def _ms(start: float) -> str:
    return f"{(time.perf_counter() - start) * 1000:.1f} ms"


def alice(rounds: int) -> None:
    with SvcChannelManager("alice") as me:
        start = time.perf_counter()
        me.create(CHANNEL)
        print(f"created {CHANNEL} (MLS group, epoch 0) in {_ms(start)}", flush=True)
        print(f"token {me.invite(CHANNEL)}", flush=True)
        for _ in range(rounds):
            got = me.receive(CHANNEL, timeout=60)
            for text in got:
                print(f"received {text!r}", flush=True)
                me.send(CHANNEL, f"re: {text}")
        print(f"members: {', '.join(m.identity.decode() for m in me.members(CHANNEL))}", flush=True)


def bob(rounds: int, token: str) -> None:
    with SvcChannelManager("bob") as me:
        start = time.perf_counter()
        me.join_with_token(CHANNEL, token, timeout=30)
        print(f"joined {CHANNEL} with the invite token in {_ms(start)}", flush=True)
        for i in range(rounds):
            start = time.perf_counter()
            me.send(CHANNEL, f"hello alice #{i + 1}")
            reply = me.receive(CHANNEL, timeout=30)
            print(f"received {', '.join(map(repr, reply))}, round trip {_ms(start)}", flush=True)


def _spawn(role: str, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    # -P: the installed svc_sdk, never a folder of that name in the working directory.
    return subprocess.Popen(  # noqa: S603 - our own interpreter, fixed arguments
        [sys.executable, "-P", "-m", "svc_sdk.demo", role, *args],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )


def _relay_output(
    proc: subprocess.Popen[str],
    name: str,
    out: Callable[[str], None],
    on_token: Callable[[str], None],
) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip("\n")
        if line.startswith("token "):
            on_token(line.split(" ", 1)[1])
            out(f"{name:>5} | invite token {line[6:18]}… (handed to bob)")
        else:
            out(f"{name:>5} | {line}")


def run(rounds: int = 3, out: Callable[[str], None] = print) -> None:
    from svc_sdk.testing import LocalStack  # needs the server extra

    started = time.perf_counter()
    with LocalStack() as stack:
        out(f"local stack up in {_ms(started)}: API {stack.api_url}, relay {stack.relay_url}")
        base = {
            **os.environ,
            "SVC_RELAY": stack.relay_url,
            "SVC_API_URL": stack.api_url,
            "SVC_API_KEY": stack.api_key,
        }
        token: list[str] = []
        got_token = threading.Event()

        def keep(t: str) -> None:
            token.append(t)
            got_token.set()

        first = _spawn(
            "alice", {**base, "SVC_DATA_DIR": str(stack.agent_dir("alice"))}, str(rounds)
        )
        readers = [threading.Thread(target=_relay_output, args=(first, "alice", out, keep))]
        readers[0].start()
        if not got_token.wait(60):
            first.kill()
            raise RuntimeError("runtime error: alice did not produce an invite token")
        second = _spawn(
            "bob", {**base, "SVC_DATA_DIR": str(stack.agent_dir("bob"))}, str(rounds), token[0]
        )
        readers.append(
            threading.Thread(target=_relay_output, args=(second, "bob", out, lambda t: None))
        )
        readers[1].start()
        codes = [second.wait(120), first.wait(120)]
        for reader in readers:
            reader.join(5)
        if any(codes):
            raise RuntimeError(f"runtime error: an agent failed (exit codes {codes})")
    out(f"done in {_ms(started)}: every message crossed the relay as MLS ciphertext")


if __name__ == "__main__":
    role, count = sys.argv[1], int(sys.argv[2])
    if role == "alice":
        alice(count)
    else:
        bob(count, sys.argv[3])
