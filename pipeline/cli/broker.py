"""The broker every command uses, and the data directory of ``notify run``.

The broker is ``NOTIFY_BROKER`` (set by ``notify run`` for its children), else
``REDIS_URL``, else ``data/broker.url``: the broker of the running ``notify run``,
the embedded server it started with the password it generated or the ``REDIS_URL``
it was given (a Redis Cluster's too; the file is its user's only, mode 0600). Files
are created with umask 0o077; ``notify run`` holds ``data/notify.lock`` while it runs.

Every command uses the key namespace of the URL's ``prefix=`` (default ``nfs``),
as the workers and the API do: :func:`broker_keys`.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

__all__ = ["CLIError", "NoBroker", "current_settings", "broker_file", "broker_url", "checked_url", "redis_client",
           "broker_keys", "probe_broker", "write_private", "private_data_dir", "lock_data_dir"]


class CLIError(Exception):
    pass


class NoBroker(CLIError):
    """No broker configured and no `notify run` running (``notify demo`` starts one)."""


def current_settings():
    from config.settings import load_settings

    return load_settings()


def broker_file(settings) -> Path:
    return Path(settings.data_dir) / "broker.url"


def broker_url(settings=None) -> str:
    """The broker URL every command uses, checked (a bad one is a one-line error
    naming where it came from, without its password)."""
    settings = settings or current_settings()
    if settings.env.broker:
        url, source = settings.env.broker, "NOTIFY_BROKER"
    elif settings.redis_url:
        url, source = settings.redis_url, "REDIS_URL"
    else:
        f = broker_file(settings)
        if not f.exists():
            raise NoBroker("no broker: set REDIS_URL, or start `notify run` first (it writes data/broker.url)")
        try:
            url, source = f.read_text().strip(), str(f)
        except (OSError, UnicodeDecodeError) as exc:
            raise CLIError(f"cannot read {f}: {exc}") from None
    return checked_url(url, source)


def checked_url(url: str, source: str) -> str:
    from pipeline.transport.client import BrokerURLError, parse_url

    try:
        parse_url(url)
    except BrokerURLError as exc:
        raise CLIError(f"{source}: {exc}") from None
    return url


def redis_client(url: str):
    """A client for the broker: a ``RedisCluster`` on a cluster (pipeline/transport/client.py)."""
    from pipeline.transport.client import sync_client

    return sync_client(url)


def broker_keys(url: str):
    """The transport's key layout in the URL's namespace (``?prefix=``, default ``nfs``)."""
    from pipeline.transport.client import parse_url
    from pipeline.transport.keys import Keys

    return Keys(parse_url(url).query.get("prefix") or "nfs")


def probe_broker(url: str) -> None:
    """A broker URL that cannot work is refused before anything starts (a database
    other than 0 on a Redis Cluster); a broker that does not answer yet is waited for
    by the workers, as before."""
    from pipeline.transport.client import BrokerUnavailable

    try:
        redis_client(url).close()
    except BrokerUnavailable:
        pass


def write_private(path: Path, text: str) -> None:
    """``text`` in ``path``, readable by this user only (mode 0600), replaced at once."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def private_data_dir(settings) -> Path:
    """The data directory, created 0700; what an earlier version left readable to
    other users (the directory 0755, records.db 0644, the AOF) made this user's only."""
    data = Path(settings.data_dir)
    data.mkdir(mode=0o700, parents=True, exist_ok=True)
    db = Path(settings.db_path)
    redis_dir = data / "redis"
    aof = redis_dir / "appendonlydir"
    dirs = [data, redis_dir, aof, data / "worker"]
    files = [data / "broker.url", data / "api_keys.json", data / "simulators.json", redis_dir / "server.log",
             redis_dir / "server.conf", db, Path(f"{db}-wal"), Path(f"{db}-shm"), Path(f"{db}-journal")]
    if aof.is_dir() and not aof.is_symlink():
        files += list(aof.iterdir())
    for path, mode in [(d, 0o700) for d in dirs] + [(f, 0o600) for f in files]:
        try:
            if path.is_symlink() or not path.exists() or path.stat().st_uid != os.getuid():
                continue
            if (path.stat().st_mode & 0o777) & ~mode:
                os.chmod(path, mode)
        except OSError:
            continue
    return data


def lock_data_dir(data: Path) -> int:
    """An exclusive lock on ``data/notify.lock`` for as long as the returned file
    descriptor (and any process it was passed to) lives: one ``notify run`` per data
    directory. The kernel drops it when the holders exit, ``kill -9`` included."""
    path = data / "notify.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode("ascii", "replace").strip()
        os.close(fd)
        pid = holder if holder.isdigit() else "?"
        raise CLIError(f"{data} is in use by another `notify run` (pid {pid}) or the broker it started; "
                       f"one `notify run` per data directory (stop it, or set NOTIFY_DATA_DIR)") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd
