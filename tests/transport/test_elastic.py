"""Elastic workers (``?members=dynamic``): dynamic membership, the eager protocol,
expulsion and fencing by generation, standbys, and scaling a running group."""

import asyncio
import json
import os
import signal
import threading
import time

import pytest
import redis

from pipeline.transport.keys import Keys
from pipeline.transport.membership import Membership, format_group, read_group_sync
from pipeline.transport.scripts import COMMIT_PART, PRODUCE, SET_COMMIT_FENCE, SET_FENCE
from pipeline.transport.committed import read_all_sync

from .helpers import Worker, produce, wait_until

K = Keys()


async def _assign(r, leader, gen, plan):
    """Write an assignment: plan = {member: [(topic, p), ...]}."""
    assignments = {m: json.dumps({"actives": {}, "standbys": {}}) for m in plan}
    fences = {f"{t}|{p}": f"{m}:{gen}" for m, tps in plan.items() for t, p in tps}
    return await leader.write_assignment(r, gen, assignments, fences)


async def test_membership_generations_expulsion_and_fencing(redis_url):
    r = redis.asyncio.Redis.from_url(redis_url)
    a = Membership(K, "g", lease_s=0.4, sync_s=5, member_id="a")
    b = Membership(K, "g", lease_s=0.4, sync_s=5, member_id="b")
    g1 = await a.join(r, ["x"])
    assert g1 == 1 and await a.join(r, ["x"]) == 1  # same subscription: no new generation
    assert await a.ack(r, g1) == 1
    assert await _assign(r, a, g1, {"a": [("x", 0), ("x", 1)]})
    assert not await _assign(r, a, g1, {"a": [("x", 0)]})  # written once per generation
    g2 = await b.join(r, ["x"])
    assert g2 == 2
    # the old owner still commits (its revoke) until the new assignment is applied
    commit, copy = r.register_script(COMMIT_PART), r.register_script(SET_COMMIT_FENCE)
    ck = [K.commits("g", 0), K.commit_fence("g", 0)]
    assert await commit(keys=ck, args=[1, "x|0", 5, "x|0", "a:1", 1]) == 1
    assert not await _assign(r, a, g2, {"a": [("x", 0)], "b": [("x", 1)]})  # nobody acknowledged yet
    assert await a.ack(r, g2) == 1
    assert not await _assign(r, a, g2, {"a": [("x", 0)], "b": [("x", 1)]})  # b did not
    assert await b.ack(r, 1) == 0  # a stale generation is refused
    assert await b.ack(r, g2) == 1
    assert await _assign(r, a, g2, {"a": [("x", 0)], "b": [("x", 1)]})
    # b applies generation 2: it copies its token next to x|1's commits before it reads them
    ck1 = [K.commits("g", 1), K.commit_fence("g", 1)]
    assert await copy(keys=[K.commit_fence("g", 1)], args=["x|1", "b:2", 2]) == 1
    with pytest.raises(redis.exceptions.ResponseError, match="FENCED"):
        await commit(keys=ck1, args=[1, "x|1", 7, "x|1", "a:1", 1])  # the old generation's token
    assert await commit(keys=ck1, args=[1, "x|1", 7, "x|1", "b:2", 2]) == 1
    st = read_group_sync(redis.Redis.from_url(redis_url), K, "g")
    assert st.gen == 2 and st.members == ["a", "b"] and st.assign_gen == 2 and st.rebalances == 2
    shown = format_group(st)  # `notify status`
    assert "group generation 2: 2 members, leader a, 2 rebalances" in shown
    assert "  member a" in shown and "  member b" in shown
    # b stops heartbeating (SIGSTOP): a's heartbeat expels it and bumps the generation
    await asyncio.sleep(0.5)
    status, gen, agen = await a.heartbeat(r)
    assert status == 1 and gen == 3 and agen == 2
    # expelled: refused once x|1's next owner copied its token next to the commits, which it
    # does before it reads them (the window before that: docs/adr/0004-group-state-by-partition.md)
    assert await copy(keys=[K.commit_fence("g", 1)], args=["x|1", "a:3", 3]) == 1
    with pytest.raises(redis.exceptions.ResponseError, match="FENCED"):
        await commit(keys=ck1, args=[1, "x|1", 9, "x|1", "b:2", 2])
    assert (await b.heartbeat(r))[0] == -1
    assert await b.ack(r, 3) == -1
    # a changelog fence never moves back to an older generation
    fence = r.register_script(SET_FENCE)
    assert await fence(keys=[K.fence("cl", 1)], args=["a:3", 3]) == 1
    assert await fence(keys=[K.fence("cl", 1)], args=["b:2", 2]) == 0
    produce_script = r.register_script(PRODUCE)
    skeys = [K.stream("cl", 1), K.counter("cl", 1), K.fence("cl", 1)]
    with pytest.raises(redis.exceptions.ResponseError, match="FENCED"):
        await produce_script(keys=skeys, args=["b:2", 1, "1.0", 3, b"k", b"v", 0])
    # a member that does not acknowledge before the sync deadline is expelled
    c = Membership(K, "g", lease_s=5, sync_s=0.3, member_id="c")
    a.sync_ms = 300
    g4 = await c.join(r, ["x"])
    assert await a.ack(r, g4) == 1
    await asyncio.sleep(0.4)
    status, gen, _ = await a.heartbeat(r)
    assert status == 1 and gen == g4 + 1
    assert (await c.heartbeat(r))[0] == -1
    # leaving bumps the generation
    await a.leave(r)
    assert read_group_sync(redis.Redis.from_url(redis_url), K, "g").gen == g4 + 2
    await r.aclose()


