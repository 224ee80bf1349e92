"""The SMTP adapter's session pool (issue 18 item 3) against the simulator on
127.0.0.1: many messages over few connections, counted on the server's side;
a session the server closed while idle is replaced without losing the message;
a DATA timeout is TIMEOUT_UNKNOWN and its session is not reused; sends beyond
the pool size wait their turn; idle and worn-out sessions are quit."""

from __future__ import annotations

import asyncio
from collections import Counter
from email import message_from_bytes, policy

import pytest

from adapters._smtp_pool import SmtpPool
from adapters.email_smtp import SmtpConfig, SmtpProvider
from adapters.simulators.smtp_sim import SmtpSim
from pipeline.models import AttemptResult

CONTENT = {"subject": "Your order shipped", "text": "Plain text", "html": "<p>HTML</p>"}


def counting(sim: SmtpSim) -> Counter:
    """What the simulator's server sees: ``connections`` accepted, ``QUIT`` and
    ``RSET`` received; ``MAIL`` answers come from ``mail_replies`` when it has any
    (set before the connection is made: aiosmtpd reads the hooks then)."""
    seen: Counter = Counter()
    factory = sim._factory  # noqa: SLF001 - wrapped to count the connections

    def counted():
        seen["connections"] += 1
        return factory()

    async def handle_QUIT(server, session, envelope):
        seen["QUIT"] += 1
        return "221 Bye"

    async def handle_RSET(server, session, envelope):
        seen["RSET"] += 1
        return "250 OK"

    async def handle_MAIL(server, session, envelope, address, options):
        seen["MAIL"] += 1
        if sim.mail_replies:  # type: ignore[attr-defined]
            return sim.mail_replies.pop(0)  # type: ignore[attr-defined]
        envelope.mail_from = address
        envelope.mail_options.extend(options)
        return "250 OK"

    sim._factory = counted  # noqa: SLF001
    sim._handler.handle_QUIT = handle_QUIT  # noqa: SLF001
    sim._handler.handle_RSET = handle_RSET  # noqa: SLF001
    sim._handler.handle_MAIL = handle_MAIL  # noqa: SLF001
    sim.mail_replies = []  # type: ignore[attr-defined]
    return seen


@pytest.fixture
async def sim(profile):
    s = SmtpSim(profile)
    s.seen = counting(s)  # type: ignore[attr-defined]
    await s.start()
    yield s
    await s.stop()


def provider_for(sim, **kw) -> SmtpProvider:
    cfg = dict(host=sim.host, port=sim.port, start_tls=False, timeout=2.0, from_addr="notify@example.com",
               msgid_domain="notify.example.com")
    cfg.update(kw)
    return SmtpProvider(SmtpConfig(**cfg))


def drop_server_side(sim: SmtpSim) -> int:
    """Close every connection from the server's side, as a server ending idle
    sessions (or restarting) does; answers how many were open."""
    n = 0
    for proto in list(sim._protocols):  # noqa: SLF001
        transport = getattr(proto, "transport", None)
        if transport is not None and not transport.is_closing():
            transport.close()
            n += 1
    return n


async def test_many_messages_reuse_few_connections(sim, make_delivery):
    p = provider_for(sim, max_connections=3)
    try:
        for i in range(20):  # one after the other: one session carries them all
            r = await p.send(make_delivery("email", f"user{i}@example.org", CONTENT))
            assert r.result == AttemptResult.ACCEPTED, r
        assert sim.seen["connections"] == 1
        results = await asyncio.gather(*(p.send(make_delivery("email", f"c{i}@example.org", CONTENT)) for i in range(30)))
        assert [r.result for r in results] == [AttemptResult.ACCEPTED] * 30
        assert sim.seen["connections"] == 3 and p.pool.opened == 3  # the pool's size, never more
        assert len(sim.core.messages) == 50 and sim.seen["QUIT"] == 0
        for stored in sim.core.messages.values():  # each message is whole, with its own ids
            msg = message_from_bytes(stored["raw"], policy=policy.strict)
            assert msg["X-Notify-Id"] == stored["key"] and msg["Message-ID"] == f"<{stored['key']}@notify.example.com>"
            assert msg["To"] == stored["rcpt_tos"][0]
    finally:
        await p.close()
    assert sim.seen["QUIT"] == 3  # close quits the idle sessions


async def test_concurrency_above_the_pool_size_waits_its_turn(sim, make_delivery):
    p = provider_for(sim, max_connections=2)
    in_data = Counter()
    data = sim._handler.handle_DATA  # noqa: SLF001

    async def slow_data(server, session, envelope):
        in_data["now"] += 1
        in_data["max"] = max(in_data["max"], in_data["now"])
        await asyncio.sleep(0.01)
        try:
            return await data(server, session, envelope)
        finally:
            in_data["now"] -= 1

    sim._handler.handle_DATA = slow_data  # noqa: SLF001
    try:
        results = await asyncio.gather(*(p.send(make_delivery("email", f"u{i}@example.org", CONTENT)) for i in range(40)))
        assert [r.result for r in results] == [AttemptResult.ACCEPTED] * 40
        assert len(sim.core.messages) == 40
        assert sim.seen["connections"] == 2 and in_data["max"] == 2
    finally:
        await p.close()


