"""Connections: one redis-py asyncio client per transport, from a ``redis://``
or ``rediss://`` URL, with a clear error and backoff when the server is down."""

import asyncio
import logging
import random
from typing import Any, Optional, Sequence

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.backoff import ExponentialBackoff
from redis.exceptions import AskError, ClusterError, SlotNotCoveredError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.asyncio.retry import Retry  # the asyncio one: a sync Retry is converted with a warning
from yarl import URL

__all__ = [
    "BrokerURLError",
    "BrokerUnavailable",
    "connect",
    "parse_url",
    "TRANSIENT_ERRORS",
    "is_cluster",
]

log = logging.getLogger(__name__)

SCHEMES = ("redis", "rediss")

#: Errors after which a command may be retried once the connection is back.
#: The cluster ones (CLUSTERDOWN, TRYAGAIN, MOVED/ASK left after redis-py's own
#: redirects, a slot not covered yet) only happen on Redis Cluster, during a
#: failover or resharding; the command did not run.
TRANSIENT_ERRORS = (
    RedisConnectionError,
    RedisTimeoutError,
    ConnectionError,
    OSError,
    ClusterError,
    TryAgainError,
    AskError,
    SlotNotCoveredError,
)


try:
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # pragma: no cover - hiredis comes with redis[hiredis]
    _hiredis_pack = None


class _HiredisPack:
    """Commands packed by hiredis (C) instead of redis-py's asyncio packer.

    redis-py's asyncio connection packs in Python and copies its buffer once per
    argument: 278 µs for an EVALSHA of 100 messages (the producer's per-partition
    call, five arguments a message), 44 µs with hiredis; 27 against 4 µs for an
    XREAD of 30 streams. The bytes are the same (tests/transport/test_client.py).
    Arguments hiredis does not take (None, bool) go to redis-py's packer, which
    raises its own DataError."""

    def pack_command(self, *args: Any) -> list:
        first = args[0]
        if isinstance(first, str):
            first = first.encode()
        if b" " in first:  # "SCRIPT LOAD": the words are separate arguments
            args = tuple(first.split()) + args[1:]
        try:
            return [_hiredis_pack(args)]
        except TypeError:
            return super().pack_command(*args)  # type: ignore[misc]


def _packed(connection_class: type) -> type:
    if _hiredis_pack is None or issubclass(connection_class, _HiredisPack):
        return connection_class
    return type(f"Packed{connection_class.__name__}", (_HiredisPack, connection_class), {})


def is_cluster(client: Any) -> bool:
    return isinstance(client, RedisCluster)


class BrokerURLError(ValueError):
    """The broker URL cannot be used (unknown scheme, bad host/port/db)."""


class BrokerUnavailable(ConnectionError):
    """The broker did not answer within the start-up retry budget."""


def parse_url(url: Any) -> URL:
    u = URL(str(url))
    if u.scheme not in SCHEMES:
        raise BrokerURLError(
            f"unsupported broker URL {str(url)!r}: scheme must be one of "
            f"{', '.join(s + '://' for s in SCHEMES)}"
        )
    if not u.host:
        raise BrokerURLError(f"broker URL {str(url)!r} has no host")
    try:
        _ = u.port
    except ValueError as exc:
        raise BrokerURLError(f"broker URL {str(url)!r} has a bad port") from exc
    db = u.path.strip("/")
    if db and not db.isdigit():
        raise BrokerURLError(f"broker URL {str(url)!r}: database must be a number, got {db!r}")
    return u


def _client_url(u: URL) -> str:
    # faust adds its own query params; redis-py must not see unknown ones
    return str(u.with_query({k: v for k, v in u.query.items() if k in ("ssl_cert_reqs",)}))


async def connect(
    urls: Sequence[Any],
    *,
    pool_size: Optional[int] = None,
    pool_timeout: float = 5.0,
    attempts: int = 8,
    base_delay: float = 0.25,
    max_delay: float = 5.0,
    **kwargs: Any,
) -> "aioredis.Redis | RedisCluster":
    """Connect to the first URL; retry with jittered exponential backoff.

    Returns a :class:`RedisCluster` client when the server runs in cluster mode.
    """
    u = parse_url(urls[0])
    opts = dict(
        decode_responses=False,
        retry=Retry(ExponentialBackoff(cap=2.0, base=0.05), 5),
        retry_on_error=[RedisConnectionError, RedisTimeoutError],
        health_check_interval=10,
        socket_keepalive=True,
    )
    opts.update(kwargs)
    last: BaseException | None = None
    for attempt in range(attempts):
        if pool_size:
            # a bounded pool: a caller waits up to pool_timeout for a connection instead of
            # opening one per request in flight (2,000 concurrent API requests opened 2,000)
            pool = aioredis.BlockingConnectionPool.from_url(_client_url(u), max_connections=pool_size,
                                                            timeout=pool_timeout, **opts)
            client: Any = aioredis.Redis(connection_pool=pool)
        else:
            client = aioredis.Redis.from_url(_client_url(u), **opts)
        pool = client.connection_pool
        pool.connection_class = _packed(pool.connection_class)
        try:
            info = await client.info("cluster")
            if info.get("cluster_enabled") in (1, "1"):
                await client.aclose()
                opts.pop("health_check_interval", None)
                # the consumer keeps one blocked XREAD per hash slot it reads
                # (see Consumer._xread_cluster): allow more than the default 100
                opts.setdefault("max_connections", 1000)
                client = RedisCluster.from_url(_client_url(u), **opts)
                await client.initialize()
            return client
        except TRANSIENT_ERRORS as exc:
            last = exc
            await client.aclose()
            delay = min(max_delay, base_delay * 2**attempt)
            delay = delay / 2 + random.random() * delay / 2
            log.warning(
                "broker %s unreachable (%s); retrying in %.1fs (%d/%d)",
                u.with_password(None) if u.password else u, exc, delay, attempt + 1, attempts,
            )
            await asyncio.sleep(delay)
    raise BrokerUnavailable(
        f"cannot reach the broker at {u.with_password(None) if u.password else u} "
        f"after {attempts} attempts: {last}"
    )


def raw_reply(response: Any, **options: Any) -> Any:
    """A reply callback that keeps the reply as the server sent it."""
    return response
