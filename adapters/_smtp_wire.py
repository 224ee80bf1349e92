"""One SMTP session's message dialogue, after aiosmtplib has set the session up.

aiosmtplib opens the session (connect, implicit TLS or STARTTLS, EHLO, AUTH:
the parts where a library earns its keep). Then :meth:`SmtpWire.take_over`
moves the connection's transport to this protocol, which carries the
transactions (RSET, MAIL, RCPT, DATA, the message) and the QUIT.

Why not aiosmtplib for those too: it has no PIPELINING (RFC 2920), and its
protocol keeps one reply at a time (a reply that arrives while the previous one
waits to be taken is dropped), so commands cannot be sent as a group through it.
Each command was a socket write and a wake-up on both sides; on the real path the
SMTP adapter's four writes per message were 9% of a main worker's CPU
(bench/RESULTS.md "real: SMTP pipelining").

With PIPELINING advertised, a transaction is two writes: ``[RSET] MAIL RCPT
DATA`` as one group (DATA last, as RFC 2920 §3.1 asks), then the message once the
354 came. Without it, the same commands go one at a time, each waiting for its
reply (:attr:`SmtpWire.pipelining` False).

Replies are read in order into a queue (a multi-line reply is one; a line that
is not ``ddd[ -]text`` is a protocol error): every reply is kept, whenever it
arrives, and taken by the command it answers. A reply nobody asked for (a server
closing an idle session says ``421`` first) is found by :meth:`SmtpWire.unsolicited`
before the next transaction, so it is never paired with a command it does not
answer.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import NamedTuple, Optional

import aiosmtplib
from aiosmtplib.protocol import COMMAND_INJECTION_REGEX, PERIOD_REGEX, normalize_message_line_endings

__all__ = ["Reply", "SmtpReplyError", "SmtpWire", "reply_error"]

#: a reply line longer than this is not SMTP (RFC 5321 §4.5.3.1.5 allows 512 octets)
_MAX_LINE = 4096
#: nor is a (multi-line) reply longer than this
_MAX_REPLY = 64 * 1024


class Reply(NamedTuple):
    code: int
    text: str


class SmtpReplyError(Exception):
    """The server answered something that is not an SMTP reply: the session is
    in a state nobody knows and is closed."""


class SmtpWire(asyncio.Protocol):
    """The transport of an open session, and the replies read from it."""

    def __init__(self, transport: asyncio.Transport, *, pipelining: bool) -> None:
        self.transport = transport
        #: the server advertised PIPELINING: commands of a transaction go as one group
        self.pipelining = pipelining
        self._buffer = bytearray()
        self._lines: list[str] = []  #: the lines of a multi-line reply read so far
        self._size = 0
        self._replies: deque[Reply] = deque()
        self._waiter: Optional[asyncio.Future[None]] = None
        self._lost: Optional[BaseException] = None
        #: replies the commands written so far still wait for
        self._pending = 0

    @classmethod
    def take_over(cls, smtp: aiosmtplib.SMTP) -> "SmtpWire":
        """The dialogue of ``smtp``, a session that has connected and greeted (and
        done STARTTLS / AUTH): from now on its replies come here, and ``smtp`` is
        not used again."""
        transport = smtp.transport
        if transport is None or transport.is_closing():
            raise aiosmtplib.SMTPServerDisconnected("the session closed before its first message")
        wire = cls(transport, pipelining=smtp.supports_extension("pipelining"))  # type: ignore[arg-type]
        transport.set_protocol(wire)
        return wire

    # ------------------------------------------------------------ the protocol

    def data_received(self, data: bytes) -> None:
        if self._lost is not None:  # failed: what still arrives is not read
            return
        buf = self._buffer
        buf += data
        start = 0
        while True:
            end = buf.find(b"\n", start)
            if end < 0:
                break
            line = bytes(buf[start:end + 1])
            start = end + 1
            if not self._line(line):
                return
        del buf[:start]
        if len(buf) > _MAX_LINE:
            self._fail(SmtpReplyError(f"a reply line longer than {_MAX_LINE} octets"))
            return
        waiter = self._waiter
        if self._replies and waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _line(self, line: bytes) -> bool:
        """One line of a reply; False when it is not SMTP (the session is failed)."""
        code = line[:3]
        sep = line[3:4]
        if len(line) > _MAX_LINE or not code.isdigit() or sep not in (b" ", b"-", b"\r", b"\n"):
            self._fail(SmtpReplyError(f"not an SMTP reply: {line[:80]!r}"))
            return False
        self._size += len(line)
        if self._size > _MAX_REPLY:
            self._fail(SmtpReplyError(f"a reply longer than {_MAX_REPLY} octets"))
            return False
        self._lines.append(line[4:].strip(b" \t\r\n").decode("utf-8", "surrogateescape"))
        if sep == b"-":
            return True
        self._replies.append(Reply(int(code), "\n".join(self._lines)))
        self._lines = []
        self._size = 0
        return True

    def _fail(self, exc: BaseException) -> None:
        self._lost = exc
        self.transport.close()
        self._wake(exc)

    def _wake(self, exc: BaseException) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)
            waiter.exception()  # retrieved: nobody may await it any more

    def eof_received(self) -> bool:
        return False  # close the transport: connection_lost follows

    def connection_lost(self, exc: Optional[BaseException]) -> None:
        if self._lost is None:
            lost = aiosmtplib.SMTPServerDisconnected("the server closed the connection")
            lost.__cause__ = exc
            self._lost = lost
        self._wake(self._lost)

    # ------------------------------------------------------------ for the adapter

    @property
    def is_connected(self) -> bool:
        return self._lost is None and not self.transport.is_closing()

    def unsolicited(self) -> Optional[Reply]:
        """A reply the server sent while nothing waited for one (between messages):
        a session in that state is not used for the next message."""
        if self._pending == 0 and self._replies:
            return self._replies[0]
        return None

    def write(self, *commands: bytes) -> None:
        """Write commands (each a line without its CRLF) as one write; each
        expects one reply, taken in order by :meth:`reply`. A command holding a
        control character (a line break, a NUL, …) is refused before anything is
        written, by aiosmtplib's own rule for its commands."""
        for c in commands:
            if COMMAND_INJECTION_REGEX.search(c):
                raise ValueError(f"a control character in an SMTP command: {c[:80]!r}")
        self._send(b"\r\n".join(commands) + b"\r\n", len(commands))

    def write_message(self, message: bytes) -> None:
        """The message after a 354: dot-stuffed, line ends as CRLF, then the
        terminating dot (aiosmtplib's rules for DATA); an empty message is the dot
        alone."""
        if message:
            message = normalize_message_line_endings(message)
            message = PERIOD_REGEX.sub(b"..", message)
        self._send(message + b".\r\n", 1)

    def _send(self, data: bytes, replies: int) -> None:
        if self._lost is not None or self.transport.is_closing():
            raise aiosmtplib.SMTPServerDisconnected("the connection is closed")
        self._pending += replies
        self.transport.write(data)

    async def reply(self, timeout: float) -> Reply:
        """The next reply (in the order the commands were written), waiting at most
        ``timeout`` seconds: aiosmtplib.SMTPReadTimeoutError after that."""
        while not self._replies:
            if self._lost is not None:
                raise self._lost
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            try:
                async with asyncio.timeout(timeout):
                    await waiter
            except TimeoutError:
                raise aiosmtplib.SMTPReadTimeoutError("timed out waiting for the server's reply") from None
            finally:
                self._waiter = None
        self._pending = max(0, self._pending - 1)
        return self._replies.popleft()

    async def quit(self, timeout: float) -> None:
        try:
            self.write(b"QUIT")
            await self.reply(timeout)
        finally:
            self.close()

    def close(self) -> None:
        self.transport.close()


def reply_error(reply: Reply) -> aiosmtplib.SMTPResponseException:
    """A refusal as aiosmtplib's exception (what the adapter's handling reads)."""
    return aiosmtplib.SMTPResponseException(reply.code, reply.text)