def group(r, name="t"):
    return read_group_sync(r, K, name)


def actives(st):
    """member → set of active (topic, partition) of the written assignment."""
    out = {}
    for m, raw in st.assignments.items():
        a = json.loads(raw)
        out[m] = {(t, p) for t, ps in a["actives"].items() for p in ps}
    return out


def standbys(st):
    out = {}
    for m, raw in st.assignments.items():
        a = json.loads(raw)
        out[m] = {(t, p) for t, ps in a["standbys"].items() for p in ps if t.endswith("-changelog")}
    return out


def settled(r, n, name="t"):
    """The group has n members and the assignment of its current generation."""
    st = group(r, name)
    return st if len(st.live) == n and st.assign_gen == st.gen and len(st.assignments) == n else None


def ops_items(ops):
    return [(k.encode(), json.dumps(op).encode()) for k, op in ops]


def test_join_and_leave_rebalance_with_standbys(redis_url, redis_sync, tmp_path):
    url = redis_url + "?members=dynamic&lease=1.5&compact=0"
    a = Worker(url, tmp_path, "a", PARTITIONS=4).start()
    b = c = None
    try:
        st = wait_until(lambda: settled(redis_sync, 1), 60, what="a alone")
        (only,) = st.members
        assert {p for t, p in actives(st)[only] if t == "ops"} == {0, 1, 2, 3}
        b = Worker(url, tmp_path, "b", PARTITIONS=4).start()
        st = wait_until(lambda: settled(redis_sync, 2), 60, what="a and b")
        act, stb = actives(st), standbys(st)
        ops_parts = [{p for t, p in act[m] if t == "ops"} for m in st.members]
        assert sorted(len(x) for x in ops_parts) == [2, 2] and not (ops_parts[0] & ops_parts[1])
        # each member keeps a standby of the other's table partitions (table_standby_replicas=1)
        for m in st.members:
            mine = {p for t, p in act[m] if t == "t-kv-changelog"}
            assert mine and {p for t, p in stb[m] if t == "t-kv-changelog"} == {0, 1, 2, 3} - mine
        # the group fence hash holds "<topic>|<p>" → "<member>:<gen>" of every active partition
        fence = {k.decode(): v.decode() for k, v in redis_sync.hgetall(K.group_fence("t")).items()}
        for m in st.members:
            for t, p in act[m]:
                assert fence[f"{t}|{p}"] == f"{m}:{st.gen}"
        # events are processed while the group changes
        produce(redis_url, "ops", ops_items([(f"k{i}", {"op": "set", "v": i, "i": i}) for i in range(200)]))
        wait_until(lambda: redis_sync.scard("ops-seen") >= 200, 60, what="200 processed")
        gen_before = st.gen
        assert b.stop() == 0  # a clean leave: the generation moves on at once
        st = wait_until(lambda: settled(redis_sync, 1), 30, what="b left")
        assert st.gen > gen_before and st.expelled == 0
        assert {p for t, p in actives(st)[st.members[0]] if t == "ops"} == {0, 1, 2, 3}
        produce(redis_url, "ops", ops_items([(f"k{i}", {"op": "set", "v": i, "i": i}) for i in range(200, 400)]))
        wait_until(lambda: redis_sync.scard("ops-seen") >= 400, 60, what="400 processed")
    finally:
        for w in (a, b, c):
            if w is not None:
                w.kill()
    assert "Traceback" not in a.log(), a.log()[-4000:]


