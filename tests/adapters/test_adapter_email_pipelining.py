"""SMTP PIPELINING (RFC 2920) in the e-mail adapter, against SMTP servers on 127.0.0.1.

A hand-written server (below) shows what goes over the wire: with PIPELINING
advertised, ``[RSET] MAIL RCPT DATA`` arrive as one segment and the message as
the next (two writes a message instead of four); replies are read however the
server cuts them (all in one segment, one per segment, multi-line); a refused
recipient whose DATA the server still took is ended with an empty message; a
server without PIPELINING gets one command at a time; a reply nobody asked for
(a 421 said while idle) moves the message to a fresh session; a reply that is not
SMTP fails the message by how far it got. aiosmtpd (the simulator's server
library) is the other side in ``test_aiosmtpd_takes_both`` (with and without
PIPELINING advertised), in the TLS and uvloop tests at the end, and in
tests/adapters/test_adapter_email_pool.py."""

from __future__ import annotations

import asyncio
from typing import Callable, Optional

import pytest

from adapters.email_smtp import SmtpConfig, SmtpProvider
from adapters.simulators.smtp_sim import SmtpSim
from pipeline.models import AttemptResult

CONTENT = {"subject": "Your code", "text": "Your code is 123456"}


class ScriptedSmtp:
    """An SMTP server that records what it reads (``chunks``: one entry per read
    of its socket, per connection) and answers by ``answer(command) -> reply``.
    Replies to the commands of one read go out as one write when ``coalesce``
    (a pipelining server sends them when its input is drained, RFC 2920 rule 7),
    else one write each, ``gap`` seconds apart."""

    def __init__(self, *, pipelining: bool = True, coalesce: bool = True, gap: float = 0.0,
                 answer: Optional[Callable[[str], Optional[str]]] = None) -> None:
        self.pipelining = pipelining
        self.coalesce = coalesce
        self.gap = gap
        self.answer = answer or (lambda command: None)
        self.connections: list[list[bytes]] = []
        self.messages: list[bytes] = []
        self.writers: list[asyncio.StreamWriter] = []
        self.lockstep_violations = 0  #: a command read before the previous one was answered
        self.server: Optional[asyncio.AbstractServer] = None
        self.port = 0

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        for w in self.writers:
            w.close()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    def config(self, **kw) -> SmtpConfig:
        cfg = dict(host="127.0.0.1", port=self.port, start_tls=False, timeout=1.0, msgid_domain="notify.example.com")
        cfg.update(kw)
        return SmtpConfig(**cfg)

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        chunks: list[bytes] = []
        self.connections.append(chunks)
        self.writers.append(writer)
        writer.write(b"220 scripted ESMTP\r\n")
        buf = b""
        in_data = False
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    return
                chunks.append(data)
                buf += data
                replies: list[str] = []
                while True:
                    if in_data:
                        end = buf.find(b"\r\n.\r\n")
                        if buf.startswith(b".\r\n"):
                            end, body = 0, b""
                        elif end < 0:
                            break
                        else:
                            body = buf[:end + 2]
                            end += 2
                        buf = buf[end + 3:]
                        in_data = False
                        self.messages.append(body)
                        replies.append(self.answer("." if not body else "MESSAGE") or "250 2.0.0 queued")
                        continue
                    line, sep, rest = buf.partition(b"\r\n")
                    if not sep:
                        break
                    buf = rest
                    command = line.decode()
                    if not self.pipelining and (buf or len(replies)):
                        self.lockstep_violations += 1
                    verb = command.split(" ", 1)[0].upper()
                    if verb == "EHLO":
                        ext = "250-PIPELINING\r\n" if self.pipelining else ""
                        replies.append(f"250-scripted\r\n{ext}250 HELP")
                        continue
                    reply = self.answer(command)
                    if reply is None:
                        reply = {"DATA": "354 go ahead", "QUIT": "221 bye"}.get(verb, "250 OK")
                    if reply == "354 go ahead" or reply.startswith("354"):
                        in_data = True
                    replies.append(reply)
                if replies:
                    if self.coalesce:
                        writer.write("".join(r + "\r\n" for r in replies).encode())
                    else:
                        for r in replies:
                            writer.write((r + "\r\n").encode())
                            await writer.drain()
                            await asyncio.sleep(self.gap)
                    await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            return
        finally:
            writer.close()


