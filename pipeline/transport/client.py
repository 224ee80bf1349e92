"""Connections: one redis-py asyncio client per transport, from a ``redis://``
or ``rediss://`` URL, with a clear error and backoff when the server is down.

A Redis Cluster is detected (``INFO cluster``) and gets a cluster client. Its URL
may name several seed nodes, any of which is enough to find the others:

    redis://[USER:PASSWORD@]h1:p1,h2:p2,h3:p3/0[?options]

(one user, password, database and set of options for all; a ``,`` or ``;`` in the
password percent-encoded, ``%2C`` / ``%3B``, as Faust splits a broker URL there).
:func:`parse_url` turns it into the URL of the first node with the others as
``seed=h2:p2&seed=h3:p3``; a cluster has database 0 only, anything else is a
:class:`BrokerURLError`.
"""

import asyncio
import logging
import random
import re
from typing import Any, Optional, Sequence

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.backoff import ExponentialBackoff
from redis.exceptions import AskError, ClusterError, RedisClusterException, ResponseError, SlotNotCoveredError, \
    TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.asyncio.retry import Retry  # the asyncio one: a sync Retry is converted with a warning
from yarl import URL

__all__ = [
    "BrokerURLError",
    "BrokerUnavailable",
    "connect",
    "parse_url",
    "seed_nodes",
    "public_url",
    "sync_client",
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


#: ``scheme://[userinfo@]hosts<path, query>``: hosts may be several, comma-separated
_NETLOC = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*)://(?:(?P<auth>[^/?#]*)@)?(?P<hosts>[^@/?#]*)(?P<rest>.*)$",
                     re.S)


def _joined(url: Any) -> str:
    """A broker URL as one string. Faust splits a broker URL at ``,`` and ``;``
    (faust.utils.urls.urllist): ``redis://:pw@a:1,b:2/0?x=1`` reaches the transport as
    ``[redis://:pw@a:1, redis://b:2/0?x=1]``; this puts it back together."""
    if isinstance(url, (list, tuple)):
        if len(url) != 1:
            if not url:
                raise BrokerURLError("no broker URL")
            parts = [u if isinstance(u, URL) else URL(str(u)) for u in url]
            first, last = parts[0], parts[-1]
            hosts = [first.raw_authority] + [p.raw_authority for p in parts[1:]]
            return f"{first.scheme}://" + ",".join(hosts) + last.raw_path_qs
        url = url[0]
    return str(url)


def _split_seeds(text: str) -> tuple[str, list[str]]:
    """``redis://auth@h1:p1,h2:p2/0`` → (``redis://auth@h1:p1/0``, [``h2:p2``]); a URL
    of one host is returned as it is."""
    m = _NETLOC.match(text)
    if not m or "," not in m["hosts"]:
        return text, []
    first, *others = m["hosts"].split(",")
    auth = f"{m['auth']}@" if m["auth"] is not None else ""
    return f"{m['scheme']}://{auth}{first}{m['rest']}", others


def public_url(url: Any) -> str:
    """``url`` as it may be shown (logs, ``notify status``, errors): the password, if
    any, replaced by ``***``; a string that does not parse is shown up to its ``@``."""
    try:
        text = _joined(url)
    except (BrokerURLError, ValueError, TypeError):
        text = str(url)
    m = _NETLOC.match(text)
    if m and "," in m["hosts"] and m["auth"] is not None:  # several seed nodes: yarl takes one host
        user, colon, _ = m["auth"].partition(":")
        return f"{m['scheme']}://{user + ':***' if colon else '***'}@{m['hosts']}{m['rest']}"
    try:
        u = URL(text)
        return str(u.with_password("***")) if u.password else str(u)
    except (ValueError, TypeError):
        return re.sub(r"^([^/@]*//)?[^/@]*@", lambda m: (m.group(1) or "") + "***@", text)


def _seed(scheme: str, seed: str, shown: str) -> tuple[str, int]:
    try:
        u = URL(f"{scheme}://{seed}")
        port = u.port
    except (ValueError, TypeError):
        raise BrokerURLError(f"broker URL {shown!r}: seed node {seed!r} does not parse") from None
    if not u.host or u.raw_path not in ("", "/") or u.raw_query_string or u.raw_user:
        raise BrokerURLError(f"broker URL {shown!r}: seed node {seed!r} is not host:port")
    return u.host, port or 6379


