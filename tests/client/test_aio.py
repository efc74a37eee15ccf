"""The async face (svc_sdk.aio) on a real local stack: reading with ``await`` and
``async for`` on the caller's loop, cancellation that loses nothing, many tasks and a
thread reading one channel at once."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import Any

import pytest

from svc_sdk import (
    AsyncChannel,
    AsyncSvcChannelManager,
    AsyncSvcClient,
    ChannelClosedError,
    ChannelNameError,
    Envelope,
    Protocol,
)
from svc_sdk.relay_frames import Publish
from svc_sdk.testing import LocalStack

from .helpers import client, pair


def test_async_for_reads_every_message_in_order(
    stack: LocalStack, channel_name: str, ids: Any
) -> None:
    ca, chan_a, cb, chan_b = pair(stack, channel_name, ids("a"), ids("b"))
    sent = [f"m{i}".encode() for i in range(300)]

    async def main() -> list[bytes]:
        reader = AsyncChannel(chan_b)
        got: list[bytes] = []
        # The sender runs in a thread while the loop awaits: the link's thread wakes it.
        sender = threading.Thread(target=lambda: [chan_a.send(m) for m in sent])
        sender.start()
        async for payload in reader.messages(timeout=10):
            got.append(payload)
            if len(got) == len(sent):
                break
        sender.join()
        return got

    with ca, cb:
        assert asyncio.run(main()) == sent


def test_a_read_times_out_and_the_loop_stays_free(
    stack: LocalStack, channel_name: str, ids: Any
) -> None:
    ca, _, cb, chan_b = pair(stack, channel_name, ids("a"), ids("b"))

    async def main() -> tuple[list[Any], int, float]:
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticker = asyncio.create_task(tick())
        started = time.monotonic()
        got = await AsyncChannel(chan_b).next_messages(timeout=0.5)
        elapsed = time.monotonic() - started
        ticker.cancel()
        return got, ticks, elapsed

    with ca, cb:
        got, ticks, elapsed = asyncio.run(main())
        assert got == [] and 0.45 <= elapsed < 3
        assert ticks >= 20, "the loop ran other tasks while the read waited"


def test_a_cancelled_read_loses_nothing(stack: LocalStack, channel_name: str, ids: Any) -> None:
    ca, chan_a, cb, chan_b = pair(stack, channel_name, ids("a"), ids("b"))
    sent = [f"m{i}".encode() for i in range(50)]

    async def main() -> list[bytes]:
        reader = AsyncChannel(chan_b)
        got: list[bytes] = []
        # Reads cancelled at random moments while messages arrive.
        sender = threading.Thread(target=lambda: chan_a.send_batch(sent))
        for i in range(40):
            task = asyncio.create_task(reader.next_messages(timeout=5, limit=1))
            if i == 5:
                sender.start()
            await asyncio.sleep(0.002 * (i % 4))
            if task.cancel():
                with pytest.raises(asyncio.CancelledError):
                    await task
            else:
                got.extend(m.data for m in task.result())
        sender.join()
        while len(got) < len(sent):
            more = await reader.next_messages(timeout=5)
            assert more, f"got {len(got)} of {len(sent)}"
            got.extend(m.data for m in more)
        return got

    with ca, cb:
        assert asyncio.run(main()) == sent, "every message once, in order"
        assert chan_b.next_messages(0.2) == []


def test_tasks_and_a_thread_share_one_channel(
    stack: LocalStack, channel_name: str, ids: Any
) -> None:
    ca, chan_a, cb, chan_b = pair(stack, channel_name, ids("a"), ids("b"))
    sent = [f"m{i}".encode() for i in range(400)]
    shares: list[list[bytes]] = [[] for _ in range(5)]  # four tasks, then the thread
    done = threading.Event()

    def thread_reader() -> None:
        while not done.is_set():
            shares[4].extend(m.data for m in chan_b.next_messages(timeout=0.1, limit=7))

    async def main() -> None:
        reader = AsyncChannel(chan_b)

        async def task_reader(share: list[bytes]) -> None:
            while not done.is_set():
                share.extend(m.data for m in await reader.next_messages(timeout=0.1, limit=5))

        tasks = [asyncio.create_task(task_reader(shares[i])) for i in range(4)]
        await asyncio.to_thread(chan_a.send_batch, sent)
        deadline = time.monotonic() + 20
        while sum(map(len, shares)) < len(sent) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)  # nothing more comes
        done.set()
        await asyncio.gather(*tasks)

    thread = threading.Thread(target=thread_reader)
    with ca, cb:
        thread.start()
        try:
            asyncio.run(main())
        finally:
            done.set()
            thread.join()
        everything = [m for share in shares for m in share]
        assert sorted(everything) == sorted(sent), "each message to exactly one reader"
        for share in shares:
            assert share == [m for m in sent if m in set(share)], "each share in order"


def test_the_async_client_end_to_end(stack: LocalStack, channel_name: str, ids: Any) -> None:
    async def main() -> None:
        def connect(name: str) -> Any:
            return AsyncSvcClient.connect(
                stack.relay_url,
                stack.agent_dir(name),
                name.encode(),
                api_key=stack.api_key,
                api_url=stack.api_url,
            )

        async with await connect(ids("alice")) as alice, await connect(ids("bob")) as bob:
            owner = await alice.create_channel(channel_name)
            token = await alice.invite(channel_name)
            # A member that reads admits the joiner (its read makes the commit).
            reading = asyncio.create_task(owner.next_message(timeout=15))
            joined = await bob.join_with_token(channel_name, token, timeout=15)
            assert set(joined.members()) == {alice.agent_id, bob.agent_id}
            await asyncio.to_thread(joined.channel.send, b"hi")
            first = await reading
            assert first is not None and (first.data, first.sender) == (b"hi", bob.agent_id)
            await owner.send(b"hello")
            message = await joined.next_message(timeout=10)
            assert message is not None and message.data == b"hello"
            assert message.sender == alice.agent_id
            assert alice.health().ok and bob.health().ok
            await owner.remove_member(bob.agent_id)
            assert await joined.next_message(timeout=10) is None  # removed: closed
            assert joined.closed
        with pytest.raises(ChannelClosedError):
            joined.channel.send(b"after")

    asyncio.run(main())


def test_the_async_manager_reads_on_the_loop(
    stack: LocalStack, channel_name: str, ids: Any
) -> None:
    async def main() -> None:
        alice = AsyncSvcChannelManager(stack.manager(ids("alice")))
        bob = AsyncSvcChannelManager(stack.manager(ids("bob")))
        async with alice, bob:
            await alice.create(channel_name)
            await bob.join_with_token(channel_name, await alice.invite(channel_name), 15)
            assert set(bob.members(channel_name)) == {alice.agent_id, bob.agent_id}
            assert await bob.receive(channel_name, timeout=0.2) == []
            alice.manager.send(channel_name, "hello")
            assert await bob.receive(channel_name, timeout=10) == ["hello"]
            alice.manager.send_envelope(
                channel_name, Envelope(Protocol.MCP, "application/json", b"{}")
            )
            [envelope] = await bob.receive_envelopes(channel_name, timeout=10)
            assert (envelope.protocol, envelope.payload) == (Protocol.MCP, b"{}")
            assert bob.health().ok
            await alice.remove_member(channel_name, bob.agent_id)
            with pytest.raises(ChannelClosedError):
                await until_closed(bob, channel_name)

    asyncio.run(main())


async def until_closed(manager: AsyncSvcChannelManager, channel_name: str) -> None:
    """Reads until the removal reaches this agent (ChannelClosedError)."""
    for _ in range(50):
        await manager.receive(channel_name, timeout=0.2)


def test_tasks_send_on_the_loop_each_in_order(
    stack: LocalStack, channel_name: str, ids: Any
) -> None:
    """Eight tasks send at once with ``await send`` (no thread); every message arrives
    once, each task's in its order; wait_stored returns once the relay has them all."""
    ca, chan_a, cb, chan_b = pair(stack, channel_name, ids("a"), ids("b"))

    async def main() -> None:
        sender = AsyncChannel(chan_a)

        async def task(t: int) -> None:
            for i in range(100):
                await sender.send(f"{t}:{i}".encode())

        await asyncio.gather(*(task(t) for t in range(8)))
        await sender.wait_stored(timeout=20)
        assert sender.unsent == 0
        await sender.send_batch([b"last"])  # returns once stored

    with ca, cb:
        asyncio.run(main())
        got = read_all(chan_b, 801)
        assert got[-1] == b"last" and len(set(got)) == 801
        for t in range(8):
            mine = [int(m.split(b":")[1]) for m in got[:-1] if m.startswith(f"{t}:".encode())]
            assert mine == list(range(100)), f"task {t}'s messages in its order"


