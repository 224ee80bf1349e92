"""SMTP simulator: aiosmtpd's SMTP protocol served on 127.0.0.1.

It runs on the caller's event loop (``loop.create_server`` with aiosmtpd's
``SMTP`` protocol, which is what aiosmtpd's ``Controller`` does in a thread of
its own), so the ledger is read without cross-thread races.

As Postfix with ``reject_non_fqdn_helo_hostname`` (``require_fqdn_helo``, on
by default), a client whose EHLO name is not a fully-qualified domain name
(``localhost``, a bare word) is refused at RCPT: ``504 5.5.2 <name>: Helo
command rejected: need fully-qualified hostname``. Each stored message keeps
the EHLO name it came with (``helo``).

Options: ``tls=True`` offers STARTTLS with a self-signed certificate generated
in memory (clients trust :attr:`SmtpSim.cert_pem`) and requires it;
``username``/``password`` require AUTH (PLAIN/LOGIN); ``implicit_tls=True`` serves
TLS from the first byte (SMTPS, port 465's way) instead; ``pipelining=False`` does
not advertise PIPELINING (RFC 2920, advertised by default as the providers' relays
do), for a client's one-command-at-a-time path.

Scenarios by the recipient's local part prefix: ``bounce…`` → 550 5.1.1 at
RCPT, ``tempfail…`` / ``flaky…`` → 451 at RCPT on the first try for that
address, ``error…`` → 451 at DATA always, ``reject…`` → 554 at DATA,
``slow…`` → slow DATA answer, ``hang…`` → message recorded at DATA, then no
answer (the UNKNOWN case). The runtime mode applies at DATA (down / flaky /
ratelimit → 451, timeout → hang, slow → delay).

Of a message it reads only the header fields it records (``X-Notify-Id``,
``Message-ID``, ``Subject``, ``Auto-Submitted``: :func:`_header_fields`, up to
the first empty line) and keeps the bytes as received (``raw``): it stands in
for a remote relay in the benchmarks, so its CPU per message stays small (the
standard library's e-mail parser took about 1.9 ms of the 3 ms it spent per
message). It judges nothing: tests parse ``raw`` with Python's strict parser.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import ssl
import time
import warnings
import weakref
from email import policy
from typing import Any, Optional

from aiosmtpd.smtp import SMTP, AuthResult, LoginPassword

from .common import SimCore, SimProfile
from .tls import client_tls_context, server_tls_context

__all__ = ["SmtpSim"]


def _scenario(address: str) -> Optional[str]:
    local = address.split("@", 1)[0].lower()
    for prefix in ("bounce", "tempfail", "flaky", "error", "reject", "slow", "hang"):
        if local.startswith(prefix):
            return prefix
    return None


def _fqdn(name: str) -> bool:
    """A fully-qualified host name (or an address literal), as Postfix wants in HELO."""
    name = name.strip().rstrip(".")
    if name.startswith("[") and name.endswith("]"):
        return True
    return "." in name and name.lower() not in ("localhost.localdomain",) and not name.lower().endswith(".localdomain")


#: the header fields recorded with a message (lower-case name → its field)
_RECORDED = {b"x-notify-id": "key", b"message-id": "message_id", b"subject": "subject",
             b"auto-submitted": "auto_submitted"}


def _header_fields(raw: bytes) -> dict[str, Optional[str]]:
    """The recorded header fields of a message (None when absent): the first of
    each name, unfolded, without the whitespace around it; a Subject with
    encoded-words (or 8-bit text) decoded as ``policy.default`` reads it. Only
    the header block is read (up to the first empty line), and only these
    fields are decoded."""
    end = raw.find(b"\r\n\r\n")
    found: dict[bytes, bytes] = {}
    name: Optional[bytes] = None  # the recorded field being read (for its folded lines)
    for line in (raw if end < 0 else raw[:end]).splitlines():
        if not line:
            break  # the end of the header (a message with bare LF line ends)
        if line[0] in (0x20, 0x09):  # a folded line: it continues the field before
            if name is not None:
                found[name] += line
            continue
        key, sep, value = line.partition(b":")
        name = key.strip().lower() if sep else None
        if name in _RECORDED and name not in found:
            found[name] = value
        else:
            name = None
    out: dict[str, Optional[str]] = dict.fromkeys(_RECORDED.values())
    for key, value in found.items():
        text = value.strip(b" \t").decode("utf-8", "replace")
        if key == b"subject" and ("=?" in text or not text.isascii()):
            text = str(policy.default.header_factory("Subject", text))
        out[_RECORDED[key]] = text
    return out


class _Handler:
    def __init__(self, sim: "SmtpSim") -> None:
        self.sim = sim

    async def handle_EHLO(self, server: SMTP, session: Any, envelope: Any, hostname: str, responses: list[str]) -> list[str]:
        """aiosmtpd's EHLO answer, with PIPELINING when the simulator offers it
        (aiosmtpd reads commands one by one from its buffer, so it can take
        them pipelined; it just does not say so)."""
        session.host_name = hostname
        if self.sim.implicit_tls and getattr(session, "ssl", None) is None:  # SMTPS: TLS from the first byte
            session.ssl = server.transport.get_extra_info("ssl_object") if server.transport is not None else None
        if self.sim.pipelining:
            responses.insert(len(responses) - 1, "250-PIPELINING")
        return responses

    async def handle_RCPT(self, server: SMTP, session: Any, envelope: Any, address: str, rcpt_options: list[str]) -> str:
        core = self.sim.core
        helo = str(getattr(session, "host_name", "") or "")
        if self.sim.require_fqdn_helo and not _fqdn(helo):
            core.record(op="send", stage="rcpt", key="", to=address, status=504, outcome="helo", helo=helo, accepted=False)
            return "504 5.5.2 <%s>: Helo command rejected: need fully-qualified hostname" % helo
        sc = _scenario(address)
        if sc == "bounce":
            core.record(op="send", stage="rcpt", key="", to=address, status=550, outcome="bounce", accepted=False)
            return "550 5.1.1 <%s>: Recipient address rejected: User unknown" % address
        if sc in ("tempfail", "flaky"):
            core.attempts["rcpt:" + address] += 1
            if core.attempts["rcpt:" + address] == 1:
                core.record(op="send", stage="rcpt", key="", to=address, status=451, outcome="tempfail", accepted=False)
                return "451 4.3.0 <%s>: Temporary lookup failure" % address
        envelope.rcpt_tos.append(address)
        return "250 2.1.5 OK"

    async def handle_DATA(self, server: SMTP, session: Any, envelope: Any) -> str:
        sim = self.sim
        core = sim.core
        raw: bytes = envelope.original_content or envelope.content
        fields = _header_fields(raw)
        key = fields["key"] or ""
        to = ",".join(envelope.rcpt_tos)
        sc = _scenario(envelope.rcpt_tos[0]) if envelope.rcpt_tos else None
        entry: dict[str, Any] = {"op": "send", "stage": "data", "key": key, "to": to, "message_id": fields["message_id"]}
        d = core.decide(key or to, "hang" if sc == "hang" else ("slow" if sc == "slow" else None))
        if sc == "error" and d.action == "ok":
            d.action, d.status = "error", 451
        if sc == "reject" and d.action == "ok":
            d.action = "permanent"
        if d.delay:
            await asyncio.sleep(d.delay)
        if d.action in ("error", "ratelimit"):
            core.record(**entry, status=451, outcome=d.action, cause=d.cause, accepted=False)
            return "451 4.3.0 Temporary failure, try again later"
        if d.action == "permanent":
            core.record(**entry, status=554, outcome="rejected", cause=d.cause, accepted=False)
            return "554 5.7.1 Message rejected by policy"
        queue_id = secrets.token_hex(6).upper()
        core.messages[queue_id] = {
            "queue_id": queue_id,
            "key": key,
            "mail_from": envelope.mail_from,
            "rcpt_tos": list(envelope.rcpt_tos),
            "message_id": fields["message_id"],
            "subject": fields["subject"],
            "auto_submitted": fields["auto_submitted"],
            "raw": raw,
            "helo": getattr(session, "host_name", None),
            "auth": getattr(session, "auth_data", None) is not None or getattr(session, "authenticated", False),
            "tls": getattr(session, "ssl", None) is not None,
            "at": time.time(),
        }
        if key:
            core.by_key[key] = queue_id
        if d.action == "hang":
            core.record(**entry, status="hang", outcome="queued_no_answer", cause=d.cause, accepted=True, msg_id=queue_id)
            await asyncio.sleep(core.profile.hang_s)
        else:
            core.record(**entry, status=250, outcome="queued", cause=d.cause, accepted=True, msg_id=queue_id)
        return f"250 2.0.0 Ok: queued as {queue_id}"


class SmtpSim:
    name = "smtp"

    def __init__(
        self,
        profile: Optional[SimProfile] = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        tls: bool = False,
        username: Optional[str] = None,
        password: Optional[str] = None,
        require_fqdn_helo: bool = True,
        pipelining: bool = True,
        implicit_tls: bool = False,
    ) -> None:
        self.core = SimCore(self.name, profile or SimProfile.realistic())
        self.require_fqdn_helo = require_fqdn_helo
        #: advertise PIPELINING (RFC 2920), as the relays of the e-mail providers do
        self.pipelining = pipelining
        #: TLS from the first byte (port 465, a client's ``use_tls``) instead of STARTTLS
        self.implicit_tls = implicit_tls
        self.host = host
        self.port = port
        self.tls = tls
        self.username = username
        self.password = password
        self.cert_pem: Optional[bytes] = None
        self._tls_context: Optional[ssl.SSLContext] = None
        self._server: Optional[asyncio.AbstractServer] = None
        self._handler = _Handler(self)
        self._protocols: weakref.WeakSet[SMTP] = weakref.WeakSet()

    def credentials(self) -> dict[str, Any]:
        return {"host": self.host, "port": self.port, "username": self.username, "password": self.password, "starttls": self.tls}

    def client_tls_context(self) -> Optional[ssl.SSLContext]:
        """An SSL context that trusts the simulator's self-signed certificate."""
        if self.cert_pem is None:
            return None
        return client_tls_context(self.cert_pem)

    def _authenticator(self, server: SMTP, session: Any, envelope: Any, mechanism: str, auth_data: Any) -> AuthResult:
        if isinstance(auth_data, LoginPassword):
            ok = secrets.compare_digest(auth_data.login, (self.username or "").encode()) and secrets.compare_digest(
                auth_data.password, (self.password or "").encode()
            )
            return AuthResult(success=ok, handled=False)
        return AuthResult(success=False, handled=False)

    def _factory(self) -> SMTP:
        kw: dict[str, Any] = {"hostname": "smtp.sim.invalid", "ident": "notify-sim ESMTP", "timeout": 60}
        if self._tls_context is not None:
            kw.update(tls_context=self._tls_context, require_starttls=True)
        if self.username:
            kw.update(auth_required=True, authenticator=self._authenticator, auth_require_tls=self._tls_context is not None)
        with warnings.catch_warnings():
            if self.implicit_tls:  # aiosmtpd sees no STARTTLS and warns; the socket is TLS from its first byte
                warnings.filterwarnings("ignore", "Requiring AUTH while not requiring TLS", UserWarning)
            proto = SMTP(self._handler, **kw)
        self._protocols.add(proto)
        return proto

    async def start(self) -> tuple[str, int]:
        smtps = None  # implicit TLS: the server's socket is TLS; STARTTLS: the protocol's context
        if self.implicit_tls:
            self.cert_pem, smtps = server_tls_context(self.host, "localhost")
        elif self.tls:
            self.cert_pem, self._tls_context = server_tls_context(self.host, "localhost")
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._factory, self.host, self.port, ssl=smtps)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.host, self.port

    async def stop(self) -> None:
        await self.core.close()
        if self._server is None:
            return
        self._server.close()
        for proto in list(self._protocols):
            transport = getattr(proto, "transport", None)
            if transport is not None:
                transport.close()
            task = getattr(proto, "_handler_coroutine", None)
            if task is not None:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 1.0)
        self._server = None
