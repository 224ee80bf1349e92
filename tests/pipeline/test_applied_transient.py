"""The guard's read barrier (agents/applied.py) when the broker is away for a moment
(a master failing over): it asks again until its deadline, then lets the plan be
made with the table as it is; it never raises, so the guard agent never crashes on
it (the cluster failover drill saw the guard crash on a refused MGET). Pure: a
stand-in for the consumer's reads."""

from types import SimpleNamespace

from faust.types import TP
from redis.exceptions import ConnectionError as RedisConnectionError

from agents.applied import TOPICS, Applied


def _barrier(fail_times: int):
    calls = []

    async def highwaters(*tps):
        calls.append(tps)
        if len(calls) <= fail_times:
            raise RedisConnectionError("Error 111 connecting to 127.0.0.1:40019. Connection refused.")
        return {tp: 0 for tp in tps}

    app = SimpleNamespace(consumer=SimpleNamespace(highwaters=highwaters), on_rebalance_complete=None)
    a = Applied(app)
    a._base.update({TP(t, 0): 0 for t in TOPICS})  # nothing committed, nothing written: caught up once read
    return a, calls


async def test_a_refused_read_is_asked_again_and_the_barrier_goes_on():
    a, calls = _barrier(fail_times=2)
    assert await a.wait(0, 0.0, timeout=5.0) is False  # nothing pending once it could read
    assert len(calls) == 3


async def test_a_broker_away_past_the_deadline_lets_the_plan_go_on_without_raising():
    a, calls = _barrier(fail_times=10**6)
    assert await a.wait(0, 0.0, timeout=0.3) is False
    assert a._lagging.get(0)  # the partition is not waited for a while
    assert len(calls) >= 2
