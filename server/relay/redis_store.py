"""The scale-out log: Redis Streams shared by any number of stateless relay processes.

Per channel, a stream ``svc:log:{channel}`` whose entry ids are ``<seq>-1`` (a cursor
maps straight to a stream position), a hash ``svc:meta:{channel}`` with the head
sequence number, the current epoch and how far retention has trimmed, and a hash
``svc:group:{channel}`` with the tracked MLS group's state and version. Appends, and the
epoch check of commits together with storing their Welcomes, are Lua scripts, so they
are atomic across relay processes. Welcomes are kept per recipient
(``svc:welcome:{member id hex}``, naming the commit's one stored Welcome) and announced
on the stream ``svc:welcomes``, once per commit. Each relay
process follows the channels its own streams subscribe to, and the Welcome stream, with
one blocking XREAD, and fans out locally. (A single Redis server, not Redis Cluster: the
commit script touches keys of more than one slot.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from .store import (
    MAX_PENDING_WELCOMES,
    CommitRejected,
    CursorExpired,
    Entry,
    EntrySink,
    GroupConflict,
    StaleMessages,
    WelcomeEntry,
)

log = logging.getLogger("svc_server.relay")

WELCOME_STREAM = "svc:welcomes"
# How long the follower's XREAD blocks, and the follower connection's socket timeout,
# which must be longer (redis-py 8 defaults to 5 s: XREAD blocking for as long would
# time out whenever nothing arrives, and reconnect, with an error logged, every 5 s).
FOLLOW_BLOCK_MS = 5000
FOLLOW_SOCKET_TIMEOUT = FOLLOW_BLOCK_MS / 1000 + 10

# KEYS: meta, log. ARGV: sender, stored_at, check ("1": refuse messages of an epoch
# other than the channel's), then epoch and message of each message. All or nothing:
# returns {first seq, epoch}, or {-1, epoch} when refused.
APPEND = """
local current = tonumber(redis.call('HGET', KEYS[1], 'epoch') or '0')
if ARGV[3] == '1' then
  for i = 4, #ARGV, 2 do
    if tonumber(ARGV[i]) ~= current then return {-1, current} end
  end