def test_a_cancelled_send_is_queued_whole_or_not_at_all(
    stack: LocalStack, channel_name: str, ids: Any
) -> None:
    ca, chan_a, cb, chan_b = pair(stack, channel_name, ids("a"), ids("b"))

    async def main() -> list[bytes]:
        sender = AsyncChannel(chan_a)
        done: list[bytes] = []

        async def one(i: int) -> None:
            payload = f"m{i}".encode()
            await sender.send(payload)
            done.append(payload)

        for i in range(200):
            task = asyncio.create_task(one(i))
            if i % 3 == 0:
                await asyncio.sleep(0)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await sender.wait_stored(timeout=20)
        return done

    with ca, cb:
        done = asyncio.run(main())
        got = read_all(chan_b, len(done)) if done else []
        assert got == done, "exactly the sends that completed, in order"
        assert chan_b.next_messages(0.5) == []


def read_all(channel: Any, n: int) -> list[bytes]:
    got: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(got) < n and time.monotonic() < deadline:
        got.extend(m.data for m in channel.next_messages(timeout=2))
    return got


def test_a_read_cancelled_while_it_admits_a_joiner_loses_nothing(
    stack: LocalStack, channel_name: str, ids: Any
) -> None:
    """A read that decrypts a message and finds a join request in the same batch hands
    the message over before it admits the joiner (relay round trips, in a worker
    thread): a cancel during the admission must not drop the message it took."""
    ca, chan_a, cb, chan_b = pair(stack, channel_name, ids("a"), ids("b"))
    cc = client(stack, ids("c"))
    token = ca.invite(channel_name)
    with ca, cb, cc:
        chan_b.send(b"x")
        joining = threading.Thread(target=cc.join_with_token, args=(channel_name, token, 15))
        joining.start()
        time.sleep(1.0)  # the message and the join request both wait at alice, encrypted

        async def main() -> list[bytes]:
            reader = AsyncChannel(chan_a)
            task = asyncio.create_task(reader.next_messages(timeout=5))
            await asyncio.sleep(0.005)
            task.cancel()
            try:
                got = [m.data for m in await task]
            except asyncio.CancelledError:
                got = []
            got += [m.data for m in await reader.next_messages(timeout=2)]  # admits c
            return got

        assert asyncio.run(main()) == [b"x"]
        joining.join(20)
        assert cc.channels() == [channel_name], "the joiner was admitted all the same"


