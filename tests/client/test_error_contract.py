"""One error contract (docs/client.md, Errors): every failure out of a public call is a
RuntimeError whose message starts with one of the spec's prefixes. The exceptions the
spec and docs name for the caller's own mistakes are allowed only where the caller made
one: TypeError for a wrong argument type, ValueError for a bad argument value (and from
``Envelope.deserialize``), KeyError from ``SvcClient.channel`` for a channel the agent
is not in.

The test walks every public method of the client, its channels, the manager and the
adapters, each argument in turn given bad values, under failure injections: a healthy
stack, the relay and the account API killed, unreachable and malformed addresses, a
bad API key, corrupt files in data_dir, and everything closed. It collects every escape
that breaks the contract and reports them all at once."""

from __future__ import annotations

import asyncio
import inspect
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from svc_sdk import (
    AgentId,
    Envelope,
    Protocol,
    ProtocolBridge,
    SLIMAdapter,
    SvcA2AAdapter,
    SvcChannelManager,
    SvcClient,
    SvcTransport,
)
from svc_sdk.channel import MAX_PAYLOAD
from svc_sdk.testing import LocalStack

from ..support import free_port
from .helpers import client

PREFIXES = (
    "MLS engine error: ",
    "transport error: ",
    "invalid channel name: ",
    "auth error: ",
    "runtime error: ",
)
CHANNEL = "acme/contract/walk"
AGENT = AgentId("00000000-0000-0000-0000-000000000000", b"nobody")

# Per parameter name: a good value (None: leave the parameter's default), then bad ones.
VALUES: dict[str, tuple[Any, list[Any]]] = {
    "name": (CHANNEL, ["no-slashes", "a/b/" + "c" * 65, None, 5]),
    "channel_name": (CHANNEL, ["no-slashes", "", None]),
    "channel": (CHANNEL, ["no/slashes", None, b"acme/x/y"]),
    "destination": (CHANNEL, ["x", None]),
    "source": (CHANNEL, ["x", None]),
    "target": (CHANNEL, ["x", None]),
    "context_id": ("ctx", ["", "a/b", None]),
    "welcome": (b"not a welcome", ["text", None]),
    "key_package": (b"not a key package", ["text", None]),
    "payload": (b"x", [None, 5, b"x" * (MAX_PAYLOAD + 1)]),
    "payloads": ([b"x"], [b"abc", [None], None]),
    "message": ("hello", [None, 5, b"\xff" * (MAX_PAYLOAD + 1)]),
    "token": ("svc_inv_" + "A" * 40, ["", None, "x" * 100_000]),
    "timeout": (0.2, [-1, float("nan"), "soon"]),
    "max_uses": (None, [0, -1, "1", 10**30]),
    "ttl": (None, [0, -5, None, 10**30]),
    "member": (AGENT, [b"", None, 5, "not an agent id"]),
    "role": ("admin", ["boss", None]),
    "allowed": (True, ["yes", None]),
    "envelope": (Envelope(Protocol.RAW, "text/plain", b"x"), [b"raw", None]),
    "parts": ([{"type": "text", "text": "x"}], [None, "x", [{"type": "bogus"}], [5]]),
    "accept": (None, [5]),
    "limit": (None, [0, -1, "x"]),
    "after": (None, [-1, "x", 2**70]),
    "after_seq": (None, [-1, "x"]),
    "if_due": (None, ["x"]),
    "content_type": (None, [None, 5]),
    "metadata": (None, [[1], {"x": object()}]),
    "source_protocol": (Protocol.A2A, [Protocol.RAW, "a2a", None]),
    "target_protocol": (Protocol.SLIM, [Protocol.RAW, None]),
    "agent_id": ("agent", ["", None]),
    "manager": (None, []),
}
# Per class and method: values that differ from the table's.
OVERRIDES: dict[str, dict[str, tuple[Any, list[Any]]]] = {
    "SvcTransport.write": {
        "message": ({"jsonrpc": "2.0", "method": "ping", "id": 1}, ["x", None, {"x": object()}])
    },
    "SvcClient.channel_events": {"limit": (None, [0, 1001, "x"])},
    "SvcA2AAdapter.send_message": {"role": (None, ["boss", None])},
    # Not the source: a channel the agent is not in, a refusal of its own.
    "ProtocolBridge.bridge": {"target": (CHANNEL + "-2", ["x", None, CHANNEL])},
}
# Called by hand at the end (they end the object), or not a failure surface.
SKIP = {"close", "leave", "wait", "stop"}
# Methods where the docs name another exception for the caller's mistake.
DOCUMENTED = {"SvcClient.channel": (KeyError,)}