@pytest.fixture
async def scripted():
    servers: list[ScriptedSmtp] = []

    async def make(**kw) -> ScriptedSmtp:
        s = ScriptedSmtp(**kw)
        await s.start()
        servers.append(s)
        return s

    yield make
    for s in servers:
        await s.stop()


def _lines(chunk: bytes) -> list[str]:
    return [line.split(b":", 1)[0].split(b" ", 1)[0].decode() for line in chunk.split(b"\r\n") if line]


async def test_with_pipelining_a_message_is_two_writes(scripted, make_delivery):
    s = await scripted()
    p = SmtpProvider(s.config())
    try:
        for i in range(3):
            r = await p.send(make_delivery("email", f"u{i}@example.org", CONTENT))
            assert r.result == AttemptResult.ACCEPTED, r
    finally:
        await p.close()
    [chunks] = s.connections
    # EHLO, then per message the envelope as one segment and the message as another, then QUIT
    assert _lines(chunks[0]) == ["EHLO"]
    for k in range(3):
        assert _lines(chunks[1 + 2 * k]) == ["MAIL", "RCPT", "DATA"], chunks
        assert chunks[2 + 2 * k].endswith(b"\r\n.\r\n")
    assert _lines(chunks[7]) == ["QUIT"]
    assert len(s.messages) == 3


@pytest.mark.parametrize("coalesce,gap", [(True, 0.0), (False, 0.0), (False, 0.02)],
                         ids=["one-segment", "a-segment-each", "a-segment-each-later"])
async def test_replies_are_read_however_the_server_cuts_them(scripted, make_delivery, coalesce, gap):
    multi = {"MAIL": "250-sender ok\r\n250-more\r\n250 fine", "RCPT": "250-rcpt\r\n250 ok"}
    s = await scripted(coalesce=coalesce, gap=gap, answer=lambda c: multi.get(c.split(" ", 1)[0]))
    p = SmtpProvider(s.config())
    try:
        for i in range(2):
            r = await p.send(make_delivery("email", f"u{i}@example.org", CONTENT))
            assert r.result == AttemptResult.ACCEPTED, r
        assert p.pool.opened == 1
    finally:
        await p.close()


async def test_a_refused_recipient_whose_data_was_taken_is_ended_with_an_empty_message(scripted, make_delivery):
    """A server that answers 354 to a DATA after every RCPT failed (RFC 2920 §3.1):
    the client ends it with a lone dot, and the session goes on after an RSET."""
    s = await scripted(answer=lambda c: "550 5.1.1 no such user" if c.startswith("RCPT TO:<bounce") else None)
    p = SmtpProvider(s.config())
    try:
        r = await p.send(make_delivery("email", "bounce@example.org", CONTENT))
        assert (r.result, r.permanent_kind) == (AttemptResult.PERMANENT_ERROR, "invalid_address"), r
        assert r.error.startswith("rcpt: 550"), r
        r = await p.send(make_delivery("email", "ok@example.org", CONTENT))
        assert r.result == AttemptResult.ACCEPTED, r
    finally:
        await p.close()
    [chunks] = s.connections
    assert chunks[2].startswith(b".\r\n") and s.messages[0] == b""  # the dot alone, then the real message
    assert _lines(chunks[3]) == ["RSET", "MAIL", "RCPT", "DATA"]


async def test_without_pipelining_one_command_at_a_time(scripted, make_delivery):
    s = await scripted(pipelining=False)
    p = SmtpProvider(s.config())
    try:
        for i in range(2):
            r = await p.send(make_delivery("email", f"u{i}@example.org", CONTENT))
            assert r.result == AttemptResult.ACCEPTED, r
        r = await p.send(make_delivery("email", "x@example.org", CONTENT))
    finally:
        await p.close()
    assert s.lockstep_violations == 0
    assert all(len(_lines(c)) == 1 for c in s.connections[0] if not c.endswith(b"\r\n.\r\n"))


