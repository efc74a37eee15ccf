from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from svc_sdk import Channel, SvcClient
from svc_sdk.relay_frames import Code, Commit, Deliveries, Publish, Reply
from svc_sdk.relay_stream import StreamConnection
from svc_sdk.testing import LocalStack


def client(stack: LocalStack, name: str, **kwargs: Any) -> SvcClient:
    return SvcClient(
        kwargs.pop("endpoint", stack.relay_url),
        kwargs.pop("data_dir", stack.agent_dir(name)),
        name.encode(),
        api_key=kwargs.pop("api_key", stack.api_key),
        api_url=stack.api_url,
        **kwargs,
    )


def pair(
    stack: LocalStack, channel: str, a: str, b: str
) -> tuple[SvcClient, Channel, SvcClient, Channel]:
    """Two agents in one channel: ``a`` created it and added ``b`` by key package."""
    ca, cb = client(stack, a), client(stack, b)
    chan_a = ca.create_channel(channel)
    welcome = chan_a.add_member(cb.generate_key_package())
    chan_b = cb.join_channel(channel, welcome)
    return ca, chan_a, cb, chan_b


def take(channel: Channel, n: int, timeout: float = 20.0) -> list[bytes]:
    out: list[bytes] = []
    for _ in range(n):
        message = channel.next_message(timeout)
        assert message is not None, f"got {len(out)} of {n} messages: {out[-3:]}"
        out.append(message.data)
    return out


def wait_for(condition: Callable[[], object], timeout: float = 30.0) -> None:
    """Polls ``condition`` until it holds; fails the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.005)


def _mark_the_next(conn: StreamConnection, kind: type) -> list[int]:
    """Records the request id the next request of ``kind`` written on ``conn`` goes under
    (in the returned list, once written)."""
    marked: list[int] = []
    armed = threading.Event()
    numbers, send = conn._ids, conn.send

    class Numbers:  # records the request id the armed request is written under
        def __next__(self) -> int:
            number = next(numbers)
            if armed.is_set():
                armed.clear()
                marked.append(number)
            return number

    def arming_send(request: Any) -> Any:
        if isinstance(request, kind) and not marked:
            armed.set()
        return send(request)

    conn._ids = Numbers()  # type: ignore[assignment]
    conn.send = arming_send  # type: ignore[method-assign]
    return marked


def lose_the_reply_to_the_next(conn: StreamConnection, kind: type) -> list[int]:
    """Makes ``conn`` drop the Reply to the next request of ``kind`` written on it, as if
    the relay never answered it (it does act on the request). Returns the request ids
    dropped."""
    lost = _mark_the_next(conn, kind)
    dispatch = conn._dispatch

    def dropping_dispatch(frame: Any) -> None:
        if not (isinstance(frame, Reply) and frame.request_id in lost):
            dispatch(frame)

    conn._dispatch = dropping_dispatch  # type: ignore[method-assign]
    return lost


def refuse_for_now_the_next(conn: StreamConnection, kind: type) -> list[int]:
    """Makes ``conn`` turn the Reply to the next request of ``kind`` written on it into a
    RESOURCE_EXHAUSTED ("retry in a few seconds"), as a relay answers an account that
    spent its budget of refusals (here the relay did act on the request). Returns the
    request ids so answered."""
    refused = _mark_the_next(conn, kind)
    dispatch = conn._dispatch

    def refusing_dispatch(frame: Any) -> None:
        if isinstance(frame, Reply) and frame.request_id in refused:
            frame = frame._replace(code=Code.RESOURCE_EXHAUSTED, message="retry later")
        dispatch(frame)

    conn._dispatch = refusing_dispatch  # type: ignore[method-assign]
    return refused


def withhold_deliveries(conn: StreamConnection) -> threading.Event:
    """Makes ``conn`` drop every frame of deliveries while the returned event is set (it
    is, at first), as if the relay sent none."""
    withholding = threading.Event()
    withholding.set()
    dispatch = conn._dispatch

    def withholding_dispatch(frame: Any) -> None:
        if not (withholding.is_set() and isinstance(frame, Deliveries)):
            dispatch(frame)

    conn._dispatch = withholding_dispatch  # type: ignore[method-assign]
    return withholding


def hold_the_reply_to_the_next(conn: StreamConnection, kind: type) -> threading.Event:
    """Makes ``conn`` hold back the Reply to the next request of ``kind`` until the
    returned event is set: the relay acts on the request at once, and what else it sends
    goes on arriving meanwhile."""
    release = threading.Event()
    held = _mark_the_next(conn, kind)
    dispatch = conn._dispatch

    def holding_dispatch(frame: Any) -> None:
        if isinstance(frame, Reply) and frame.request_id in held:
            threading.Thread(
                target=lambda: (release.wait(60), dispatch(frame)), daemon=True
            ).start()
            return
        dispatch(frame)

    conn._dispatch = holding_dispatch  # type: ignore[method-assign]
    return release


def update_held_at_its_reply(
    client: SvcClient, channel: Channel
) -> tuple[threading.Event, threading.Thread]:
    """Starts ``channel.update_keys()`` on a thread whose commit's Reply is held back
    until the returned event is set; returns once the commit is pending."""
    conn = client.link._conn
    assert conn is not None
    release = hold_the_reply_to_the_next(conn, Commit)
    updating = threading.Thread(target=channel.update_keys)
    updating.start()
    wait_for(lambda: channel._group.has_pending_commit)
    return release, updating


def before_the_first_publish(client: SvcClient, action: Callable[[], object]) -> threading.Event:
    """Runs ``action`` before ``client`` writes its next Publish (on the writing thread);
    the returned event is set once it has run."""
    conn = client.link._conn
    assert conn is not None
    send, done = conn.send, threading.Event()

    def acting_first(request: Any) -> Any:
        if isinstance(request, Publish) and not done.is_set():
            done.set()
            action()
        return send(request)

    conn.send = acting_first  # type: ignore[method-assign]
    return done


@contextlib.contextmanager
def listening(channel: Channel) -> Iterator[None]:
    """Processes what ``channel`` receives on a thread of its own, as the manager's
    listener does (a member online to commit others' proposals), until the block ends."""
    stop = threading.Event()

    def listen() -> None:
        while not stop.is_set():
            channel._deliveries.wait(0.1)
            channel._deliveries.process_pending()

    listener = threading.Thread(target=listen)
    listener.start()
    try:
        yield
    finally:
        stop.set()
        listener.join(5)