@dataclass
class Walk:
    calls: int = 0
    raised: int = 0
    leaks: list[str] = field(default_factory=list)

    def call(self, where: str, fn: Callable[[], Any], *, bad: bool = False) -> Any:
        self.calls += 1
        try:
            result = fn()
            if inspect.iscoroutine(result):
                result = asyncio.run(_bounded(result))
            return result
        except _Blocked:
            return None  # a read that waits for a message, as documented
        except BaseException as exc:
            self.raised += 1
            if not self.allowed(where, exc, bad):
                self.leaks.append(
                    f"{where}: {type(exc).__module__}.{type(exc).__qualname__}: {exc}"[:400]
                )
            return None

    @staticmethod
    def allowed(where: str, exc: BaseException, bad: bool) -> bool:
        if isinstance(exc, RuntimeError):
            return str(exc).startswith(PREFIXES)
        if isinstance(exc, DOCUMENTED.get(where.split("(")[0], ())):
            return True
        return bad and type(exc) in (TypeError, ValueError)

    def check(self) -> None:
        print(f"error contract: {self.calls} calls, {self.raised} raised, {len(self.leaks)} leaks")
        assert not self.leaks, "exceptions outside the contract:\n" + "\n".join(self.leaks)


class _Blocked(Exception):
    pass


async def _bounded(coro: Any) -> Any:
    scope = asyncio.timeout(2)
    try:
        async with scope:
            return await coro
    except TimeoutError:
        if scope.expired():
            raise _Blocked from None
        raise


def _open_and_close(kwargs: dict[str, Any]) -> None:
    SvcChannelManager(**kwargs).close()


def walk_object(walk: Walk, obj: Any, *, bad_args: bool = True) -> None:
    """Every public method and property of ``obj``: with good arguments, then (if
    ``bad_args``) each argument in turn with each of its bad values."""
    cls = type(obj).__name__
    for name in sorted(dir(type(obj))):
        if name.startswith("_") or name in SKIP:
            continue
        static = inspect.getattr_static(type(obj), name)
        where = f"{cls}.{name}"
        if isinstance(static, property):
            walk.call(where, partial(getattr, obj, name))
            continue
        method = getattr(obj, name)
        if not callable(method) or isinstance(method, type):
            continue
        values = {**VALUES, **OVERRIDES.get(where, {})}
        good: dict[str, Any] = {}
        params = [
            p
            for p in inspect.signature(method).parameters.values()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        ]
        for p in params:
            if p.name not in values:
                assert p.default is not p.empty, f"add test values for {where}({p.name})"
                continue
            if values[p.name][0] is not None:
                good[p.name] = values[p.name][0]
            else:
                assert p.default is not p.empty, f"add a good value for {where}({p.name})"
        walk.call(f"{where}({good})", partial(method, **good))
        if not bad_args:
            continue
        for p in params:
            for value in values.get(p.name, (None, []))[1]:
                args = {**good, p.name: value}
                walk.call(f"{where}({p.name}={value!r:.40})", partial(method, **args), bad=True)