def test_bad_input_to_the_async_face(stack: LocalStack, channel_name: str, ids: Any) -> None:
    """Each async entry point refuses bad arguments with the blocking API's errors, before
    waiting or taking anything."""
    ca, chan_a, cb, chan_b = pair(stack, channel_name, ids("a"), ids("b"))

    async def main() -> None:
        reader = AsyncChannel(chan_b)
        cases: list[tuple[dict[str, Any], type[Exception]]] = [
            ({"limit": 0}, ValueError),
            ({"limit": True}, ValueError),
            ({"limit": "3"}, ValueError),
            ({"timeout": "soon"}, TypeError),
            ({"timeout": -1}, ValueError),
            ({"timeout": float("nan")}, ValueError),
            ({"accept": 1}, TypeError),
        ]
        for kwargs, error in cases:
            with pytest.raises(error):
                await reader.next_messages(**kwargs)
        with pytest.raises(TypeError):
            await reader.messages(timeout="soon").__anext__()  # type: ignore[arg-type]
        manager = AsyncSvcChannelManager(stack.manager(ids("m")))
        async with manager:
            with pytest.raises(ChannelNameError):
                await manager.receive("not a channel name")
            with pytest.raises(ChannelClosedError):
                await manager.receive("acme/tests/not-joined", timeout=0)
            own = f"{channel_name}-m"
            await manager.create(own)
            with pytest.raises(ValueError):
                await manager.receive(own, timeout=-1)
            with pytest.raises(TypeError):
                await manager.receive_messages(own, accept="all")  # type: ignore[arg-type]

    with ca, cb:
        for wrap, thing in [(AsyncChannel, cb), (AsyncSvcClient, chan_b)]:
            with pytest.raises(TypeError, match="wraps"):
                wrap(thing)
        with pytest.raises(TypeError, match="wraps"):
            AsyncSvcChannelManager(cb)  # type: ignore[arg-type]
        with pytest.raises(KeyError):
            AsyncSvcClient(cb).channel("acme/tests/not-joined")
        asyncio.run(main())
        chan_a.send(b"still fine")
        assert [m.data for m in chan_b.next_messages(timeout=10)] == [b"still fine"]


def test_a_members_replayed_message_is_skipped_by_an_async_reader(
    stack: LocalStack, channel_name: str, ids: Any
) -> None:
    """An admitted member publishes the same ciphertext twice (the relay cannot tell a
    replay: it sees only ciphertext). The async reader hands the message over once,
    skips the copy, and goes on reading."""
    ca, chan_a, cb, chan_b = pair(stack, channel_name, ids("a"), ids("b"))
    with ca, cb:
        ciphertext = chan_a._group.encrypt(b"once")
        frame = Publish(channel=channel_name, message=[ciphertext, ciphertext])
        ca.link.send_soon(frame, timeout=10).result(10)
        chan_a.send(b"after")

        async def main() -> list[bytes]:
            reader = AsyncChannel(chan_b)
            got: list[bytes] = []
            while len(got) < 2:
                taken = await reader.next_messages(timeout=10)
                assert taken, f"got only {got}"
                got += [m.data for m in taken]
            got += [m.data for m in await reader.next_messages(timeout=0.5)]
            return got

        assert asyncio.run(main()) == [b"once", b"after"]