async def test_waiters_are_served_first_come_first_served():
    pool = SmtpPool(size=1, idle_s=30.0, max_messages=100)
    order = []

    async def user(i: int) -> None:
        await pool.take()  # no idle session: the slot is ours (we would open one)
        order.append(i)
        await asyncio.sleep(0)
        pool.give_back(None, reusable=False)

    await asyncio.gather(*(user(i) for i in range(10)))
    assert order == list(range(10))
    await pool.close()


async def test_waiting_for_a_session_is_bounded_by_the_timeout(sim, make_delivery):
    p = provider_for(sim, max_connections=1, timeout=0.3)
    try:
        hung, queued = await asyncio.gather(p.send(make_delivery("email", "hang@example.org", CONTENT)),
                                            p.send(make_delivery("email", "b@example.org", CONTENT)))
        assert hung.result == AttemptResult.TIMEOUT_UNKNOWN, hung
        # the second never got the one session: nothing of it was sent
        assert queued.result == AttemptResult.TRANSIENT_ERROR and queued.error.startswith("pool: SmtpPoolTimeout"), queued
        assert len(sim.core.messages) == 1
    finally:
        await p.close()


@pytest.mark.parametrize("seen_eof", [True, False], ids=["eof-seen-while-idle", "closed-under-the-mail-command"])
async def test_a_session_closed_by_the_server_while_idle_is_replaced(sim, make_delivery, seen_eof):
    """Seen while idle: the session is dropped when taken. Not seen yet: MAIL fails
    on it (nothing of the message was sent) and the same send tries a fresh session."""
    p = provider_for(sim)
    try:
        r = await p.send(make_delivery("email", "a@example.org", CONTENT))
        assert r.result == AttemptResult.ACCEPTED, r
        assert drop_server_side(sim) == 1
        if seen_eof:
            await asyncio.sleep(0.05)
        d = make_delivery("email", "b@example.org", CONTENT)
        r = await p.send(d)
        assert r.result == AttemptResult.ACCEPTED and r.error is None, r
        assert sim.seen["connections"] == 2
        assert [m["key"] for m in sim.core.messages.values()].count(d.delivery_id) == 1
        assert p.pool.replaced == (0 if seen_eof else 1)
    finally:
        await p.close()


async def test_a_421_at_mail_on_a_reused_session_moves_to_a_fresh_one(sim, make_delivery):
    """A server that ends a session with 421 (idle too long, too many messages)
    answers the next command with it; aiosmtplib closes the connection."""
    p = provider_for(sim)
    try:
        assert (await p.send(make_delivery("email", "a@example.org", CONTENT))).ok
        sim.mail_replies.append("421 4.4.2 smtp.sim.invalid Error: timeout exceeded")
        r = await p.send(make_delivery("email", "b@example.org", CONTENT))
        assert r.result == AttemptResult.ACCEPTED, r
        assert sim.seen["connections"] == 2 and p.pool.replaced == 1 and len(sim.core.messages) == 2
        # on a fresh session a 421 is the answer: nothing was sent, try later
        drop_server_side(sim)
        await asyncio.sleep(0.05)
        sim.mail_replies.append("421 4.3.2 Service shutting down")
        r = await p.send(make_delivery("email", "c@example.org", CONTENT))
        assert r.result == AttemptResult.TRANSIENT_ERROR and r.error.startswith("mail: 421"), r
    finally:
        await p.close()


async def test_a_session_is_retried_once_only(sim, make_delivery):
    p = provider_for(sim)
    try:
        assert (await p.send(make_delivery("email", "a@example.org", CONTENT))).ok
        sim.mail_replies.extend(["421 4.4.2 closing"] * 2)  # the reused session, then the fresh one
        r = await p.send(make_delivery("email", "b@example.org", CONTENT))
        assert r.result == AttemptResult.TRANSIENT_ERROR and r.error.startswith("mail: 421"), r
        assert sim.seen["connections"] == 2 and p.pool.replaced == 1
    finally:
        await p.close()


async def test_timeout_during_data_is_unknown_and_the_session_is_not_reused(sim, make_delivery):
    p = provider_for(sim, timeout=0.3)
    try:
        assert (await p.send(make_delivery("email", "a@example.org", CONTENT))).ok
        d = make_delivery("email", "hang@example.org", CONTENT)
        r = await p.send(d)
        assert r.result == AttemptResult.TIMEOUT_UNKNOWN and r.provider_msg_id == f"<{d.delivery_id}@notify.example.com>", r
        assert sim.core.by_key[d.delivery_id]  # the server did queue it
        assert p.pool.idle_count == 0  # discarded, never given to the next message
        r = await p.send(make_delivery("email", "b@example.org", CONTENT))
        assert r.result == AttemptResult.ACCEPTED, r
        assert sim.seen["connections"] == 2
    finally:
        await p.close()