class AuditWatcher(threading.Thread):
    """Polls the committed offsets of ``ops`` and who committed them: offsets must
    never move backwards, and the committing generation never goes back either."""

    def __init__(self, url, topic="ops"):
        super().__init__(daemon=True)
        self.r = redis.Redis.from_url(url)
        self.topic = topic.encode()
        self.problems = []
        self.stop_flag = False
        self.tokens = {}

    def run(self):
        last_off, last_gen = {}, {}
        while not self.stop_flag:
            h = read_all_sync(self.r, K, "t")
            for f, v in h.items():
                if not f.startswith(self.topic + b"|"):
                    continue
                if f.endswith(b"@"):
                    p, gen = f[:-1], int(v.rsplit(b":", 1)[1])
                    if gen < last_gen.get(p, 0):
                        self.problems.append(("commit by an older generation", p, last_gen[p], gen))
                    last_gen[p] = max(gen, last_gen.get(p, 0))
                    seen_tokens = self.tokens.setdefault(p, [])
                    if v.decode() not in seen_tokens:
                        seen_tokens.append(v.decode())
                else:
                    if int(v) < last_off.get(f, -1):
                        self.problems.append(("offset backwards", f, last_off[f], int(v)))
                    last_off[f] = max(int(v), last_off.get(f, -1))
            time.sleep(0.02)


def changelog_generations_monotonic(r, topic="t-kv-changelog", partitions=6):
    """Every changelog entry carries its writer's token: per partition the
    generations never go back (a zombie's write after a takeover would)."""
    bad = []
    for p in range(partitions):
        last = 0
        for _id, fields in r.xrange(K.stream(topic, p)):
            gen = int(fields[b"o"].rsplit(b":", 1)[1])
            if gen < last:
                bad.append((p, _id, last, gen))
            last = max(last, gen)
    return bad