async def test_a_421_said_while_idle_moves_the_message_to_a_fresh_session(scripted, make_delivery):
    s = await scripted()
    p = SmtpProvider(s.config())
    try:
        assert (await p.send(make_delivery("email", "a@example.org", CONTENT))).ok
        s.writers[0].write(b"421 4.4.2 idle too long\r\n")  # said, not yet closed
        await s.writers[0].drain()
        await asyncio.sleep(0.05)
        r = await p.send(make_delivery("email", "b@example.org", CONTENT))
        assert r.result == AttemptResult.ACCEPTED, r
        assert len(s.connections) == 2 and p.pool.replaced == 1 and len(s.messages) == 2
    finally:
        await p.close()


@pytest.mark.parametrize("when,result", [("MAIL", AttemptResult.TRANSIENT_ERROR), ("MESSAGE", AttemptResult.TIMEOUT_UNKNOWN)])
async def test_a_reply_that_is_not_smtp_fails_the_message_by_how_far_it_got(scripted, make_delivery, when, result):
    s = await scripted(answer=lambda c: "hello there" if c.split(" ", 1)[0] == when else None)
    p = SmtpProvider(s.config())
    try:
        d = make_delivery("email", "a@example.org", CONTENT)
        r = await p.send(d)
        assert r.result == result, r
        assert "SmtpReplyError" in r.error, r
        if result == AttemptResult.TIMEOUT_UNKNOWN:
            assert r.provider_msg_id == f"<{d.delivery_id}@notify.example.com>"
        assert p.pool.idle_count == 0  # closed, never reused
        s.answer = lambda c: None
        assert (await p.send(make_delivery("email", "b@example.org", CONTENT))).ok
        assert len(s.connections) == 2
    finally:
        await p.close()


async def test_an_address_that_is_not_ascii_is_refused_before_any_call(scripted, make_delivery):
    s = await scripted()
    p = SmtpProvider(s.config())
    try:
        r = await p.send(make_delivery("email", "jürgen@example.org", CONTENT))
        assert (r.result, r.permanent_kind) == (AttemptResult.PERMANENT_ERROR, "invalid_address"), r
        assert s.connections == []
    finally:
        await p.close()


async def test_a_control_character_in_an_address_never_reaches_the_wire(scripted, make_delivery):
    """aiosmtplib refused a command holding a control character before writing it;
    the pipelined dialogue keeps that rule: nothing of the message is written, the
    session is not reused, and the next message goes out as usual."""
    s = await scripted()
    p = SmtpProvider(s.config())
    try:
        assert (await p.send(make_delivery("email", "a@example.org", CONTENT))).ok
        r = await p.send(make_delivery("email", "x\x01y@example.org", CONTENT))
        assert r.result == AttemptResult.TRANSIENT_ERROR and "control character" in r.error, r
        assert (await p.send(make_delivery("email", "b@example.org", CONTENT))).ok
    finally:
        await p.close()
    wire = b"".join(b"".join(chunks) for chunks in s.connections)
    assert b"\x01" not in wire and len(s.messages) == 2


@pytest.mark.parametrize("pipelining", [True, False], ids=["pipelining", "one-at-a-time"])
async def test_aiosmtpd_takes_both(profile, make_delivery, pipelining):
    """The simulator's server library, with PIPELINING advertised and without:
    scenarios at RCPT and DATA answer as they do one command at a time."""
    sim = SmtpSim(profile, pipelining=pipelining)
    await sim.start()
    p = SmtpProvider(SmtpConfig(host=sim.host, port=sim.port, start_tls=False, timeout=2.0,
                                msgid_domain="notify.example.com"))
    try:
        cases = [("ok@example.org", AttemptResult.ACCEPTED), ("bounce@example.org", AttemptResult.PERMANENT_ERROR),
                 ("reject@example.org", AttemptResult.PERMANENT_ERROR), ("error@example.org", AttemptResult.TRANSIENT_ERROR),
                 ("ok2@example.org", AttemptResult.ACCEPTED)]
        for address, expected in cases:
            r = await p.send(make_delivery("email", address, CONTENT))
            assert r.result == expected, (address, r)
        assert p.pool.opened == 1
        assert sorted(m["rcpt_tos"][0] for m in sim.core.messages.values()) == ["ok2@example.org", "ok@example.org"]
    finally:
        await p.close()
        await sim.stop()