@pytest.mark.parametrize(
    "rcpt,result,kind",
    [
        ("bounce@example.org", AttemptResult.PERMANENT_ERROR, "invalid_address"),  # 550 at RCPT
        ("tempfail@example.org", AttemptResult.TRANSIENT_ERROR, None),  # 451 at RCPT
        ("reject@example.org", AttemptResult.PERMANENT_ERROR, "rejected"),  # 554 at DATA
        ("error@example.org", AttemptResult.TRANSIENT_ERROR, None),  # 451 at DATA
    ],
)
async def test_a_refused_transaction_keeps_the_session_after_an_rset(sim, make_delivery, rcpt, result, kind):
    p = provider_for(sim)
    try:
        r = await p.send(make_delivery("email", rcpt, CONTENT))
        assert (r.result, r.permanent_kind) == (result, kind), r
        assert sim.seen["RSET"] == 0  # not before another message needs the session
        r = await p.send(make_delivery("email", "ok@example.org", CONTENT))
        assert r.result == AttemptResult.ACCEPTED, r
        assert sim.seen["connections"] == 1 and sim.seen["RSET"] == 1
        [stored] = sim.core.messages.values()
        assert stored["rcpt_tos"] == ["ok@example.org"]  # nothing of the refused envelope left
    finally:
        await p.close()


async def test_idle_sessions_are_quit(sim, make_delivery):
    p = provider_for(sim, keepalive_s=0.2)
    try:
        assert (await p.send(make_delivery("email", "a@example.org", CONTENT))).ok
        assert p.pool.idle_count == 1
        await asyncio.sleep(0.5)
        assert p.pool.idle_count == 0 and sim.seen["QUIT"] == 1
        assert (await p.send(make_delivery("email", "b@example.org", CONTENT))).ok
        assert sim.seen["connections"] == 2
    finally:
        await p.close()


async def test_a_session_is_quit_after_max_messages(sim, make_delivery):
    p = provider_for(sim, max_messages=3)
    try:
        for i in range(7):
            assert (await p.send(make_delivery("email", f"u{i}@example.org", CONTENT))).ok
        await asyncio.sleep(0.05)  # the QUITs go in the background
        assert sim.seen["connections"] == 3 and sim.seen["QUIT"] == 2
    finally:
        await p.close()
    assert sim.seen["QUIT"] == 3


async def test_auth_and_starttls_once_per_session(profile, make_delivery):
    sim = SmtpSim(profile, tls=True, username="notify", password="s3cret")
    seen = counting(sim)
    await sim.start()
    p = provider_for(sim, start_tls=True, tls_context=sim.client_tls_context(), username="notify", password="s3cret")
    try:
        for i in range(5):
            assert (await p.send(make_delivery("email", f"u{i}@example.org", CONTENT))).ok
        assert seen["connections"] == 1
        assert all(m["tls"] for m in sim.core.messages.values()) and len(sim.core.messages) == 5
    finally:
        await p.close()
        await sim.stop()


async def test_a_cancelled_send_does_not_leak_its_session(sim, make_delivery):
    p = provider_for(sim, max_connections=1, timeout=2.0)
    try:
        task = asyncio.ensure_future(p.send(make_delivery("email", "hang@example.org", CONTENT)))
        await asyncio.sleep(0.2)  # in DATA
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert p.pool.idle_count == 0  # closed: in what state the server is, nobody knows
        r = await p.send(make_delivery("email", "b@example.org", CONTENT))  # the slot came back
        assert r.result == AttemptResult.ACCEPTED, r
        assert sim.seen["connections"] == 2
    finally:
        await p.close()


async def test_close_while_sends_wait(sim, make_delivery):
    p = provider_for(sim, max_connections=1, timeout=2.0)
    first = asyncio.ensure_future(p.send(make_delivery("email", "slow@example.org", CONTENT)))
    waiting = asyncio.ensure_future(p.send(make_delivery("email", "b@example.org", CONTENT)))
    await asyncio.sleep(0.05)
    await p.close()
    r1, r2 = await asyncio.gather(first, waiting)
    assert r1.result == AttemptResult.ACCEPTED, r1  # in flight: finishes, then its session is closed
    assert r2.result == AttemptResult.TRANSIENT_ERROR and r2.error.startswith("pool: SmtpPoolClosed"), r2
    # a provider used again after close starts a new pool
    r3 = await p.send(make_delivery("email", "c@example.org", CONTENT))
    assert r3.result == AttemptResult.ACCEPTED, r3
    await p.close()
