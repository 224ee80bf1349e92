"""Receipt polls (agents/polls.py) as a sweep of the record store: only the records
still ACCEPTED ``receipt_poll_s`` after their send, only through providers with a
status query, each asked once, the cursor kept in the store across restarts, and
one process per database doing it. A real record store file; the app around the
sweep is the few attributes it uses, and the providers count what they are asked."""

import time
from types import SimpleNamespace

import pytest

from adapters.base import Provider, QueryResult, QueryStatus, SendResult
from agents import polls as polls_mod
from agents.callbacks import Callbacks
from agents.polls import Polls
from pipeline.models import Outcome
from pipeline.store.store import RecordStore
from pipeline.store.turn import SoleTurn


class Asked(Provider):
    """Answers DELIVERED for every message, and remembers what it was asked."""

    channel = "sms"

    def __init__(self, name: str) -> None:
        self.name = name
        self.asked: list[str] = []

    async def send(self, delivery):  # pragma: no cover - not called here
        return SendResult("ACCEPTED", self.name)

    async def query(self, delivery_id, provider_msg_id=None):
        self.asked.append(delivery_id)
        return QueryResult(True, provider_msg_id, QueryStatus.DELIVERED, provider=self.name)


class NoQuery(Provider):
    channel = "email"

    def __init__(self, name: str) -> None:
        self.name = name

    async def send(self, delivery):  # pragma: no cover
        return SendResult("ACCEPTED", self.name)


class Emitted:
    def __init__(self) -> None:
        self.outcomes: list[Outcome] = []

    async def outcomes_(self, items):
        self.outcomes += list(items)


def _outcome(i: int, state: str, at: float, provider: str) -> Outcome:
    return Outcome(delivery_id=f"d{i:04d}", notification_id=f"n{i:04d}", biz_key=f"b{i}", user_id=f"u{i}",
                   channel="sms", category="otp", template="otp", priority="high", state=state, at=at,
                   provider=provider, provider_msg_id=f"m{i}", callback=i in (1, 6))


async def _no_lookup(keys):
    raise AssertionError(f"looked up {keys}: the records keep whether their producer hears of them")


def _polls(store: RecordStore, providers: dict, poll_s: float = 60.0) -> tuple[Polls, Emitted]:
    emitted = Emitted()
    flushed = []

    async def flush():
        flushed.append(len(emitted.outcomes))

    async def get_store():
        return store

    async def dispatcher():
        return SimpleNamespace(providers=providers)

    app = SimpleNamespace(settings=SimpleNamespace(receipt_poll_s=poll_s),
                          resources=SimpleNamespace(store=get_store, dispatcher=dispatcher),
                          producer=SimpleNamespace(flush=flush))
    # the records' own flag decides (Callbacks.heard); a lookup is made only for a record written
    # before the store kept it: here, none
    callbacks = SimpleNamespace(cfg=SimpleNamespace(enabled=True), wanted_keys=_no_lookup)
    callbacks.heard = Callbacks.heard.__get__(callbacks)
    p = Polls(app, SimpleNamespace(outcomes=emitted.outcomes_), callbacks)
    emitted.flushed = flushed
    return p, emitted


@pytest.mark.asyncio
async def test_only_unanswered_records_of_providers_with_a_status_query_are_asked_once(tmp_path, monkeypatch):
    monkeypatch.setattr(polls_mod, "BATCH", 3)
    path = str(tmp_path / "records.db")
    now = time.time()
    twilio, vendor, smtp = Asked("twilio"), Asked("vendor"), NoQuery("smtp")
    async with RecordStore(path) as store:
        p, emitted = _polls(store, {"twilio": twilio, "vendor": vendor, "smtp": smtp})
        await p.sweep(now - 1000)  # a store never polled: starts with the records sent from then on
        outs = []
        for i in range(10):
            provider = ("twilio", "vendor", "smtp")[i % 3]
            outs += [_outcome(i, "PENDING", now - 200 + i, provider), _outcome(i, "ACCEPTED", now - 100 + i, provider)]
        outs.append(_outcome(3, "DELIVERED", now - 50, "twilio"))  # its receipt came
        outs += [_outcome(20, "PENDING", now - 30, "twilio"), _outcome(20, "ACCEPTED", now - 20, "twilio")]  # too new
        await store.apply_outcomes(outs)

        rounds = []
        while True:
            n = await p.sweep(now)
            rounds.append(n)
            if n < 3:
                break
        asked = sorted(twilio.asked + vendor.asked)
        # 0, 6, 9 twilio (3 has its receipt), 1, 4, 7 vendor; 2, 5, 8 smtp has no status query; 20 not due
        assert asked == ["d0000", "d0001", "d0004", "d0006", "d0007", "d0009"]
        assert rounds == [3, 3, 0]
        assert sorted(o.delivery_id for o in emitted.outcomes) == asked
        assert {(o.state, o.reason) for o in emitted.outcomes} == {("DELIVERED", "polled")}
        assert emitted.flushed  # written before the cursor moved past them
        assert {o.provider for o in emitted.outcomes} == {"twilio", "vendor"}
        # marked for the producer's callback: the records whose outcomes were (their events asked)
        assert sorted(o.delivery_id for o in emitted.outcomes if o.callback) == ["d0001", "d0006"]

        # nothing is asked twice, and the cursor outlives the process: a new sweeper goes on
        await p.sweep(now + 1)
        p2, _ = _polls(store, {"twilio": twilio, "vendor": vendor, "smtp": smtp})
        await p2.sweep(now + 2)
        assert sorted(twilio.asked + vendor.asked) == asked
        await p2.sweep(now + 60)  # 20 is due now
        assert twilio.asked[-1] == "d0020" and len(twilio.asked + vendor.asked) == 7


def test_one_process_per_database_holds_the_polls(tmp_path):
    path = str(tmp_path / "records.db")
    a, b = SoleTurn(path, "polls"), SoleTurn(path, "polls")
    try:
        assert a.take() and a.take()  # held, and held again by its holder
        assert not b.take()
        a.close()  # the holder ends: the next try takes it over
        assert b.take()
    finally:
        a.close()
        b.close()