class Feeder(threading.Thread):
    """Produces ``n`` ops (set/del over a few hundred keys) at a steady pace over
    about ``seconds``; keeps the model of the table."""

    def __init__(self, url, n, seconds, partitions):
        super().__init__(daemon=True)
        self.url, self.n, self.seconds, self.partitions = url, n, seconds, partitions
        self.model = {}
        self.produced = 0
        self.error = None

    def run(self):
        import random

        rng = random.Random(7)
        chunk = max(50, self.n // 100)
        start = time.monotonic()
        try:
            while self.produced < self.n:
                ops = []
                for i in range(self.produced, min(self.n, self.produced + chunk)):
                    k = f"k{rng.randrange(300)}"
                    if rng.random() < 0.2:
                        op = {"op": "del", "i": i}
                    else:
                        op = {"op": "set", "v": rng.randrange(10**6), "i": i}
                    ops.append((k, op))
                produce(self.url, "ops", ops_items(ops), partitions=self.partitions)
                for k, op in ops:
                    if op["op"] == "set":
                        self.model[k] = op["v"]
                    else:
                        self.model.pop(k, None)
                self.produced += len(ops)
                ahead = start + self.seconds * self.produced / self.n - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
        except BaseException as exc:  # pragma: no cover - reported by the test
            self.error = exc


def dump_table(r, url, round_no, partitions):
    for p in range(partitions):
        produce(url, "ops", [(b"x", json.dumps({"op": "dump", "round": round_no}).encode())],
                partition=p, partitions=partitions)
    want = {f"{round_no}:{p}".encode() for p in range(partitions)}
    wait_until(lambda: want <= set(r.lrange("dumped", 0, -1)), 120, what=f"dump {round_no}")
    state = {}
    for p in range(partitions):
        state.update({k.decode(): int(v) for k, v in r.hgetall(f"dump:{p}").items()})
    return state


def member_of(worker):
    import re

    found = re.findall(r"member (\w+) joined group", worker.log())
    return found[-1] if found else None


EVENTS = int(os.environ.get("ELASTIC_EVENTS", "5000"))
RUN_S = float(os.environ.get("ELASTIC_RUN_S", "25"))


@pytest.mark.faults
def test_scale_1_3_2_1_with_kill_9_and_sigstop(redis_url, redis_sync, tmp_path):
    """A running group is scaled 1 → 3 → 2 (kill -9) → 1 (SIGSTOP: expelled; it
    comes back as a zombie, is fenced, rejoins and is stopped) while events flow:
    every event processed, table state equal to the model, commits and changelog
    writes never from an older generation than one already seen."""
    parts = 6
    url = redis_url + "?members=dynamic&lease=1.5&sync=5&compact=0"
    env = dict(PARTITIONS=parts)
    feeder = Feeder(redis_url, EVENTS, RUN_S, parts)
    audit = AuditWatcher(redis_url)
    w1 = Worker(url, tmp_path, "w1", **env).start()
    workers = [w1]
    seen_n = lambda: redis_sync.scard("ops-seen")  # noqa: E731
    steps = []
    try:
        wait_until(lambda: settled(redis_sync, 1), 60, what="w1 alone")
        feeder.start()
        audit.start()
        wait_until(lambda: seen_n() >= EVENTS * 0.05, 120, what="progress with 1")
        w2 = Worker(url, tmp_path, "w2", **env).start()
        w3 = Worker(url, tmp_path, "w3", **env).start()
        workers += [w2, w3]
        st = wait_until(lambda: settled(redis_sync, 3), 60, what="3 members")
        steps.append(("1→3", st.gen, seen_n()))
        # every member got active partitions of ops
        assert all(any(t == "ops" for t, _p in a) for a in actives(st).values()), actives(st)
        wait_until(lambda: seen_n() >= EVENTS * 0.3, 120, what="progress with 3")
        w2.kill()  # kill -9
        st = wait_until(lambda: settled(redis_sync, 2), 30, what="w2 expelled")
        steps.append(("3→2 kill -9", st.gen, seen_n()))
        assert st.expelled >= 1
        wait_until(lambda: seen_n() >= EVENTS * 0.55, 120, what="progress with 2")
        zombie = member_of(w3)
        w3.signal(signal.SIGSTOP)
        st = wait_until(lambda: settled(redis_sync, 1), 30, what="w3 expelled")
        steps.append(("2→1 SIGSTOP", st.gen, seen_n()))
        assert zombie not in st.live
        expelled_at = st.gen
        wait_until(lambda: seen_n() >= EVENTS * 0.75, 120, what="progress with 1")
        w3.signal(signal.SIGCONT)  # the zombie wakes up: fenced, rejoins
        st = wait_until(lambda: (settled(redis_sync, 2) or None) and zombie in group(redis_sync).live
                        and settled(redis_sync, 2), 30, what="w3 rejoined")
        steps.append(("zombie rejoined", st.gen, seen_n()))
        assert w3.stop() == 0
        st = wait_until(lambda: settled(redis_sync, 1), 30, what="w3 left")
        steps.append(("2→1 leave", st.gen, seen_n()))
        feeder.join(RUN_S * 4 + 60)
        assert feeder.error is None and feeder.produced == EVENTS
        wait_until(lambda: seen_n() >= EVENTS, 300, what=f"all {EVENTS} processed")
        state = dump_table(redis_sync, redis_url, 1, parts)
    finally:
        audit.stop_flag = True
        for w in workers:
            w.signal(signal.SIGCONT) if w.proc and w.proc.poll() is None else None
        w1_code = w1.stop()
        for w in workers[1:]:
            w.kill()
    print("steps (change, generation, events processed):", steps)
    assert {int(x) for x in redis_sync.smembers("ops-seen")} == set(range(EVENTS))
    assert state == feeder.model
    assert not audit.problems, audit.problems[:10]
    assert not changelog_generations_monotonic(redis_sync, partitions=parts)
    log3 = w3.log()
    assert "was expelled" in log3 or "fenced" in log3, log3[-3000:]
    # after its expulsion no commit of the zombie's old generation landed
    for p, tokens in audit.tokens.items():
        gens = [int(t.rsplit(":", 1)[1]) for t in tokens]
        first_new = next((i for i, g in enumerate(gens) if g >= expelled_at), len(gens))
        late = [t for t in tokens[first_new:] if t.startswith(zombie + ":") and int(t.rsplit(":", 1)[1]) < expelled_at]
        assert not late, (p, tokens)
    assert w1_code == 0, w1.log()[-3000:]
    assert len(steps) == 5


def test_sigstopped_member_is_expelled_and_its_writes_are_refused(redis_url, redis_sync, tmp_path):
    """SIGSTOP of a member mid-work: it is expelled when its lease runs out, the
    others take its partitions under a newer generation; after SIGCONT its
    in-flight commits and changelog writes are refused, it learns it was expelled,
    forgets its table state and rejoins. Nothing lost, table equal to the model."""
    parts = 4
    url = redis_url + "?members=dynamic&lease=1.5&compact=0"
    audit = AuditWatcher(redis_url)
    a = Worker(url, tmp_path, "a", PARTITIONS=parts, SLOW=0.01).start()
    b = Worker(url, tmp_path, "b", PARTITIONS=parts).start()
    model = {}

    def send(lo, hi):
        ops = [(f"k{i % 50}", {"op": "set", "v": i, "i": i}) for i in range(lo, hi)]
        produce(redis_url, "ops", ops_items(ops), partitions=parts)
        for k, op in ops:
            model[k] = op["v"]

    try:
        st = wait_until(lambda: settled(redis_sync, 2), 60, what="a and b")
        zombie = member_of(a)
        assert actives(st)[zombie], "a holds partitions"
        audit.start()
        send(0, 1500)
        wait_until(lambda: redis_sync.scard("ops-seen") >= 300, 60, what="progress")
        a.signal(signal.SIGSTOP)
        st = wait_until(lambda: (s := settled(redis_sync, 1)) and zombie not in s.live and s, 30,
                        what="a expelled, b alone")
        assert st.expelled >= 1
        fence = {k.decode(): v.decode() for k, v in redis_sync.hgetall(K.group_fence("t")).items()}
        assert not any(v.startswith(zombie + ":") for v in fence.values()), fence
        send(1500, 2000)
        time.sleep(1.0)
        a.signal(signal.SIGCONT)
        wait_until(lambda: redis_sync.scard("ops-seen") >= 2000, 90, what="all processed")
        wait_until(lambda: (s := settled(redis_sync, 2)) and zombie in s.live, 30, what="a rejoined")
        state = dump_table(redis_sync, redis_url, 7, parts)
    finally:
        audit.stop_flag = True
        a.signal(signal.SIGCONT)
        a.kill()
        b.kill()
    assert {int(x) for x in redis_sync.smembers("ops-seen")} == set(range(2000))
    assert state == model
    assert not audit.problems, audit.problems[:10]
    assert not changelog_generations_monotonic(redis_sync, partitions=parts)
    log = a.log()
    assert "was expelled" in log, log[-3000:]
    # its writes in flight at the SIGSTOP (changelog flush, commit) were refused by
    # Redis, or withheld once its heartbeat had told it it was expelled
    assert any(s in log for s in ("FENCED", "commit refused", "not the owner", "not committing")), log[-3000:]


def test_a_member_id_survives_the_log_redaction():
    """A member id all digits was masked in the log as a phone number
    (pipeline/redact.py), and the elastic drill could not find its zombie again."""
    from pipeline.redact import redact

    for _ in range(2000):
        mid = Membership(K, "g").member_id
        assert len(mid) == 12 and redact(f"member {mid} joined group notify") == f"member {mid} joined group notify"