end
local count = math.floor((#ARGV - 3) / 2)
local first = redis.call('HINCRBY', KEYS[1], 'head', count) - count + 1
for i = 4, #ARGV, 2 do
  local seq = first + math.floor((i - 4) / 2)
  redis.call('XADD', KEYS[2], seq .. '-1',
    's', ARGV[1], 'h', '0', 'e', ARGV[i], 'm', ARGV[i + 1], 't', ARGV[2])
end
return {first, current}
"""

# KEYS: meta, log, welcome stream, group. ARGV: sender, epoch, commit, stored_at, channel,
# welcome, retention seconds, group version, group state, joiner member ids (hex)... The
# commit is stored only while the epoch and the tracked group's version are the ones it
# was validated against, with the group state it leads to. The Welcome is stored once
# (svc:welcome-blob:{channel}:{seq}); each joiner's hash names it, and one announcement
# per commit lists the joiners.
COMMIT = """
local current = tonumber(redis.call('HGET', KEYS[1], 'epoch') or '0')
local version = tonumber(redis.call('HGET', KEYS[4], 'v') or '0')
if current ~= tonumber(ARGV[2]) or version ~= tonumber(ARGV[8]) then return {-1, current} end
local seq = redis.call('HINCRBY', KEYS[1], 'head', 1)
redis.call('HSET', KEYS[1], 'epoch', current + 1)
redis.call('HSET', KEYS[4], 'v', version + 1, 's', ARGV[9])
redis.call('XADD', KEYS[2], seq .. '-1',
  's', ARGV[1], 'h', '1', 'e', ARGV[2], 'm', ARGV[3], 't', ARGV[4])
if #ARGV >= 10 then
  local blob = 'svc:welcome-blob:' .. ARGV[5] .. ':' .. seq
  redis.call('SET', blob, ARGV[6], 'EX', ARGV[7])
  local joiners = {}
  for i = 10, #ARGV do
    local key = 'svc:welcome:' .. ARGV[i]
    redis.call('HSET', key, ARGV[5] .. '\\n' .. seq .. '\\n' .. (current + 1), blob)
    redis.call('EXPIRE', key, ARGV[7])
    joiners[#joiners + 1] = ARGV[i]
  end
  redis.call('XADD', KEYS[3], '*', 'c', ARGV[5], 'r', table.concat(joiners, ','),
    'q', seq, 'e', current + 1, 'b', blob)
end
return {seq, current + 1}
"""

# KEYS: group. ARGV: state. A new channel's group, version 1, unless it has one.
CREATE_GROUP = """
if redis.call('HSETNX', KEYS[1], 'v', 1) == 0 then return 0 end
redis.call('HSET', KEYS[1], 's', ARGV[1])
return 1
"""

# KEYS: group. ARGV: expected version, state.
SAVE_GROUP = """
local version = tonumber(redis.call('HGET', KEYS[1], 'v') or '0')
if version ~= tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'v', version + 1, 's', ARGV[2])
return 1
"""


def _log(channel: str) -> str:
    return f"svc:log:{channel}"


def _meta(channel: str) -> str:
    return f"svc:meta:{channel}"


def _group(channel: str) -> str:
    return f"svc:group:{channel}"


def _entry(channel: str, stream_id: bytes, fields: dict[bytes, bytes]) -> Entry:
    seq = int(stream_id.split(b"-", 1)[0])
    return Entry(
        channel,
        seq,
        fields[b"s"],
        fields[b"h"] == b"1",
        int(fields[b"e"]),
        fields[b"m"],
        float(fields[b"t"]),
    )


async def _stop(task: asyncio.Task[None]) -> None:
    """Cancels ``task`` and waits until it has ended. One cancel() is not enough: on
    Python 3.11, asyncio.wait_for, which redis-py wraps around every socket write (when
    socket_timeout is set, 5 s by default since redis-py 8), returns the write's result
    instead of raising CancelledError when the cancel arrives just as the write completes.
    The task then carries on as if never cancelled: _follow is a loop, so it would never
    end, and neither would close()."""
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=0.5)
    with contextlib.suppress(asyncio.CancelledError):
        await task


@dataclass(frozen=True, slots=True)
class _Append:
    """Messages to store consecutively, in one script call."""

    channel: str
    sender: bytes
    messages: list[tuple[bytes, int]]
    check: bool  # refuse them unless they are all of the channel's current epoch
    future: asyncio.Future[list[Entry]]


class RedisLogStore:
    def __init__(self, url: str, retention_seconds: int = 7 * 86_400) -> None:
        self._url = url
        self._retention = retention_seconds
        # redis-py types replies as unions of bytes and str; ours are always bytes.
        self._redis: Any = None
        self._follow_conn: Any = None
        self._sink: EntrySink = lambda entries, welcomes: None
        self._watched: dict[str, bytes] = {}  # channel -> last stream id handed to the sink
        self._wake_key = f"svc:wake:{os.getpid()}:{id(self)}"
        self._follower: asyncio.Task[None] | None = None
        self._append: Any = None
        self._commit: Any = None
        self._create_group: Any = None
        self._save_group: Any = None
        self._appends: asyncio.Queue[_Append] = asyncio.Queue()
        self._appender: asyncio.Task[None] | None = None

    def set_sink(self, sink: EntrySink) -> None:
        self._sink = sink

    @property
    def redis(self) -> Any:
        assert self._redis is not None, "store not started"
        return self._redis

    async def start(self) -> None:
        # A blocking pool: a burst of requests waits for a connection instead of failing.
        pool = aioredis.BlockingConnectionPool.from_url(self._url, max_connections=64, timeout=10)
        self._redis = aioredis.Redis(connection_pool=pool)
        self._follow_conn = aioredis.from_url(self._url, socket_timeout=FOLLOW_SOCKET_TIMEOUT)
        await self._redis.ping()
        self._append = self._redis.register_script(APPEND)
        self._commit = self._redis.register_script(COMMIT)
        self._create_group = self._redis.register_script(CREATE_GROUP)
        self._save_group = self._redis.register_script(SAVE_GROUP)
        last = await self._redis.xrevrange(WELCOME_STREAM, count=1)
        self._welcomes_from = last[0][0] if last else b"0-0"
        self._follower = asyncio.create_task(self._follow())
        self._appender = asyncio.create_task(self._append_in_order())

    async def close(self) -> None:
        for task in (self._follower, self._appender):
            if task is not None:
                await _stop(task)
        if self._redis is not None:
            with contextlib.suppress(Exception):
                await self._redis.delete(self._wake_key)
        for conn in (self._redis, self._follow_conn):
            if conn is not None:
                await conn.aclose()

    async def head(self, channel: str) -> tuple[int, int]:
        head, epoch = await self.redis.hmget(_meta(channel), "head", "epoch")
        return int(head or 0), int(epoch or 0)

    def append(
        self, channel: str, sender: bytes, message: bytes, epoch: int
    ) -> asyncio.Future[Entry]:
        many = self._enqueue(channel, sender, [(message, epoch)], check=False)

        async def one() -> Entry:
            return (await many)[0]

        return asyncio.ensure_future(one())

    def append_many(
        self, channel: str, sender: bytes, messages: Sequence[tuple[bytes, int]]
    ) -> asyncio.Future[list[Entry]]:
        return self._enqueue(channel, sender, messages, check=True)

    def _enqueue(
        self, channel: str, sender: bytes, messages: Sequence[tuple[bytes, int]], check: bool
    ) -> asyncio.Future[list[Entry]]:
        future: asyncio.Future[list[Entry]] = asyncio.get_running_loop().create_future()
        self._appends.put_nowait(_Append(channel, sender, list(messages), check, future))
        return future

    async def _append_in_order(self) -> None:
        """Runs queued appends in call order, many per round trip: one pipeline of
        script calls on one connection keeps their order and amortises the latency."""
        while True:
            batch = [await self._appends.get()]
            while len(batch) < 256 and not self._appends.empty():
                batch.append(self._appends.get_nowait())
            now = time.time()
            try:
                async with self.redis.pipeline(transaction=False) as pipe:
                    for a in batch:
                        args: list[Any] = [a.sender, repr(now), "1" if a.check else "0"]
                        for message, epoch in a.messages:
                            args += [epoch, message]
                        await self._append(
                            keys=[_meta(a.channel), _log(a.channel)], args=args, client=pipe
                        )
                    results = await pipe.execute()
            except Exception as exc:
                for a in batch:
                    if not a.future.done():
                        a.future.set_exception(exc)
                continue
            for a, (first, current) in zip(batch, results, strict=True):
                if a.future.done():
                    continue
                if first == -1:
                    a.future.set_exception(StaleMessages(int(current)))
                    continue
                a.future.set_result(
                    [
                        Entry(a.channel, int(first) + i, a.sender, False, epoch, message, now)
                        for i, (message, epoch) in enumerate(a.messages)
                    ]
                )

    async def commit(
        self,
        channel: str,
        sender: bytes,
        epoch: int,
        commit: bytes,
        welcome: bytes,
        joiners: Sequence[bytes],
        group: tuple[int, bytes],
    ) -> Entry:
        now = time.time()
        recipients = [j.hex() for j in joiners] if welcome else []
        version, state = group
        args = [sender, epoch, commit, repr(now), channel, welcome, self._retention]
        seq, current = await self._commit(
            keys=[_meta(channel), _log(channel), WELCOME_STREAM, _group(channel)],
            args=[*args, version, state, *recipients],
        )
        if int(seq) < 0:
            raise CommitRejected(int(current))
        return Entry(channel, int(seq), sender, True, epoch, commit, now)

    async def create_group(self, channel: str, state: bytes) -> bool:
        return bool(await self._create_group(keys=[_group(channel)], args=[state]))

    async def save_group(self, channel: str, version: int, state: bytes) -> None:
        if not await self._save_group(keys=[_group(channel)], args=[version, state]):
            raise GroupConflict(channel)

    async def group_version(self, channel: str) -> int:
        return int(await self.redis.hget(_group(channel), "v") or 0)

    async def group(self, channel: str) -> tuple[int, bytes] | None:
        version, state = await self.redis.hmget(_group(channel), "v", "s")
        return None if version is None or state is None else (int(version), state)

    async def read(self, channel: str, after_seq: int, limit: int) -> list[Entry]:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hget(_meta(channel), "trimmed")
            pipe.xrange(_log(channel), min=f"{after_seq + 1}-1", count=limit)
            trimmed, rows = await pipe.execute()
        if trimmed is not None and after_seq < int(trimmed):
            raise CursorExpired(int(trimmed))
        return [_entry(channel, stream_id, fields) for stream_id, fields in rows]

    async def welcomes(self, recipient: bytes) -> list[WelcomeEntry]:
        stored = await self.redis.hgetall(f"svc:welcome:{recipient.hex()}")
        pending = []
        for field, blob in stored.items():
            channel, seq, epoch = field.decode().split("\n")
            pending.append((int(seq), channel, int(epoch), blob))
        pending = sorted(pending)[-MAX_PENDING_WELCOMES:]
        blobs = await self.redis.mget([p[3] for p in pending]) if pending else []
        return [
            WelcomeEntry(channel, recipient, seq, epoch, welcome)
            for (seq, channel, epoch, _), welcome in zip(pending, blobs, strict=True)
            if welcome is not None  # expired with retention
        ]

    async def trim(self, older_than: float) -> int:
        removed = 0
        async for key in self.redis.scan_iter(match="svc:meta:*", count=500):
            channel = key.decode()[len("svc:meta:") :]
            last_old = 0
            start = "-"
            while True:
                rows = await self.redis.xrange(_log(channel), min=start, count=200)
                old = [r for r in rows if float(r[1][b"t"]) < older_than]
                if old:
                    last_old = int(old[-1][0].split(b"-", 1)[0])
                if len(old) < len(rows) or len(rows) < 200:
                    break
                start = f"({rows[-1][0].decode()}"
            if last_old:
                removed += await self.redis.xtrim(_log(channel), minid=f"{last_old + 1}-1")
                current = int(await self.redis.hget(key, "trimmed") or 0)
                await self.redis.hset(key, "trimmed", max(current, last_old))
        await self.redis.xtrim(WELCOME_STREAM, minid=f"{int(older_than * 1000)}-0")
        return removed

    async def _announced(self, rows: list[Any]) -> list[WelcomeEntry]:
        """The Welcomes a batch of announcements names, one entry per joiner."""
        try:
            blobs = await self.redis.mget([f[b"b"] for _, f in rows])
        except Exception:
            log.exception("loading announced Welcomes failed; joiners get them on connect")
            return []
        return [
            WelcomeEntry(f[b"c"].decode(), bytes.fromhex(r), int(f[b"q"]), int(f[b"e"]), blob)
            for (_, f), blob in zip(rows, blobs, strict=True)
            if blob is not None
            for r in f[b"r"].decode().split(",")
        ]

    # -- following: one XREAD over every watched channel and the Welcome stream --------

    def watch(self, channel: str, after_seq: int) -> None:
        if channel not in self._watched:
            self._watched[channel] = f"{after_seq}-1".encode()
            self._wake()

    def unwatch(self, channel: str) -> None:
        self._watched.pop(channel, None)

    def _wake(self) -> None:
        if self._redis is not None:
            task = asyncio.ensure_future(self._redis.xadd(self._wake_key, {"w": "1"}, maxlen=1))
            task.add_done_callback(lambda t: t.exception())

    async def _follow(self) -> None:
        assert self._follow_conn is not None
        wake_from = b"$"
        while True:
            streams: dict[Any, Any] = {
                self._wake_key: wake_from,
                WELCOME_STREAM: self._welcomes_from,
            }
            streams.update({_log(ch): last for ch, last in self._watched.items()})
            try:
                result = await self._follow_conn.xread(streams, block=FOLLOW_BLOCK_MS, count=1024)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("following Redis streams failed; retrying")
                await asyncio.sleep(0.5)
                continue
            for stream, rows in result or ():
                name = stream.decode()
                if name == self._wake_key:
                    wake_from = rows[-1][0]
                elif name == WELCOME_STREAM:
                    self._welcomes_from = rows[-1][0]
                    self._sink([], await self._announced(rows))
                else:
                    channel = name[len("svc:log:") :]
                    if channel not in self._watched:
                        continue
                    self._watched[channel] = rows[-1][0]
                    self._sink([_entry(channel, sid, f) for sid, f in rows], [])
