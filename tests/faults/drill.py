"""The fault drills' harness: a real server, the provider simulators in a process
of their own (their state and call ledger outlive the workers), real worker
processes, and the checks every scenario shares.

Sizes (environment):

``NOTIFY_FAULT_EVENTS``   events of the kill -9 drill (default 5,000; the issue's
                          full size is 50,000); the other drills use a fraction
``NOTIFY_FAULT_DOWN_S``   how long a provider is down (default 10 s; full: 60)
``NOTIFY_FAULT_FULL=1``   the issue's sizes for both (explicit values still win)
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import redis

from adapters.simulators import read_ledger
from pipeline.embedded import EmbeddedRedis
from pipeline.ids import delivery_id
from pipeline.reader import outcome_values
from pipeline.transport.groups import entry_changes
from pipeline.transport.keys import Keys
from tests.pipeline.harness import PARTITIONS, Pipeline
from tests.transport.helpers import ROOT
from pipeline.transport import committed

from .workload import Workload, devices_of, prefs_of, wire
from pipeline.procs import stop_process

FULL = os.environ.get("NOTIFY_FAULT_FULL", "") not in ("", "0")
EVENTS = int(os.environ.get("NOTIFY_FAULT_EVENTS") or (50_000 if FULL else 5_000))
DOWN_S = float(os.environ.get("NOTIFY_FAULT_DOWN_S") or (60 if FULL else 10))

TERMINAL = {"ACCEPTED", "DELIVERED", "UNDELIVERED", "FILTERED", "FAILED", "REVIEW"}
GROUP = "notify"
K = Keys()
LEASE_S = 3.0
PROVIDER_TIMEOUT_S = 2.0


def sizes() -> dict[str, Any]:
    return {"events": EVENTS, "down_s": DOWN_S, "full": FULL}


# --------------------------------------------------------------------------- simulators


class Sims:
    """``python -m adapters.simulators`` in its own process, with a ledger file."""

    def __init__(self, workdir: Path) -> None:
        self.dir = Path(workdir)
        self.ledger_path = self.dir / "ledger.jsonl"
        self.info_path = self.dir / "sims.json"
        self.proc: Optional[subprocess.Popen] = None
        self.info: dict = {}

    def start(self) -> "Sims":
        self.dir.mkdir(parents=True, exist_ok=True)
        log = open(self.dir / "sims.log", "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "adapters.simulators", "--clean", "--seed", "1", "--hang-s", "30",
             "--ledger", str(self.ledger_path), "--info", str(self.info_path)],
            cwd=str(ROOT), env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.DEVNULL, stderr=log,
        )
        deadline = time.monotonic() + 30
        while not self.info_path.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"simulators did not start: {(self.dir / 'sims.log').read_text()[-2000:]}")
            time.sleep(0.05)
        self.info = json.loads(self.info_path.read_text())
        return self

    def url(self, sim: str) -> str:
        return {"twilio": self.info["twilio"]["base_url"], "smsvendor": self.info["smsvendor"]["base_url"],
                "fcm": self.info["fcm"]["base_url"]}[sim]

    def mode(self, sim: str, **spec: Any) -> dict:
        """Set a simulator's runtime mode (``mode="down"|"slow"|"timeout"|"ok"``, ...)."""
        req = urllib.request.Request(self.url(sim) + "/_sim/mode", data=json.dumps(spec).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=5) as resp:
            return json.loads(resp.read())

    def ledger(self) -> list[dict]:
        return read_ledger(str(self.ledger_path))

    def stop(self) -> None:
        if self.proc:
            stop_process(self.proc, 10)


# --------------------------------------------------------------------------- the drill


#: the drills' config: no receipt polls, and marketing without its sliding windows
#: (one per 10 minutes): the workloads send up to three per user, under the daily
#: limit, and expect each sent; the drills are about faults, the caps have their
#: own tests (tests/rules/test_rule_guard.py, the reference-model test)
DRILL_CONFIG = "receipt_poll_s = 0\n[categories.marketing]\nrate_windows = []\n"