def adapters(manager: SvcChannelManager) -> list[Any]:
    return [
        SvcA2AAdapter(manager, "agent"),
        SLIMAdapter(manager),
        ProtocolBridge(manager),
        SvcTransport(manager, CHANNEL),
    ]


def walk_everything(
    walk: Walk, c: SvcClient, manager: SvcChannelManager, *, bad_args: bool
) -> None:
    for obj in [c, *[c.channel(n) for n in c.channels()], manager, *adapters(manager)]:
        walk_object(walk, obj, bad_args=bad_args)


def constructors(walk: Walk, manager: SvcChannelManager) -> None:
    """The adapters' constructors with bad arguments."""
    for cls in (SLIMAdapter, ProtocolBridge):
        walk.call(f"{cls.__name__}(None)", partial(cls, None), bad=True)  # type: ignore[arg-type]
    for agent in ("", None, 5):
        bad_agent: Any = agent
        walk.call(f"SvcA2AAdapter({agent!r})", partial(SvcA2AAdapter, manager, bad_agent), bad=True)
    for channel in ("bad", None):
        bad_channel: Any = channel
        walk.call(
            f"SvcTransport({channel!r})", partial(SvcTransport, manager, bad_channel), bad=True
        )


def test_healthy_stack_bad_arguments(stack: LocalStack, tmp_path: Path) -> None:
    walk = Walk()
    c = client(stack, "contract-a")
    manager = stack.manager("contract-m")
    try:
        welcome = c.create_channel(CHANNEL).add_member(manager.generate_key_package())
        manager.join(CHANNEL, welcome)
        objects = [c, c.channel(CHANNEL), manager, *adapters(manager)]
        for obj in objects:
            walk_object(walk, obj)
        constructors(walk, manager)
    finally:
        for closing in (c, manager):
            walk.call(f"{type(closing).__name__}.close", closing.close)
    # Closed: every call again, with good arguments, and the calls that end things.
    for obj in objects:
        walk_object(walk, obj, bad_args=False)
    walk.call("Channel.leave (closed)", lambda: c.channel(CHANNEL).leave(timeout=0.5))
    walk.call("Channel.leave (closed)", lambda: objects[1].leave(timeout=0.5))
    walk.call("SvcChannelManager.leave (closed)", lambda: manager.leave(CHANNEL))
    walk.call("SvcTransport.close (closed)", lambda: objects[-1].close())
    walk.call("ProtocolBridge.stop (closed)", lambda: objects[-2].stop())
    walk.check()


def test_relay_and_api_killed(tmp_path: Path) -> None:
    walk = Walk()
    with LocalStack() as stack:
        c = client(stack, "contract-k", timeout=1.0, connect_timeout=1.0)
        manager = stack.manager("contract-km", timeout=1.0)
        with c, manager:
            welcome = c.create_channel(CHANNEL).add_member(manager.generate_key_package())
            manager.join(CHANNEL, welcome)
            stack.kill()
            walk_everything(walk, c, manager, bad_args=False)
            for obj in [c.channel(CHANNEL)]:
                walk.call("Channel.leave (relay down)", partial(obj.leave, timeout=1.0))
            walk.call("SvcChannelManager.leave (relay down)", lambda: manager.leave(CHANNEL))
        # New clients while both servers are down.
        walk.call("SvcClient (all down)", lambda: client(stack, "contract-k2", connect_timeout=1.0))
        walk.call(
            "SvcChannelManager (all down)",
            lambda: SvcChannelManager(
                "contract-k3", stack.relay_url, tmp_path / "k3", stack.api_key, stack.api_url
            ),
        )
    walk.check()