def parse_url(url: Any) -> URL:
    """The broker URL, checked: a ``str``, a :class:`URL`, or the list Faust makes of
    it. Several seed nodes (``h1:p1,h2:p2``) come back as the first one's URL with
    ``seed=`` options for the others (see the module doc)."""
    try:
        text = _joined(url)
    except (ValueError, TypeError) as exc:
        raise BrokerURLError(f"broker URL {public_url(url)!r} does not parse: {exc}") from None
    shown = public_url(text)
    text, seeds = _split_seeds(text)
    try:
        u = URL(text)
    except (ValueError, TypeError) as exc:
        raise BrokerURLError(f"broker URL {shown!r} does not parse: {exc}") from None
    if u.scheme not in SCHEMES:
        raise BrokerURLError(
            f"unsupported broker URL {shown!r}: scheme must be one of "
            f"{', '.join(s + '://' for s in SCHEMES)}"
        )
    if not u.host:
        raise BrokerURLError(f"broker URL {shown!r} has no host")
    try:
        _ = u.port
    except ValueError as exc:
        raise BrokerURLError(f"broker URL {shown!r} has a bad port") from exc
    db = u.path.strip("/")
    if db and not db.isdigit():
        raise BrokerURLError(f"broker URL {shown!r}: database must be a number, got {db!r}")
    for seed in [*u.query.getall("seed", ()), *seeds]:
        _seed(u.scheme, seed, shown)
    if seeds:
        u = u.extend_query([("seed", seed) for seed in seeds])
    if len(seed_nodes(u)) > 1 and db not in ("", "0"):
        raise BrokerURLError(cluster_db_message(u, shown))
    return u


def cluster_db_message(u: URL, shown: Optional[str] = None) -> str:
    return (f"broker URL {shown or public_url(u)}: a Redis Cluster has database 0 only, "
            f"not {u.path.strip('/')} (end the URL with /0)")


def seed_nodes(u: URL) -> list[tuple[str, int]]:
    """(host, port) of every node the URL names: its host, then each ``seed=``."""
    return [(u.host or "", u.port or 6379)] + [_seed(u.scheme, s, public_url(u)) for s in u.query.getall("seed", ())]


#: query options of a broker URL that redis-py takes (TLS: ``rediss://…?ssl_ca_certs=/path/ca.pem``);
#: the others are the transport's own (``slots``, ``prefix``, …) or Faust's
CLIENT_OPTIONS = ("ssl_cert_reqs", "ssl_ca_certs", "ssl_ca_path", "ssl_certfile", "ssl_keyfile",
                  "ssl_check_hostname", "ssl_min_version")


def _client_url(u: URL) -> str:
    # faust adds its own query params; redis-py must not see unknown ones
    return str(u.with_query({k: v for k, v in u.query.items() if k in CLIENT_OPTIONS}))


def _db0(u: URL) -> URL:
    return u.with_path("/0").with_query(u.query)  # with_path drops the query


def _cluster_refused(u: URL, exc: BaseException) -> BaseException:
    """What a cluster client's start-up error means to a user: seeds that are not a
    cluster (a wrong URL), or no seed answering (the broker is down)."""
    if "not enabled" in str(exc):  # "Cluster mode is not enabled on this node"
        return BrokerURLError(f"broker URL {public_url(u)} names several seed nodes, "
                              f"but {u.host}:{u.port or 6379} is not a Redis Cluster node")
    return BrokerUnavailable(f"cannot reach the Redis Cluster at {public_url(u)}: {exc}")


