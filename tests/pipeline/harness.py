"""A real pipeline worker process on the test's server, and ways to feed it."""

import asyncio
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterable, Optional

import orjson
import redis

from config.settings import load_settings
from pipeline.topics import EVENTS, event_key, event_topic
from tests.transport.helpers import ROOT, produce_async, wait_until
from pipeline.procs import stop_all
from pipeline.transport import committed as committed_offsets
from pipeline.transport.keys import Keys

PARTITIONS = 4
DEFAULTS = load_settings(env={})  # the categories' priorities, as a worker's config has them
#: the states a record stays in (as far as a test waits)
DONE = ("ACCEPTED", "DELIVERED", "FAILED", "FILTERED", "UNDELIVERED", "REVIEW")


def push_event(biz: str, user: str) -> dict:
    """An order_shipped event to one user, on the push channel."""
    return {"biz_key": biz, "category": "transaction", "template": "order_shipped", "recipients": [user],
            "channels": ["push"], "params": {"order_no": "1", "carrier": "UPS", "tracking_no": "1Z",
                                             "tracking_url": "https://t.example/x"}}


class Pipeline:
    def __init__(self, redis_url: str, tmp: Path, config: str = "receipt_poll_s = 0\n",
                 partitions: int = PARTITIONS, **env: Any) -> None:
        self.url = redis_url
        self.partitions = partitions
        self.tmp = Path(tmp)
        self.db = self.tmp / "records.db"
        (self.tmp / "notify.toml").write_text(config)
        self.env = {
            "NOTIFY_CONFIG": str(self.tmp / "notify.toml"),
            "NOTIFY_BROKER": redis_url,
            "NOTIFY_DATA_DIR": str(self.tmp / "data"),
            "NOTIFY_DB": str(self.db),
            "NOTIFY_PARTITIONS": str(partitions),
            "NOTIFY_LEASE": "3",
            "PYTHONPATH": str(ROOT),
            **{k: str(v) for k, v in env.items()},
        }
        self.procs: list[subprocess.Popen] = []
        self._users_sent: dict[str, int] = {}

    def start(self, name: str = "worker", **env: Any) -> subprocess.Popen:
        log = open(self.tmp / f"{name}.log", "ab")
        proc = subprocess.Popen(
            [sys.executable, "-m", "pipeline.cli", "worker", "-l", "info"],
            cwd=str(ROOT), env=dict(os.environ, **self.env, **{k: str(v) for k, v in env.items()}),
            stdout=log, stderr=subprocess.STDOUT,
        )
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        stop_all(self.procs, 30)

    def log(self, name: str = "worker") -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")

    def settled(self, name: str = "worker") -> bool:
        """The worker is ready after its start's last recovery: it reports ready once,
        takes its slots, recovers again and seeks to the committed offsets, and
        what it read before that seek it reads again after it (a replay)."""
        log = self.log(name)
        seek = log.rfind("Seek stream partitions to committed offsets")
        return seek >= 0 and "Worker ready" in log[seek:]

    # -- feeding ------------------------------------------------------------

    def send(self, topic: str, items: Iterable[tuple[Optional[bytes], bytes]], **kw: Any) -> None:
        asyncio.run(produce_async(self.url, topic, list(items), partitions=self.partitions, **kw))

    def events(self, events: Iterable[dict | bytes], after_users: bool = True) -> None:
        """Send events; first, while a worker runs, wait until the preferences and
        devices sent so far are applied: they are other topics, and nothing orders
        them before the events (a real producer writes the profile first, too)."""
        if after_users and self._users_sent and any(p.poll() is None for p in self.procs):
            self.wait_committed(self._users_sent)
        by_topic: dict[str, list] = {}
        for e in events:
            if isinstance(e, (bytes, bytearray)):
                by_topic.setdefault(EVENTS, []).append((b"bad", bytes(e)))
            else:
                e = dict(e)
                e.setdefault("accepted_at", time.time())
                # where and how the API writes it: OTPs and security alerts on
                # notify.events.high, keyed by the recipient when there is one
                topic = event_topic(DEFAULTS, e.get("category"), e.get("priority"))
                by_topic.setdefault(topic, []).append((event_key(e.get("biz_key", "x"), e.get("recipients")),
                                                       orjson.dumps(e)))
        for topic, items in by_topic.items():
            self.send(topic, items)

    def preferences(self, prefs: Iterable[dict]) -> None:
        items = [(p["user_id"].encode(), orjson.dumps(p)) for p in prefs]
        self.send("notify.preferences", items)
        self._users_sent["notify.preferences"] = self._users_sent.get("notify.preferences", 0) + len(items)

    def devices(self, updates: Iterable[dict]) -> None:
        items = [(u["user_id"].encode(), orjson.dumps(u)) for u in updates]
        self.send("notify.devices", items)
        self._users_sent["notify.devices"] = self._users_sent.get("notify.devices", 0) + len(items)

    # -- reading ------------------------------------------------------------

    def committed(self, topic: str, group: str = "notify") -> int:
        """Entries of ``topic`` committed by the group, over all partitions."""
        r = redis.Redis.from_url(self.url)
        try:
            offsets = committed_offsets.read_all_sync(r, Keys(), group)
        finally:
            r.close()
        prefix = topic.encode() + b"|"
        return sum(int(v) for k, v in offsets.items() if k.startswith(prefix) and not k.endswith(b"@"))

    def written(self, topic: str) -> int:
        """Entries ever written to ``topic``, over all partitions (its offset counters)."""
        r = redis.Redis.from_url(self.url)
        try:
            return sum(int(v or 0) for v in r.mget([Keys().counter(topic, p) for p in range(self.partitions)]))
        finally:
            r.close()

    def wait_committed(self, counts: dict[str, int], timeout: float = 60, group: str = "notify") -> None:
        """Until every topic in ``counts`` has that many entries committed (applied)."""
        wait_until(lambda: all(self.committed(t, group) >= n for t, n in counts.items()), timeout, 0.2,
                   f"committed {counts} by {group}")

    def rows(self) -> dict[tuple[str, str, str], dict]:
        if not self.db.exists():
            return {}
        con = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=5)
        con.row_factory = sqlite3.Row
        try:
            return {(r["biz_key"], r["user_id"], r["channel"]): dict(r) for r in con.execute("SELECT * FROM notify_record")}
        except sqlite3.OperationalError:
            return {}
        finally:
            con.close()

    def attempts(self) -> dict[str, int]:
        if not self.db.exists():
            return {}
        con = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=5)
        try:
            return dict(con.execute("SELECT delivery_id, count(*) FROM attempts GROUP BY delivery_id").fetchall())
        except sqlite3.OperationalError:
            return {}
        finally:
            con.close()

    def device_rows(self) -> dict[str, dict]:
        """The device deliveries (push to each device of a user), by delivery id."""
        con = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=5)
        con.row_factory = sqlite3.Row
        try:
            return {r["delivery_id"]: dict(r) for r in con.execute("SELECT * FROM device_deliveries")}
        except sqlite3.OperationalError:
            return {}
        finally:
            con.close()

    def wait_decided(self, keys: Iterable[tuple[str, str, str]], timeout: float = 60,
                     what: str = "all decided") -> dict:
        """The records, once those of ``keys`` ((biz_key, user_id, channel)) are all in a :data:`DONE` state."""
        keys = list(keys)
        return self.wait_rows(lambda r: all(r.get(k, {}).get("status") in DONE for k in keys), timeout, what)

    def wait_rows(self, cond, timeout: float = 60, what: str = "") -> dict:
        last: dict = {}

        def check():
            last["rows"] = self.rows()
            return last["rows"] if cond(last["rows"]) else None

        try:
            return wait_until(check, timeout, 0.2, what)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; records: {last.get('rows')}") from None