class Drill:
    """One scenario's world: its own server, simulators and workers in ``workdir``."""

    def __init__(self, workdir: Path, *, workers: int = 2, config: str = DRILL_CONFIG,
                 server: Optional[EmbeddedRedis] = None, **env: Any) -> None:
        self.dir = Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.server = server or EmbeddedRedis(self.dir / "redis").start()
        try:
            self.sims = Sims(self.dir / "sims").start()
        except BaseException:
            self.server.stop()
            raise
        self.workers = workers
        self.pipe = Pipeline(
            self.server.url, self.dir, config,
            NOTIFY_PROVIDERS="simulators", NOTIFY_SIMULATORS=str(self.sims.info_path),
            NOTIFY_PROVIDER_TIMEOUT=PROVIDER_TIMEOUT_S, NOTIFY_WORKERS=workers, NOTIFY_LEASE=LEASE_S, **env,
        )
        self.names: dict[int, str] = {}  # pid → log name
        self._users = (0, 0)
        self.fed = 0
        self._n = 0
        self.r = redis.Redis.from_url(self.server.url)

    # -- processes ----------------------------------------------------------

    def start_worker(self, index: int, **env: Any) -> subprocess.Popen:
        self._n += 1
        name = f"w{index}-{self._n}"
        proc = self.pipe.start(name, NOTIFY_WORKER_INDEX=index, **env)
        self.names[proc.pid] = name
        return proc

    def start_all(self, **env: Any) -> list[subprocess.Popen]:
        return [self.start_worker(i, **env) for i in range(self.workers)]

    def live(self) -> list[subprocess.Popen]:
        return [p for p in self.pipe.procs if p.poll() is None]

    def log(self, proc: subprocess.Popen) -> str:
        return self.pipe.log(self.names[proc.pid])

    def slots_of(self, proc: subprocess.Popen) -> list[int]:
        """The slots the worker says it holds (its last rebalance), from its log."""
        found = re.findall(r"generation \d+: slots \[([0-9, ]*)\] of \d+", self.log(proc))
        return [int(x) for x in found[-1].split(",") if x.strip()] if found else []

    def kill9(self, proc: subprocess.Popen) -> None:
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    def stop(self) -> None:
        for p in self.pipe.procs:
            if p.poll() is None:
                try:
                    p.send_signal(signal.SIGCONT)
                except ProcessLookupError:
                    pass
        self.pipe.stop()
        self.sims.stop()
        self.r.close()
        self.server.stop()

    # -- feeding ------------------------------------------------------------

    def seed_users(self, w: Workload) -> None:
        """Preferences and devices on their topics (before any worker starts;
        :meth:`wait_users` then waits until the tables hold them)."""
        self.pipe.preferences([prefs_of(u) for u in w.users.values()])
        devs = devices_of(w.users)
        if devs:
            self.pipe.devices(devs)
        self._users = (len(w.users), len({d["user_id"] for d in devs}))

    def changelog_len(self, table: str) -> int:
        """The changes a table's changelog holds (a group entry counts as the changes it lists)."""
        topic = f"{GROUP}-{table}-changelog"
        return sum(len(entry_changes(f)) for p in range(PARTITIONS) for _id, f in self.r.xrange(K.stream(topic, p)))

    def wait_users(self, timeout: float = 60) -> None:
        """Until the workers applied every preference and device update (the
        tables' changelogs hold them): events sent earlier would find no address."""
        prefs, devs = self._users
        t0 = time.monotonic()
        while self.changelog_len("preferences") < prefs or self.changelog_len("devices") < devs:
            if time.monotonic() - t0 > timeout:
                raise AssertionError("the workers did not apply the users' preferences in time")
            time.sleep(0.1)

    def feed(self, events: list[dict], chunks: int = 1, pause_s: float = 0.0) -> None:
        """Send ``events`` in ``chunks``, ``pause_s`` apart; ``self.fed`` counts them."""
        size = max(1, -(-len(events) // chunks))
        for i in range(0, len(events), size):
            self.pipe.events([wire(e) for e in events[i:i + size]])
            self.fed = i + len(events[i:i + size])
            if pause_s and i + size < len(events):
                time.sleep(pause_s)

    def feed_in_background(self, events: list[dict], chunks: int, pause_s: float) -> threading.Thread:
        t = threading.Thread(target=self.feed, args=(events, chunks, pause_s), daemon=True)
        t.start()
        return t

    # -- reading ------------------------------------------------------------

    def _sql(self, sql: str, args: tuple = ()) -> list:
        if not self.pipe.db.exists():
            return []
        con = sqlite3.connect(f"file:{self.pipe.db}?mode=ro", uri=True, timeout=10)
        try:
            return con.execute(sql, args).fetchall()
        except sqlite3.OperationalError:
            return []
        finally:
            con.close()

    def count_terminal(self) -> int:
        marks = ",".join("?" * len(TERMINAL))
        rows = self._sql(f"SELECT count(*) FROM notify_record WHERE status IN ({marks})", tuple(TERMINAL))
        return rows[0][0] if rows else 0

    def records(self) -> dict[tuple[str, str, str], tuple[str, Optional[str]]]:
        rows = self._sql("SELECT biz_key, user_id, channel, status, reason FROM notify_record")
        return {(b, u, c): (s, r) for b, u, c, s, r in rows}

    def wait_settled(self, expected: dict, timeout: float, stall_s: float = 60.0,
                     extra: Callable[[], bool] = lambda: True) -> float:
        """Wait until every expected record is there in a terminal state (or progress
        stalls for ``stall_s``); returns the seconds waited."""
        t0 = last_move = time.monotonic()
        last = -1
        want = len(expected)
        while True:
            n = self.count_terminal()
            if n != last:
                last, last_move = n, time.monotonic()
            if n >= want:
                got = self.records()
                if all(got.get(k, ("PENDING",))[0] in TERMINAL for k in expected) and extra():
                    return time.monotonic() - t0
            now = time.monotonic()
            if now - t0 > timeout or now - last_move > stall_s:
                return time.monotonic() - t0
            time.sleep(0.5 if want < 20000 else 1.5)

    def dead_letters(self, source: Optional[str] = "expand") -> list[dict]:
        """The dead letters of ``source`` (None: all)."""
        out = []
        for p in range(PARTITIONS):
            for _id, f in self.r.xrange(K.stream("notify.dlq", p)):
                d = json.loads(f[b"v"])
                if source is None or d.get("source") == source:
                    out.append(d)
        return out

    def trace(self, *needles: str) -> dict[str, Any]:
        """``"<topic>|<p>"`` → how many entries of that stream mention every one of
        ``needles`` (a lost record's business key and user), or for an outcome
        stream the channel, state and reason of each: where its work went."""
        want = [n.encode() for n in needles]
        out: dict[str, Any] = {}
        for key in self.r.scan_iter(match="nfs:{notify*:s", count=1000):
            found = []
            outcomes = key.startswith(b"nfs:{notify.outcomes")
            for _id, f in self.r.xrange(key):
                # an outcome entry may hold several outcomes of one user (docs/SCHEMA.md)
                for blob in (outcome_values(f.get(b"v")) if outcomes else
                             [b" ".join(v for v in f.values() if isinstance(v, bytes))]):
                    if blob and all(w in blob for w in want):
                        found.append(blob)
            if found:
                name = key.decode().split("{", 1)[1].split("}", 1)[0]
                # an outcome says its channel and state: which ones were published
                out[name] = [" ".join(str(m.get(k)) for k in ("channel", "state", "reason")) for m in map(_json_in, found)
                             ] if name.startswith("notify.outcomes") else len(found)
        return out

    def committed_by(self) -> dict[str, tuple[int, str]]:
        """``"<topic>|<p>"`` → (committed offset, token of the committer)."""
        raw = {k.decode(): v.decode() for k, v in committed.read_all_sync(self.r, K, GROUP).items()}
        return {f: (int(v), raw.get(f + "@", "")) for f, v in raw.items() if not f.endswith("@")}


def _json_in(blob: bytes) -> dict:
    """The JSON object inside an entry's fields (joined), or {}."""
    i, j = blob.find(b"{"), blob.rfind(b"}")
    try:
        return json.loads(blob[i:j + 1]) if i >= 0 else {}
    except ValueError:
        return {}


# --------------------------------------------------------------------------- checks


@dataclass
class Verdict:
    """What a drill found, against the model and the providers' ledger."""

    expected: int = 0
    lost: list = field(default_factory=list)  # expected, missing or not terminal
    wrong: list = field(default_factory=list)  # terminal but not what the model says
    extra: list = field(default_factory=list)  # records nobody asked for
    reconciled: int = 0  # records ACCEPTED "reconciled" (an UNKNOWN answered by a query)
    reconciled_not_received: int = 0  # a query said "not found", then a send (the ledger)
    review: int = 0  # sent to REVIEW: fate unknown after a crash, the protocol has no query
    review_taken: int = 0  # of those, the provider did take the message (ledger)
    calls: int = 0  # provider send calls
    accepted_calls: int = 0
    duplicated: list = field(default_factory=list)  # deliveries the providers took more than once
    duplicated_allowed: list = field(default_factory=list)  # ... after a query said "not found"
    absorbed: int = 0  # resends a provider de-duplicated (vendor client_ref)
    unknown_calls: int = 0  # sends that hung (accepted, no answer)
    queries: int = 0
    resent_after_unknown: list = field(default_factory=list)  # a send after an UNKNOWN without a query between
    calls_for_filtered: list = field(default_factory=list)  # provider calls for what the model filtered

    @property
    def ok(self) -> bool:
        return not (self.lost or self.wrong or self.extra or self.duplicated or self.resent_after_unknown
                    or self.calls_for_filtered)

    def problems(self) -> str:
        parts = []
        for name in ("lost", "wrong", "extra", "duplicated", "resent_after_unknown", "calls_for_filtered"):
            v = getattr(self, name)
            if v:
                parts.append(f"{name}: {len(v)} e.g. {v[:5]}")
        return "; ".join(parts)

    def figures(self) -> dict[str, Any]:
        return {
            "expected records": self.expected, "lost": len(self.lost), "wrong state": len(self.wrong),
            "extra records": len(self.extra), "provider calls": self.calls, "accepted calls": self.accepted_calls,
            "duplicated provider calls": len(self.duplicated),
            "duplicates after 'not found'": len(self.duplicated_allowed),
            "resends absorbed by provider dedup": self.absorbed, "UNKNOWN (accepted, no answer)": self.unknown_calls,
            "UNKNOWN reconciled": self.reconciled,
            "UNKNOWN reconciled as not received (resent after a \"not found\")": self.reconciled_not_received,
            "reconciliation queries": self.queries,
            "sent to REVIEW": self.review, "REVIEW the provider had taken": self.review_taken,
        }


def _not_found(row: dict) -> bool:
    if row.get("op") != "query":
        return False
    return row.get("found") == 0 or row.get("status") == 404


def verify(expected: dict, got: dict, ledger: list[dict], *,
           may_review: bool = False, may_reconcile: bool = True) -> Verdict:
    """Records ``got`` against the model's ``expected``, and the ledger's provider
    calls against "at most one per delivery unless an UNKNOWN was reconciled as not
    received". ``may_review``: a delivery caught in flight by a crash may end in
    REVIEW (its provider has no status query); ``may_reconcile``: ACCEPTED may say
    "reconciled" where the model has no reason (a crash left it "calling")."""
    v = Verdict(expected=len(expected))
    by_did = {delivery_id(b, u, c): (b, u, c) for (b, u, c) in expected}
    for k, want in expected.items():
        have = got.get(k)
        if have is None or have[0] not in TERMINAL:
            v.lost.append((k, have, want))
            continue
        if have == want:
            if have == ("ACCEPTED", "reconciled"):
                v.reconciled += 1
            continue
        if want == ("ACCEPTED", None) and have == ("ACCEPTED", "reconciled") and may_reconcile:
            v.reconciled += 1
        elif want[0] == "ACCEPTED" and have[0] == "REVIEW" and may_review:
            v.review += 1
        else:
            v.wrong.append((k, have, want))
    v.extra = [k for k in got if k not in expected]

    rows_by_key: dict[str, list[dict]] = defaultdict(list)
    for row in ledger:
        if row.get("op") in ("send", "query") and row.get("key"):
            rows_by_key[row["key"]].append(row)
    review_keys = {delivery_id(*k) for k, have in got.items() if have[0] == "REVIEW"}
    for key, rows in rows_by_key.items():
        rows.sort(key=lambda r: (r["t"], r["seq"]))
        sends = [r for r in rows if r["op"] == "send"]
        v.calls += len(sends)
        v.queries += sum(1 for r in rows if r["op"] == "query")
        taken = [r for r in sends if r.get("accepted") and not r.get("duplicate")]
        v.accepted_calls += len(taken)
        v.absorbed += sum(1 for r in sends if r.get("duplicate"))
        v.unknown_calls += sum(1 for r in sends if r.get("status") == "hang")
        nf = [r["t"] for r in rows if _not_found(r)]
        if nf and any(r["t"] >= nf[0] for r in taken):
            v.reconciled_not_received += 1
        if key in review_keys and taken:
            v.review_taken += 1
        k = by_did.get(key)
        if k is not None and expected[k][0] == "FILTERED":
            v.calls_for_filtered.append((k, len(sends)))
        if len(taken) > 1:
            # what the promise allows: a resend decided after a query said "not found"
            # (the UNKNOWN was reconciled as not received), whatever then landed first
            told = any(_not_found(r) and r["t"] <= taken[-1]["t"] for r in rows)
            (v.duplicated_allowed if told else v.duplicated).append((k or key, [r["sim"] for r in taken]))
        # after a send that hung (the provider took it, no answer), the next send of
        # that delivery must come after a query
        for i, r in enumerate(rows):
            if r["op"] == "send" and r.get("status") == "hang":
                nxt = rows[i + 1:]
                later_send = next((x for x in nxt if x["op"] == "send"), None)
                if later_send is not None and not any(x["op"] == "query" for x in nxt[:nxt.index(later_send)]):
                    v.resent_after_unknown.append((k or key, r["sim"], later_send["sim"]))
    return v


def bad_events_dead_lettered(drill: Drill, w: Workload) -> tuple[int, int]:
    """(bad events sent, distinct bad payloads in the dead-letter stream)."""
    bad = {e["raw"].decode() for e in w.events if e.get("_bad")}
    got = {d["payload"] for d in drill.dead_letters("expand")}
    return len(bad), len(bad & got)