def sync_client(url: Any, **kwargs: Any) -> Any:
    """A synchronous redis-py client for a broker URL (credentials and TLS options
    kept, the transport's options dropped), for the CLI and the supervisor: a
    ``redis.cluster.RedisCluster`` when the server is a Redis Cluster node (or the URL
    names several seed nodes). A server that does not answer yet gets a plain client,
    whose first command says so."""
    import redis
    from redis.cluster import ClusterNode
    from redis.cluster import RedisCluster as SyncCluster

    u = parse_url(url)
    seeds = seed_nodes(u)
    if len(seeds) == 1:
        client = redis.Redis.from_url(_client_url(u), **kwargs)
        try:
            enabled = client.info("cluster").get("cluster_enabled") in (1, "1")
        except ResponseError as exc:
            if "DB index" not in str(exc):  # an ACL user without INFO: not known as a cluster
                return client
            client.close()
            with redis.Redis.from_url(_client_url(_db0(u)), **kwargs) as probe:  # SELECT n>0 on a cluster node?
                if probe.info("cluster").get("cluster_enabled") in (1, "1"):
                    raise BrokerURLError(cluster_db_message(u)) from None
            raise
        except (RedisConnectionError, RedisTimeoutError, OSError):  # down, or refuses us: the next command says so
            return client
        if not enabled:
            return client
        client.close()
    try:
        return SyncCluster.from_url(_client_url(_db0(u)), startup_nodes=[ClusterNode(h, p) for h, p in seeds[1:]],
                                    **kwargs)
    except RedisClusterException as exc:
        raise _cluster_refused(u, exc) from None


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
    u = parse_url(urls if len(urls) > 1 else urls[0])
    seeds = seed_nodes(u)
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
        client: Any = None
        try:
            if len(seeds) > 1:  # several seed nodes: a cluster, found from whichever answers
                return await _cluster(u, seeds, opts)
            if pool_size:
                # a bounded pool: a caller waits up to pool_timeout for a connection instead of
                # opening one per request in flight (2,000 concurrent API requests opened 2,000)
                pool = aioredis.BlockingConnectionPool.from_url(_client_url(u), max_connections=pool_size,
                                                                timeout=pool_timeout, **opts)
                client = aioredis.Redis(connection_pool=pool)
            else:
                client = aioredis.Redis.from_url(_client_url(u), **opts)
            pool = client.connection_pool
            pool.connection_class = _packed(pool.connection_class)
            try:
                info = await client.info("cluster")
            except ResponseError as exc:
                if "DB index" not in str(exc):  # SELECT n>0 on a cluster node?
                    raise
                probe = aioredis.Redis.from_url(_client_url(_db0(u)), **opts)
                try:
                    if (await probe.info("cluster")).get("cluster_enabled") in (1, "1"):
                        raise BrokerURLError(cluster_db_message(u)) from None
                finally:
                    await probe.aclose()
                raise
            if info.get("cluster_enabled") in (1, "1"):
                await client.aclose()
                client = None
                return await _cluster(u, seeds, opts)
            return client
        except RedisClusterException as exc:
            if client is not None:
                await client.aclose()
            refused = _cluster_refused(u, exc)
            if isinstance(refused, BrokerURLError):
                raise refused from None
            last = exc
        except TRANSIENT_ERRORS as exc:
            last = exc
            if client is not None:
                await client.aclose()
        except BaseException:
            if client is not None:
                await client.aclose()
            raise
        delay = min(max_delay, base_delay * 2**attempt)
        delay = delay / 2 + random.random() * delay / 2
        log.warning(
            "broker %s unreachable (%s); retrying in %.1fs (%d/%d)",
            public_url(u), last, delay, attempt + 1, attempts,
        )
        await asyncio.sleep(delay)
    raise BrokerUnavailable(
        f"cannot reach the broker at {public_url(u)} "
        f"after {attempts} attempts: {last}"
    )


async def _cluster(u: URL, seeds: list, opts: dict) -> RedisCluster:
    from redis.asyncio.cluster import ClusterNode

    opts = dict(opts)
    opts.pop("health_check_interval", None)
    # the consumer keeps one blocked XREAD per hash slot it reads
    # (see Consumer._xread_cluster): allow more than the default 100
    opts.setdefault("max_connections", 1000)
    client = RedisCluster.from_url(_client_url(_db0(u)), startup_nodes=[ClusterNode(h, p) for h, p in seeds[1:]],
                                   **opts)
    try:
        await client.initialize()
    except BaseException:
        await client.aclose()
        raise
    return client


def raw_reply(response: Any, **options: Any) -> Any:
    """A reply callback that keeps the reply as the server sent it."""
    return response
