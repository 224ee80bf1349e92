"""Helpers for transport tests: real worker processes and an in-process producer."""

import asyncio
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

import faust

from pipeline.procs import stop_process

ROOT = Path(__file__).resolve().parents[2]


class Worker:
    """``faust worker`` for tests/transport/worker_app.py in its own process."""

    def __init__(self, broker: str, log_dir: Path, name: str = "w", **env: Any) -> None:
        self.broker = broker
        self.log_path = Path(log_dir) / f"{name}.log"
        self.env = {k: str(v) for k, v in env.items()}
        self.name = name
        self.proc: Optional[subprocess.Popen] = None

    def start(self) -> "Worker":
        env = dict(os.environ, BROKER=self.broker, PYTHONPATH=str(ROOT), **self.env)
        env.setdefault("DATADIR", str(self.log_path.parent / f"data-{self.name}"))
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "faust", "-A", "tests.transport.worker_app", "worker", "-l", "info", "--without-web"],
            cwd=str(ROOT), env=env, stdout=self._log, stderr=subprocess.STDOUT,
        )
        return self

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            stop_process(self.proc, timeout)
        self._log.close()
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def wait_until(cond: Callable[[], Any], timeout: float = 30.0, interval: float = 0.1, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or cond}")
        time.sleep(interval)


async def produce_async(
    broker: str, topic: str, items: Iterable[tuple[Optional[bytes], Optional[bytes]]], *,
    partitions: int = 4, headers: Any = None, partition: Optional[int] = None,
) -> list:
    app = faust.App(f"producer-{uuid.uuid4().hex[:6]}", broker=broker, topic_partitions=partitions, web_enabled=False)
    producer = app.producer
    await producer.start()
    try:
        await app.transport.declare(topic, partitions)
        futs = [await producer.send(topic, k, v, partition, None, headers) for k, v in items]
        return list(await asyncio.gather(*futs))
    finally:
        await producer.stop()
        await app.transport.close()


def produce(broker: str, topic: str, items: Iterable, **kw: Any) -> list:
    return asyncio.run(produce_async(broker, topic, list(items), **kw))


def numbers(start: int, stop: int) -> list[tuple[bytes, bytes]]:
    return [(f"k{i % 37}".encode(), str(i).encode()) for i in range(start, stop)]


def seen(r: Any) -> list[tuple[int, int, int]]:
    return [tuple(int(x) for x in s.split(b":")) for s in r.lrange("seen", 0, -1)]