def _tls_setups(tls: str, sim: Optional[SmtpSim] = None) -> dict:
    """The simulator's options (no ``sim``) or the client's, for a TLS setup."""
    if tls == "plain":
        return {} if sim is None else dict(start_tls=False)
    auth = dict(username="notify", password="s3cret")
    if sim is None:
        return dict(tls=True, **auth) if tls == "starttls" else dict(implicit_tls=True, **auth)
    if tls == "starttls":
        return dict(start_tls=True, tls_context=sim.client_tls_context(), **auth)
    return dict(use_tls=True, start_tls=False, tls_context=sim.client_tls_context(), **auth)


async def test_implicit_tls_with_auth_pipelines_too(profile, make_delivery):
    """Port 465's way (TLS from the first byte, then AUTH): the session is handed
    over the same way and carries several messages."""
    sim = SmtpSim(profile, **_tls_setups("implicit"))
    await sim.start()
    p = SmtpProvider(SmtpConfig(host=sim.host, port=sim.port, timeout=2.0, msgid_domain="notify.example.com",
                                **_tls_setups("implicit", sim)))
    try:
        for i in range(3):
            r = await p.send(make_delivery("email", f"u{i}@example.org", CONTENT))
            assert r.result == AttemptResult.ACCEPTED, r
        assert p.pool.opened == 1 and len(sim.core.messages) == 3
        assert all(m["tls"] for m in sim.core.messages.values())
    finally:
        await p.close()
        await sim.stop()


@pytest.mark.parametrize("tls", ["plain", "starttls", "implicit"])
def test_on_uvloop_the_loop_the_workers_run(profile, make_delivery, tls):
    """The workers run uvloop (pipeline/lean.py): its transports, plain and TLS
    (STARTTLS or implicit, with AUTH), are handed from aiosmtplib's protocol to
    ours the same way."""
    uvloop = pytest.importorskip("uvloop")

    async def run() -> list:
        sim = SmtpSim(profile, **_tls_setups(tls))
        await sim.start()
        cfg = _tls_setups(tls, sim)
        p = SmtpProvider(SmtpConfig(host=sim.host, port=sim.port, timeout=2.0, msgid_domain="notify.example.com", **cfg))
        try:
            results = [(await p.send(make_delivery("email", a, CONTENT))).result
                       for a in ("a@example.org", "bounce@example.org", "b@example.org")]
            assert p.pool.opened == 1 and isinstance(asyncio.get_running_loop(), uvloop.Loop)
            return results
        finally:
            await p.close()
            await sim.stop()

    assert uvloop.run(run()) == [AttemptResult.ACCEPTED, AttemptResult.PERMANENT_ERROR, AttemptResult.ACCEPTED]


@pytest.mark.parametrize("flood", [b"250-" + b"x" * 200 + b"\r\n", b"y" * 8192], ids=["endless-multiline-reply", "no-line-end"])
async def test_a_server_that_floods_its_reply_fails_the_message_not_the_worker(scripted, make_delivery, flood):
    """A reply without end (lines of a multi-line reply forever, or bytes without a
    line end) is cut at the reply's size limit: the message is TRANSIENT_ERROR
    (nothing of it went out), the session closed, memory bounded."""
    s = await scripted()
    p = SmtpProvider(s.config())
    try:
        assert (await p.send(make_delivery("email", "a@example.org", CONTENT))).ok

        async def flood_it() -> None:
            w = s.writers[0]
            for _ in range(2000):
                if w.is_closing():
                    return
                w.write(flood)
                await w.drain()
                await asyncio.sleep(0)

        s.answer = lambda c: "250-a reply that goes on"  # to MAIL, RCPT and DATA: no reply ends
        task = asyncio.ensure_future(flood_it())
        r = await p.send(make_delivery("email", "b@example.org", CONTENT))
        task.cancel()
        assert r.result == AttemptResult.TRANSIENT_ERROR and "SmtpReplyError" in r.error, r
        assert p.pool.idle_count == 0 and len(s.messages) == 1
    finally:
        await p.close()