def test_unreachable_and_malformed_addresses(stack: LocalStack, tmp_path: Path) -> None:
    walk = Walk()
    dead = f"http://127.0.0.1:{free_port()}"
    cases: dict[str, dict[str, Any]] = {
        "relay unreachable": {"endpoint": dead},
        "relay unresolvable": {"endpoint": "http://svc-relay.invalid:50051"},
        "relay not a URL": {"endpoint": "http://[::1"},
        "relay other scheme": {"endpoint": "ftp://127.0.0.1:1"},
        "relay port out of range": {"endpoint": "http://127.0.0.1:99999"},
        "API unreachable": {"api_url": dead},
        "API unresolvable": {"api_url": "http://svc-api.invalid"},
        "API not a URL": {"api_url": "http://[::1"},
        "API without scheme": {"api_url": "127.0.0.1:1"},
        "API other scheme": {"api_url": "ftp://127.0.0.1:1"},
        "bad API key": {"api_key": "sk_live_" + "x" * 40},
        "API key without api_url": {"api_url": None},
        "not an API key": {"api_key": "hello"},
    }
    for n, (what, override) in enumerate(cases.items()):
        args: dict[str, Any] = {
            "endpoint": stack.relay_url,
            "data_dir": tmp_path / f"c{n}",
            "identity": f"addr-{n}".encode(),
            "api_key": stack.api_key,
            "api_url": stack.api_url,
            "connect_timeout": 1.0,
            **override,
        }

        def make(args: dict[str, Any] = args) -> None:
            SvcClient(**args).close()

        walk.call(f"SvcClient ({what})", make)
        margs = {k: v for k, v in args.items() if k != "connect_timeout"}
        margs["data_dir"] = tmp_path / f"m{n}"
        if "endpoint" in override:
            continue  # the manager waits its fixed 10 s to connect; SvcClient covers it
        walk.call(f"SvcChannelManager ({what})", partial(_open_and_close, margs))
    walk.check()


def test_corrupt_data_dir(stack: LocalStack, tmp_path: Path) -> None:
    """Each file of a used data_dir overwritten with garbage, truncated, or replaced by
    a folder, then the agent opened on it."""
    walk = Walk()
    original = tmp_path / "orig"
    with client(stack, "contract-dd", data_dir=original) as c:
        c.create_channel(CHANNEL + "dd")
    files = sorted(p.relative_to(original) for p in original.rglob("*") if p.is_file())
    assert files, "the agent wrote nothing"
    n = 0
    for rel in files:
        if rel.name == "lock":
            continue
        for how in ("garbage", "empty", "folder"):
            n += 1
            copy = tmp_path / f"copy{n}"
            shutil.copytree(original, copy)
            path = copy / rel
            if how == "folder":
                path.unlink()
                path.mkdir(mode=0o700)
            else:
                path.write_bytes(os.urandom(4096) if how == "garbage" else b"")

            def open_and_use(copy: Path = copy) -> None:
                with client(stack, "contract-dd", data_dir=copy, connect_timeout=2.0) as c:
                    c.channels()
                    c.create_channel(CHANNEL + "dd").send(b"after")

            walk.call(f"SvcClient (data_dir {rel} {how})", open_and_use)
    walk.check()


def test_relay_codes_map_to_the_spec_errors() -> None:
    """The one mapping of relay codes: about a channel, a refusal is an AccessError and
    what the relay cannot serve now (a budget of refusals spent included) a
    TransportError, to retry; a wrong request is an InternalError."""
    from svc_sdk.errors import AccessError, InternalError, TransportError, relay_error
    from svc_sdk.relay_frames import Code, RelayError, Reply

    def mapped(code: Code) -> type[Exception]:
        return type(relay_error(RelayError(Reply(code=code, message="why")), "a/b/c"))

    assert mapped(Code.PERMISSION_DENIED) is AccessError
    assert mapped(Code.RESOURCE_EXHAUSTED) is TransportError
    assert mapped(Code.UNAVAILABLE) is TransportError
    assert mapped(Code.INVALID_ARGUMENT) is InternalError
    assert str(
        relay_error(RelayError(Reply(code=Code.RESOURCE_EXHAUSTED, message="retry")), "a/b/c")
    ).startswith("transport error: ")
