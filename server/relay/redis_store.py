"""The scale-out log: Redis Streams shared by any number of stateless relay processes,
on one Redis server or on a Redis Cluster.

Every key of one channel carries the channel as its hash tag, ``svc:{<channel>}:…``, so
they all live in one hash slot and each Lua script touches one slot only (the rule
Redis Cluster enforces; a single server does not care). Per channel:

- ``svc:{ch}:log``, a stream whose entry ids are ``<seq>-1`` (a cursor maps straight
  to a stream position);
- ``svc:{ch}:meta``, a hash with the head sequence number, the current epoch and how
  far retention has trimmed;
- ``svc:{ch}:ids``, a sorted set of the message ids (``Publish.message_id``) each sender
  stored, scored by seq, for dedupe; retention trims it with the log;
- ``svc:{ch}:group``, a hash with the tracked MLS group's state and version;
- ``svc:{ch}:welcome:{seq}``, a hash with the Welcome of the commit at ``seq`` (``w``),
  the epoch it joins (``e``) and its joiners' member ids in hex (``r``), kept for the
  retention period;
- ``svc:{ch}:unindexed``, a sorted set of the commits (seq, scored by time) whose
  joiners' Welcome index below is not yet known to be written.

Appends, and the epoch and group-version check of commits together with storing their
Welcome, are Lua scripts over these keys, so they are atomic across relay processes.

Joiners look their Welcomes up by identity, in ``svc:welcome:<member id hex>`` (a hash
naming each pending Welcome's key), and relays learn of new Welcomes from the stream
``svc:welcomes``. Those keys live in other slots, so the commit script cannot write
them: the relay writes them right after the script (idempotently), then removes the
commit from ``svc:{ch}:unindexed``. Should it die in between, any relay finishes the
job: on start and on every retention pass it re-indexes what has been unindexed for
longer than ``REINDEX_AFTER`` seconds. A commit that was acknowledged never loses its
Welcome; at worst an agent gets it on its next connect, or twice.

Fan-out between relays: on a single server each relay process follows its watched
channels' logs, the Welcome stream and its own wake stream with one blocking XREAD. On
a cluster one XREAD cannot span slots, so the scripts also PUBLISH the new seq on the
channel's Pub/Sub channel ``svc:{ch}:new`` (classic Pub/Sub, which a cluster delivers
on every node); a relay subscribes to its watched channels' and reads their logs from
its cursors with XRANGE when notified, after (re)subscribing, and every
``SWEEP_SECONDS`` in case a notification was lost. The Welcome stream, one key, is
followed with its own XREAD.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster

from .store import (
    MAX_PENDING_WELCOMES,
    CommitRejected,
    CursorExpired,
    Entry,
    EntrySink,
    GroupConflict,
    Pipeline,
    PipelineBroken,
    StaleMessages,
    WelcomeEntry,
)

log = logging.getLogger("svc_server.relay")
# Which node carries the Pub/Sub connection: spread, not secret; a private generator leaves
# the global `random` of the process alone.
_spread = random.Random()  # noqa: S311
os.register_at_fork(after_in_child=_spread.seed)  # as `random` does for its own

WELCOME_STREAM = "svc:welcomes"
# How long the follower's XREAD blocks, and the follower connection's socket timeout,
# which must be longer (redis-py 8 defaults to 5 s: XREAD blocking for as long would
# time out whenever nothing arrives, and reconnect, with an error logged, every 5 s).
FOLLOW_BLOCK_MS = 5000
FOLLOW_SOCKET_TIMEOUT = FOLLOW_BLOCK_MS / 1000 + 10
# How long close() gives Redis to delete this relay's wake stream (a tidy-up: a Redis
# that stopped answering must not hold a stopping relay for the socket timeout).
CLOSE_GRACE = 0.5
# A commit whose joiners' Welcome index is still unconfirmed after this long is
# re-indexed by whichever relay looks (on start, and on every retention pass).
REINDEX_AFTER = 30.0
# On a cluster, how often a relay reads every watched channel's log whether notified or
# not (a Pub/Sub notification is lost when the subscriber's connection breaks), and
# how long it waits for notifications before looking at newly watched channels.
SWEEP_SECONDS = 2.0
NOTIFY_POLL_SECONDS = 0.05
# A relay that fell behind on a channel reads its log on in pages of at most FOLLOW_PAGE
# entries, ending with the one that reaches FOLLOW_PAGE_BYTES (a channel of 1 MiB
# messages must not come back as a gigabyte in one reply), FOLLOW_CHANNELS channels at a
# time. The blocking XREAD over every watched channel takes FOLLOW_PEEK entries of each
# (at the default message limit, a page's bytes): fewer means that channel is caught
# up; as many, that it is read on in pages. More than one, so that a follower a message
# or two behind, as at a conversation's pace, reads nothing twice and makes no second
# round trip.
FOLLOW_PAGE = 1024
FOLLOW_PAGE_BYTES = 4 * 1024 * 1024
FOLLOW_CHANNELS = 4
FOLLOW_PEEK = 4
# Announcements of new Welcomes read at a time: each names a Welcome, which can be as
# large as a message, and the follower loads them together.
WELCOME_PAGE = 16
# ``redis+cluster://[user:password@]host:port[,host:port...]`` (``rediss+cluster`` for
# TLS): the seed nodes of a Redis Cluster; the rest are discovered.
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")

# KEYS: meta, log, ids. ARGV: sender, stored_at, check ("1": refuse messages of an
# epoch other than the channel's), notification channel ('' on a single server, where
# the followers read the logs directly), then epoch, message and id ('' for none) of
# each message. A message whose id the sender stored already (the sorted set ``ids``:
# member <length of sender>:<sender><id>, scored by its seq) is not stored again and
# skips the epoch check. All or nothing: returns {epoch, seq of each message}, or
# {-1, epoch} when refused.
APPEND = """
local current = tonumber(redis.call('HGET', KEYS[1], 'epoch') or '0')
local prefix = #ARGV[1] .. ':' .. ARGV[1]
local seqs = {}
for i = 5, #ARGV, 3 do
  local known = false
  if ARGV[i + 2] ~= '' then known = redis.call('ZSCORE', KEYS[3], prefix .. ARGV[i + 2]) end
  if known then
    seqs[#seqs + 1] = tonumber(known)
  else
    if ARGV[3] == '1' and tonumber(ARGV[i]) ~= current then return {-1, current} end
    seqs[#seqs + 1] = false
  end
end
local seq = tonumber(redis.call('HGET', KEYS[1], 'head') or '0')
local last = 0
for n = 1, #seqs do
  local i = 5 + (n - 1) * 3
  if not seqs[n] and ARGV[i + 2] ~= '' then
    local again = redis.call('ZSCORE', KEYS[3], prefix .. ARGV[i + 2])
    if again then seqs[n] = tonumber(again) end
  end
  if not seqs[n] then
    seq = seq + 1
    redis.call('XADD', KEYS[2], seq .. '-1',
      's', ARGV[1], 'h', '0', 'e', ARGV[i], 'm', ARGV[i + 1], 't', ARGV[2])
    if ARGV[i + 2] ~= '' then redis.call('ZADD', KEYS[3], seq, prefix .. ARGV[i + 2]) end
    seqs[n] = seq
    last = seq
  end
end
if last > 0 then
  redis.call('HSET', KEYS[1], 'head', last)
  if ARGV[4] ~= '' then redis.call('PUBLISH', ARGV[4], last) end
end
local reply = {current}
for n = 1, #seqs do reply[n + 1] = seqs[n] end
return reply
"""

# KEYS: meta, log, group, unindexed. ARGV: sender, epoch, commit, stored_at,
# notification channel, welcome, retention seconds, group version, group state, the
# channel's Welcome key prefix, joiner member ids (hex, comma-separated; '' for none).
# The commit is stored only while the epoch and the tracked group's version are the
# ones it was validated against, with the group state it leads to. Its Welcome, with
# the joiners, is stored once, in the channel's slot (svc:{channel}:welcome:{seq}); the
# joiners' index lives in other slots and is written by the relay after this script.
COMMIT = """
local current = tonumber(redis.call('HGET', KEYS[1], 'epoch') or '0')
local version = tonumber(redis.call('HGET', KEYS[3], 'v') or '0')
if current ~= tonumber(ARGV[2]) or version ~= tonumber(ARGV[8]) then return {-1, current} end
local seq = redis.call('HINCRBY', KEYS[1], 'head', 1)
redis.call('HSET', KEYS[1], 'epoch', current + 1)
redis.call('HSET', KEYS[3], 'v', version + 1, 's', ARGV[9])
redis.call('XADD', KEYS[2], seq .. '-1',
  's', ARGV[1], 'h', '1', 'e', ARGV[2], 'm', ARGV[3], 't', ARGV[4])
if ARGV[11] ~= '' then
  local welcome = ARGV[10] .. seq
  redis.call('HSET', welcome, 'w', ARGV[6], 'e', current + 1, 'r', ARGV[11])
  redis.call('EXPIRE', welcome, ARGV[7])
  redis.call('ZADD', KEYS[4], ARGV[4], seq)
end
if ARGV[5] ~= '' then redis.call('PUBLISH', ARGV[5], seq) end
return {seq, current + 1}
"""

# KEYS: meta, log, group. ARGV: sender, epoch, proposal, stored_at, notification channel,
# group version, group state. A member's proposal is stored only while the epoch and the
# tracked group's version are the ones it was validated against, with the group state
# that holds it. Returns {seq, epoch}, {-1, epoch} for a past epoch, {-2, epoch} for a
# group that moved on.
PROPOSE = """
local current = tonumber(redis.call('HGET', KEYS[1], 'epoch') or '0')
if current ~= tonumber(ARGV[2]) then return {-1, current} end
local version = tonumber(redis.call('HGET', KEYS[3], 'v') or '0')
if version ~= tonumber(ARGV[6]) then return {-2, current} end
local seq = redis.call('HINCRBY', KEYS[1], 'head', 1)
redis.call('HSET', KEYS[3], 'v', version + 1, 's', ARGV[7])
redis.call('XADD', KEYS[2], seq .. '-1',
  's', ARGV[1], 'h', '0', 'e', ARGV[2], 'm', ARGV[3], 't', ARGV[4])
if ARGV[5] ~= '' then redis.call('PUBLISH', ARGV[5], seq) end
return {seq, current}
"""

# A catch-up page: up to ARGV[2] entries of the log (KEYS[1]) from the id ARGV[1] on, and
# with ARGV[3] > 0 none after the one whose message takes them to ARGV[3] bytes, with the
# channel's trimmed-through seq (KEYS[2]) read in the same step. Read sixteen at a time,
# so the script never holds more than one page and sixteen entries.
READ = """
local trimmed = redis.call('HGET', KEYS[2], 'trimmed') or ''
local limit, max_bytes = tonumber(ARGV[2]), tonumber(ARGV[3])
local out, size, start = {}, 0, ARGV[1]
while #out < limit do
  local rows = redis.call('XRANGE', KEYS[1], start, '+', 'COUNT', math.min(16, limit - #out))
  if #rows == 0 then break end
  for _, row in ipairs(rows) do
    local fields = row[2]
    out[#out + 1] = row
    for i = 1, #fields, 2 do
      if fields[i] == 'm' then size = size + #fields[i + 1] end
    end
    if max_bytes > 0 and size >= max_bytes then return {trimmed, out} end
  end
  start = '(' .. rows[#rows][1]
end
return {trimmed, out}
"""

# KEYS: group. ARGV: state. A new channel's group unless it has one; returns its version
# (0: it has one). A dropped group's version is kept negated: the next counts on from it.
CREATE_GROUP = """
local version = tonumber(redis.call('HGET', KEYS[1], 'v') or '0')
if version > 0 then return 0 end
version = 1 - version
redis.call('HSET', KEYS[1], 'v', version, 's', ARGV[1])
return version
"""

# KEYS: group, meta. ARGV: version. Drops the group stored as that version, while the
# channel's log is empty.
DROP_GROUP = """
if redis.call('HGET', KEYS[1], 'v') ~= ARGV[1] then return 0 end
if tonumber(redis.call('HGET', KEYS[2], 'head') or '0') > 0 then return 0 end
redis.call('HSET', KEYS[1], 'v', -tonumber(ARGV[1]), 's', '')
return 1
"""


def _key(channel: str, kind: str) -> str:
    """A key of ``channel``'s: the channel is the hash tag, so all of them share one
    slot. (Channel names never contain braces; see svc_sdk.protocol.CHANNEL_PATTERN.)"""
    return f"svc:{{{channel}}}:{kind}"


def _channel_of(key: bytes | str, kind: str) -> str:
    name = key.decode() if isinstance(key, bytes) else key
    return name[len("svc:{") : -len(f"}}:{kind}")]


def _log(channel: str) -> str:
    return _key(channel, "log")


def _meta(channel: str) -> str:
    return _key(channel, "meta")


def _ids(channel: str) -> str:
    return _key(channel, "ids")


def _group(channel: str) -> str:
    return _key(channel, "group")


def _unindexed(channel: str) -> str:
    return _key(channel, "unindexed")


def _notify(channel: str) -> str:
    """The Pub/Sub channel announcing ``channel``'s new entries on a cluster."""
    return _key(channel, "new")


def _welcome(channel: str, seq: int) -> str:
    return _key(channel, f"welcome:{seq}")


def _inbox(recipient_hex: str) -> str:
    """A joiner's Welcome index: field ``channel\nseq\nepoch``, value the Welcome key."""
    return f"svc:welcome:{recipient_hex}"


def is_cluster_url(url: str) -> bool:
    return url.partition("://")[0] in CLUSTER_SCHEMES


class _BoundedCluster(RedisCluster):
    """A RedisCluster client that waits for a connection instead of failing: redis-py's
    cluster client raises MaxConnectionsError once a node's pool is used up (its
    single-server client can block, and the relay uses that). At most ``COMMANDS``
    commands and ``PIPELINES`` pipelines run at once, each holding at most one
    connection per node, within the pools' ``max_connections`` per node."""

    COMMANDS = 64
    PIPELINES = 16

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("max_connections", self.COMMANDS + self.PIPELINES + 4)
        super().__init__(*args, **kwargs)
        self._commands = asyncio.Semaphore(self.COMMANDS)
        self._pipelines = asyncio.Semaphore(self.PIPELINES)

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        async with self._commands:
            return await super().execute_command(*args, **kwargs)

    def pipeline(self, transaction: Any = None, shard_hint: Any = None) -> Any:
        pipe = super().pipeline(transaction, shard_hint)
        execute = pipe.execute

        async def bounded(*args: Any, **kwargs: Any) -> Any:
            async with self._pipelines:
                return await execute(*args, **kwargs)

        pipe.execute = bounded  # type: ignore[method-assign]
        return pipe


def cluster_client(url: str, **kwargs: Any) -> RedisCluster:
    """A RedisCluster client for ``redis+cluster://[user:pass@]host:port[,host:port…]``."""
    parts = urlsplit(url)
    seeds = []
    for address in parts.netloc.rpartition("@")[2].split(","):
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"{url!r}: expected host:port[,host:port...] after the scheme")
        seeds.append(ClusterNode(host.strip("[]"), int(port)))
    if parts.path.strip("/") not in ("", "0"):
        raise ValueError(f"{url!r}: Redis Cluster has only database 0")
    return _BoundedCluster(
        startup_nodes=seeds,
        username=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password else None,
        ssl=parts.scheme.startswith("rediss"),
        **kwargs,
    )


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
    ids: list[bytes]  # one per message, or none
    check: bool  # refuse them unless they are all of the channel's current epoch
    future: asyncio.Future[list[Entry]]
    pipeline: Pipeline | None = None


class RedisLogStore:
    def __init__(self, url: str, retention_seconds: int = 7 * 86_400) -> None:
        self._url = url
        self._retention = retention_seconds
        self._cluster = is_cluster_url(url)
        # redis-py types replies as unions of bytes and str; ours are always bytes.
        self._redis: Any = None
        self._follow_conn: Any = None
        self._sink: EntrySink = lambda entries, welcomes: None
        self._watched: dict[str, bytes] = {}  # channel -> last stream id handed to the sink
        self._wake_key = f"svc:wake:{os.getpid()}:{id(self)}"
        self._watch_changed = asyncio.Event()
        self._followers: list[asyncio.Task[None]] = []
        self._append: Any = None
        self._commit: Any = None
        self._propose: Any = None
        self._create_group: Any = None
        self._read: Any = None
        self._appends: asyncio.Queue[_Append] = asyncio.Queue()
        self._appender: asyncio.Task[None] | None = None

    def set_sink(self, sink: EntrySink) -> None:
        self._sink = sink

    @property
    def redis(self) -> Any:
        assert self._redis is not None, "store not started"
        return self._redis

    @property
    def _follower(self) -> asyncio.Task[None] | None:
        return self._followers[0] if self._followers else None

    async def start(self) -> None:
        if self._cluster:
            self._redis = cluster_client(self._url)
            self._follow_conn = cluster_client(self._url, socket_timeout=FOLLOW_SOCKET_TIMEOUT)
        else:
            # A blocking pool: a burst of requests waits for a connection, not fails.
            pool = aioredis.BlockingConnectionPool.from_url(
                self._url, max_connections=64, timeout=10
            )
            self._redis = aioredis.Redis(connection_pool=pool)
            self._follow_conn = aioredis.from_url(self._url, socket_timeout=FOLLOW_SOCKET_TIMEOUT)
        await self._redis.ping()
        self._append = self._redis.register_script(APPEND)
        self._commit = self._redis.register_script(COMMIT)
        self._propose = self._redis.register_script(PROPOSE)
        self._create_group = self._redis.register_script(CREATE_GROUP)
        self._drop_group = self._redis.register_script(DROP_GROUP)
        self._read = self._redis.register_script(READ)
        last = await self._redis.xrevrange(WELCOME_STREAM, count=1)
        self._welcomes_from = last[0][0] if last else b"0-0"
        await self._reindex(time.time() - REINDEX_AFTER)
        if self._cluster:
            self._followers = [
                asyncio.create_task(self._follow_notified()),
                asyncio.create_task(self._follow_welcomes()),
            ]
        else:
            self._followers = [asyncio.create_task(self._follow())]
        self._appender = asyncio.create_task(self._append_in_order())

    async def close(self) -> None:
        for task in (*self._followers, self._appender):
            if task is not None:
                await _stop(task)
        if self._redis is not None and not self._cluster:
            with contextlib.suppress(Exception):  # TimeoutError included
                await asyncio.wait_for(self._redis.delete(self._wake_key), CLOSE_GRACE)
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
        self,
        channel: str,
        sender: bytes,
        messages: Sequence[tuple[bytes, int]],
        ids: Sequence[bytes] = (),
        pipeline: Pipeline | None = None,
    ) -> asyncio.Future[list[Entry]]:
        return self._enqueue(channel, sender, messages, check=True, ids=ids, pipeline=pipeline)

    def _enqueue(
        self,
        channel: str,
        sender: bytes,
        messages: Sequence[tuple[bytes, int]],
        check: bool,
        ids: Sequence[bytes] = (),
        pipeline: Pipeline | None = None,
    ) -> asyncio.Future[list[Entry]]:
        future: asyncio.Future[list[Entry]] = asyncio.get_running_loop().create_future()
        append = _Append(channel, sender, list(messages), list(ids), check, future, pipeline)
        self._appends.put_nowait(append)
        return future

    def _notification(self, channel: str) -> str:
        return _notify(channel) if self._cluster else ""

    async def _append_in_order(self) -> None:
        """Runs queued appends in call order, many per round trip: one pipeline of
        script calls on one connection (per cluster node) keeps their order and
        amortises the latency."""
        while True:
            batch = [await self._appends.get()]
            while len(batch) < 256 and not self._appends.empty():
                batch.append(self._appends.get_nowait())
            for a in batch:
                if a.pipeline is not None and a.pipeline.broken and not a.future.done():
                    a.future.set_exception(PipelineBroken())
            batch = [a for a in batch if a.pipeline is None or not a.pipeline.broken]
            if not batch:
                continue
            now = time.time()
            try:
                async with self.redis.pipeline(transaction=False) as pipe:
                    for a in batch:
                        keys = [_meta(a.channel), _log(a.channel), _ids(a.channel)]
                        args: list[Any] = [
                            a.sender,
                            repr(now),
                            "1" if a.check else "0",
                            self._notification(a.channel),
                        ]
                        for i, (message, epoch) in enumerate(a.messages):
                            args += [epoch, message, a.ids[i] if a.ids else b""]
                        if self._cluster:
                            # EVAL, not EVALSHA: a cluster pipeline does not load scripts
                            # first, and a promoted replica has none cached.
                            pipe.eval(APPEND, len(keys), *keys, *args)
                        else:
                            await self._append(keys=keys, args=args, client=pipe)
                    results = await pipe.execute()
            except Exception as exc:
                for a in batch:
                    if a.pipeline is not None:
                        a.pipeline.broken = True
                    if not a.future.done():
                        a.future.set_exception(exc)
                continue
            for a, result in zip(batch, results, strict=True):
                if a.future.done():
                    continue
                if int(result[0]) == -1:
                    a.future.set_exception(StaleMessages(int(result[1])))
                    continue
                # A repeated id's entry carries the seq it was first stored with.
                a.future.set_result(
                    [
                        Entry(a.channel, int(seq), a.sender, False, epoch, message, now)
                        for seq, (message, epoch) in zip(result[1:], a.messages, strict=True)
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
        seq, current = await self._commit(
            keys=[_meta(channel), _log(channel), _group(channel), _unindexed(channel)],
            args=[
                sender,
                epoch,
                commit,
                repr(now),
                self._notification(channel),
                welcome,
                self._retention,
                version,
                state,
                _key(channel, "welcome:"),
                ",".join(recipients),
            ],
        )
        if int(seq) < 0:
            raise CommitRejected(int(current))
        if recipients:
            try:
                await self._index(channel, int(seq), int(current), recipients)
            except Exception:
                # The commit and its Welcome are stored: a later pass indexes it.
                log.exception(
                    "indexing the Welcome of %s seq %s failed; redone later", channel, seq
                )
        return Entry(channel, int(seq), sender, True, epoch, commit, now)

    async def _index(self, channel: str, seq: int, epoch: int, recipients: list[str]) -> None:
        """Writes the joiners' index entries for the Welcome of ``channel``'s commit at
        ``seq`` and announces it, then marks it indexed. Idempotent."""
        welcome = _welcome(channel, seq)
        field = f"{channel}\n{seq}\n{epoch}"
        async with self.redis.pipeline(transaction=False) as pipe:
            for recipient in recipients:
                pipe.hset(_inbox(recipient), field, welcome)
                pipe.expire(_inbox(recipient), self._retention)
            pipe.xadd(
                WELCOME_STREAM,
                {"c": channel, "r": ",".join(recipients), "q": seq, "e": epoch, "b": welcome},
            )
            await pipe.execute()
        await self.redis.zrem(_unindexed(channel), seq)

    async def _reindex(self, before: float) -> int:
        """Indexes the Welcomes of commits stored before ``before`` whose relay did not
        get to it (it died between the commit and the index). Returns how many."""
        done = 0
        async for key in self.redis.scan_iter(match="svc:{*}:unindexed", count=500):
            channel = _channel_of(key, "unindexed")
            for seq in await self.redis.zrangebyscore(key, "-inf", before):
                epoch, recipients = await self.redis.hmget(_welcome(channel, int(seq)), "e", "r")
                if epoch is None or recipients is None:  # expired with retention
                    await self.redis.zrem(key, seq)
                    continue
                log.warning("indexing the Welcome of %s seq %s left over", channel, int(seq))
                await self._index(channel, int(seq), int(epoch), recipients.decode().split(","))
                done += 1
        return done

    async def propose(
        self, channel: str, sender: bytes, epoch: int, proposal: bytes, group: tuple[int, bytes]
    ) -> Entry:
        now = time.time()
        version, state = group
        seq, current = await self._propose(
            keys=[_meta(channel), _log(channel), _group(channel)],
            args=[sender, epoch, proposal, repr(now), self._notification(channel), version, state],
        )
        if int(seq) == -1:
            raise StaleMessages(int(current))
        if int(seq) < 0:
            raise GroupConflict(channel)
        return Entry(channel, int(seq), sender, False, epoch, proposal, now)

    async def create_group(self, channel: str, state: bytes) -> int:
        return int(await self._create_group(keys=[_group(channel)], args=[state]))

    async def drop_group(self, channel: str, version: int) -> bool:
        keys = [_group(channel), _meta(channel)]
        return bool(await self._drop_group(keys=keys, args=[version]))

    async def group_version(self, channel: str) -> int:
        return max(0, int(await self.redis.hget(_group(channel), "v") or 0))

    async def group(self, channel: str) -> tuple[int, bytes] | None:
        version, state = await self.redis.hmget(_group(channel), "v", "s")
        if version is None or state is None or int(version) <= 0:
            return None
        return int(version), state

    async def read(
        self, channel: str, after_seq: int, limit: int, max_bytes: int | None = None
    ) -> list[Entry]:
        trimmed, entries = await self._page(channel, f"{after_seq + 1}-1", limit, max_bytes)
        if trimmed and after_seq < int(trimmed):
            raise CursorExpired(int(trimmed))
        return entries

    async def _page(
        self, channel: str, start: bytes | str, limit: int, max_bytes: int | None
    ) -> tuple[bytes, list[Entry]]:
        """The READ script: the channel's trimmed-through seq (b"" if never trimmed) and
        up to ``limit`` entries from the stream id ``start`` on (``(`` before it: after)."""
        trimmed, rows = await self._read(
            keys=[_log(channel), _meta(channel)], args=[start, limit, max_bytes or 0]
        )
        return trimmed, [
            _entry(channel, stream_id, dict(zip(fields[::2], fields[1::2], strict=True)))
            for stream_id, fields in rows
        ]

    async def _welcome_blobs(self, keys: Iterable[bytes | str]) -> list[bytes | None]:
        """The Welcomes stored under ``keys`` (None where retention removed one); the
        keys are in several slots, so one HGET each, pipelined."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.hget(key, "w")
            blobs: list[bytes | None] = await pipe.execute()
            return blobs

    async def welcomes(self, recipient: bytes) -> list[WelcomeEntry]:
        stored = await self.redis.hgetall(_inbox(recipient.hex()))
        pending = []
        for field, key in stored.items():
            channel, seq, epoch = field.decode().split("\n")
            pending.append((int(seq), channel, int(epoch), key))
        pending = sorted(pending)[-MAX_PENDING_WELCOMES:]
        blobs = await self._welcome_blobs(p[3] for p in pending) if pending else []
        return [
            WelcomeEntry(channel, recipient, seq, epoch, welcome)
            for (seq, channel, epoch, _), welcome in zip(pending, blobs, strict=True)
            if welcome is not None  # expired with retention
        ]

    async def trim(self, older_than: float) -> int:
        removed = 0
        # On a cluster, scan_iter walks every primary.
        async for key in self.redis.scan_iter(match="svc:{*}:meta", count=500):
            channel = _channel_of(key, "meta")
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
                await self.redis.zremrangebyscore(_ids(channel), "-inf", last_old)
                current = int(await self.redis.hget(key, "trimmed") or 0)
                await self.redis.hset(key, "trimmed", max(current, last_old))
        await self.redis.xtrim(WELCOME_STREAM, minid=f"{int(older_than * 1000)}-0")
        await self._reindex(time.time() - REINDEX_AFTER)
        return removed

    async def _announced(self, rows: list[Any]) -> list[WelcomeEntry]:
        """The Welcomes a batch of announcements names, one entry per joiner."""
        try:
            blobs = await self._welcome_blobs(f[b"b"] for _, f in rows)
        except Exception:
            log.exception("loading announced Welcomes failed; joiners get them on connect")
            return []
        return [
            WelcomeEntry(f[b"c"].decode(), bytes.fromhex(r), int(f[b"q"]), int(f[b"e"]), blob)
            for (_, f), blob in zip(rows, blobs, strict=True)
            if blob is not None
            for r in f[b"r"].decode().split(",")
        ]

    # -- following -----------------------------------------------------------------------

    def watch(self, channel: str, after_seq: int) -> None:
        if channel not in self._watched:
            self._watched[channel] = f"{after_seq}-1".encode()
            self._wake()

    def unwatch(self, channel: str) -> None:
        self._watched.pop(channel, None)

    def _wake(self) -> None:
        if self._cluster:
            self._watch_changed.set()
        elif self._redis is not None:
            task = asyncio.ensure_future(self._redis.xadd(self._wake_key, {"w": "1"}, maxlen=1))
            task.add_done_callback(lambda t: t.exception())

    async def _follow(self) -> None:
        """On one server: one XREAD over every watched channel, the Welcome stream and
        this process's wake stream (written to when a channel is newly watched), then
        pages of what any of them holds beyond that."""
        assert self._follow_conn is not None
        wake_from = b"$"
        while True:
            streams: dict[Any, Any] = {
                self._wake_key: wake_from,
                WELCOME_STREAM: self._welcomes_from,
            }
            streams.update({_log(ch): last for ch, last in self._watched.items()})
            try:
                result = await self._follow_conn.xread(
                    streams, block=FOLLOW_BLOCK_MS, count=FOLLOW_PEEK
                )
                behind: list[str] = []
                for stream, rows in result or ():
                    name = stream.decode()
                    if name == self._wake_key:
                        wake_from = rows[-1][0]
                    elif name == WELCOME_STREAM:
                        self._welcomes_from = rows[-1][0]
                        self._sink([], await self._announced(rows))
                        if len(rows) == FOLLOW_PEEK:
                            await self._welcomes_on()
                    else:
                        channel = _channel_of(name, "log")
                        if channel not in self._watched:
                            continue
                        self._watched[channel] = rows[-1][0]
                        self._sink([_entry(channel, sid, f) for sid, f in rows], [])
                        if len(rows) == FOLLOW_PEEK:
                            behind.append(channel)
                # Those still behind come back in the next XREAD, which does not block.
                await self._catch_up(behind)
            except asyncio.CancelledError:
                raise
            except Exception:
                # The cursors moved only past what the sink got: the next XREAD resumes.
                log.exception("following Redis streams failed; retrying")
                await asyncio.sleep(0.5)

    async def _welcomes_on(self) -> None:
        """Reads the next WELCOME_PAGE announcements past the Welcome stream's cursor
        (more come back in the next XREAD)."""
        rows = await self.redis.xrange(
            WELCOME_STREAM, min=b"(" + self._welcomes_from, count=WELCOME_PAGE
        )
        if rows:
            self._welcomes_from = rows[-1][0]
            self._sink([], await self._announced(rows))

    async def _follow_welcomes(self) -> None:
        """On a cluster: the Welcome stream, one key, with its own blocking XREAD."""
        while True:
            try:
                result = await self._follow_conn.xread(
                    {WELCOME_STREAM: self._welcomes_from}, block=FOLLOW_BLOCK_MS, count=WELCOME_PAGE
                )
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("following the Redis Welcome stream failed; retrying")
                await asyncio.sleep(0.5)
                continue
            for _, rows in result or ():
                self._welcomes_from = rows[-1][0]
                self._sink([], await self._announced(rows))

    async def _catch_up(self, channels: Iterable[str]) -> set[str]:
        """Hands the sink the next page (FOLLOW_PAGE entries or FOLLOW_PAGE_BYTES) of what
        each watched channel's log holds past its cursor, FOLLOW_CHANNELS at once, and
        returns the channels with more. One page each, not all: a channel far behind must
        not hold up the others' new entries while it is read."""
        due = [ch for ch in channels if ch in self._watched]
        more = set()
        for i in range(0, len(due), FOLLOW_CHANNELS):
            group = [ch for ch in due[i : i + FOLLOW_CHANNELS] if ch in self._watched]
            pages = await asyncio.gather(
                *(
                    self._page(ch, b"(" + self._watched[ch], FOLLOW_PAGE, FOLLOW_PAGE_BYTES)
                    for ch in group
                )
            )
            for ch, (_, entries) in zip(group, pages, strict=True):
                if not entries or ch not in self._watched:
                    continue
                self._watched[ch] = f"{entries[-1].seq}-1".encode()
                self._sink(entries, [])
                size = sum(len(e.message) for e in entries)
                if len(entries) == FOLLOW_PAGE or size >= FOLLOW_PAGE_BYTES:
                    more.add(ch)
        return more

    async def _follow_notified(self) -> None:
        """On a cluster: subscribes to the watched channels' notifications (on any one
        node; classic Pub/Sub reaches every node) and reads a channel's log when
        notified, after subscribing, and every SWEEP_SECONDS regardless."""
        pubsub: Any = None
        subscribed: set[str] = set()
        due: set[str] = set()
        swept = time.monotonic()
        while True:
            try:
                if pubsub is None:
                    # Any node: classic Pub/Sub reaches all of them. Random spreads load.
                    node = _spread.choice(self.redis.get_nodes())
                    pubsub = self.redis.pubsub(node=node)
                    subscribed, due = set(), set(self._watched)
                self._watch_changed.clear()
                wanted = set(self._watched)
                if wanted - subscribed:
                    await pubsub.subscribe(*(_notify(ch) for ch in wanted - subscribed))
                    due |= wanted - subscribed  # what came before the subscription
                if subscribed - wanted:
                    await pubsub.unsubscribe(*(_notify(ch) for ch in subscribed - wanted))
                subscribed = wanted
                if time.monotonic() - swept >= SWEEP_SECONDS:
                    due, swept = due | wanted, time.monotonic()
                if due:
                    due = await self._catch_up(due)  # those with more are read next round
                if not subscribed:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._watch_changed.wait(), SWEEP_SECONDS)
                    continue
                # Reads as soon as one notification names an entry not yet read, so
                # entries are handed on in batches about as small as they are stored (a
                # subscriber's buffer may hold only a few); notifications of entries an
                # earlier read already got are passed over without a round trip. With
                # channels due, it takes only notifications already there, so a channel
                # far behind, read a page a round, does not keep the others waiting.
                taken = 0
                while (
                    not self._watch_changed.is_set()
                    and time.monotonic() - swept < SWEEP_SECONDS
                    and not (due and taken >= FOLLOW_PAGE)
                ):
                    message = await pubsub.get_message(
                        ignore_subscribe_messages=True, timeout=0.0 if due else NOTIFY_POLL_SECONDS
                    )
                    if message is None:
                        break
                    taken += 1
                    if message["type"] != "message":
                        continue
                    channel = _channel_of(message["channel"], "new")
                    cursor = self._watched.get(channel)
                    if cursor is not None and int(message["data"]) > int(cursor.split(b"-")[0]):
                        due.add(channel)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("following Redis Cluster channels failed; retrying")
                if pubsub is not None:
                    with contextlib.suppress(Exception):
                        await pubsub.aclose()
                pubsub = None
                await asyncio.sleep(0.5)
