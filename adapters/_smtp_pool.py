"""A pool of SMTP sessions to one server, reused across messages (adapters/email_smtp.py).

A session is connected, has greeted (EHLO), and has done STARTTLS / AUTH when
configured: ready for MAIL. Its ``smtp`` is the aiosmtplib client that sets it up,
then the :class:`adapters._smtp_wire.SmtpWire` that carries its messages; the pool
uses only what both have (``is_connected``, ``close``, ``quit``). The pool does not open
sessions itself; the provider does, step by step, so that it knows which stage
failed. The pool hands out slots and idle sessions:

* :meth:`SmtpPool.take` waits for a slot (at most ``size`` sessions are in use;
  waiters are served first come, first served: ``asyncio.Semaphore`` is FIFO and
  does not let a newcomer pass a waiter) and answers the most recently used idle
  session that is still connected and not idle longer than ``idle_s``, or None:
  the caller then opens a session in the slot it holds;
* :meth:`SmtpPool.give_back` returns the slot, with the session kept for the next
  message (``reusable``: the last transaction ended with a reply, clean or a
  4xx/5xx), closed at once (any other error: a timeout, a dropped connection, a
  reply we did not understand), or quit when it has carried ``max_messages``;
* sessions idle longer than ``idle_s`` are quit by a timer (QUIT, then close),
  so a quiet provider keeps no connection open; :meth:`close` quits them all.

Invariant: sessions in use + idle sessions ≤ ``size`` (a session is opened only
in a slot that holds none, and only when no idle session is left), so the server
never sees more than ``size`` connections from one provider (plus, for a moment,
the ones being quit).

The most recently used session is taken first (a stack), so a trickle of mail
keeps one or two sessions busy and lets the others expire.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable, Optional


__all__ = ["PooledSession", "SmtpPool", "SmtpPoolClosed", "SmtpPoolTimeout"]


class SmtpPoolClosed(RuntimeError):
    """The provider was closed: no new session is handed out."""


class SmtpPoolTimeout(TimeoutError):
    """No slot came free within the wait limit: nothing was sent."""


class PooledSession:
    """One open SMTP session and what the pool knows of it."""

    __slots__ = ("smtp", "messages", "idle_since", "needs_rset", "reused")

    def __init__(self, smtp: Any) -> None:
        self.smtp = smtp
        #: messages accepted over this session (for ``max_messages``)
        self.messages = 0
        #: when it was given back (the pool's clock)
        self.idle_since = 0.0
        #: the last transaction failed with a 4xx/5xx reply after MAIL: RSET before the next one
        self.needs_rset = False
        #: taken from the idle sessions (not opened for this message): the server may
        #: have closed it while it was idle
        self.reused = False


class SmtpPool:
    """Slots and idle sessions for one SMTP provider (see the module doc)."""

    def __init__(
        self,
        *,
        size: int,
        idle_s: float,
        max_messages: int,
        quit_timeout: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if size < 1:
            raise ValueError(f"pool size must be ≥ 1, not {size}")
        self.size = size
        self.idle_s = idle_s
        self.max_messages = max(1, max_messages)
        self.quit_timeout = quit_timeout
        self._clock = clock
        self._slots = asyncio.Semaphore(size)
        self._idle: list[PooledSession] = []  #: oldest first; taken from the end
        self._closed = False
        self._sweep_handle: Optional[asyncio.TimerHandle] = None
        self._quitting: set[asyncio.Task[Any]] = set()
        #: the loop the pool lives on (sessions cannot move to another loop)
        self.loop = asyncio.get_running_loop()
        #: counters, for tests and stats: sessions opened, quit, and closed without QUIT
        self.opened = 0
        self.quits = 0
        self.discarded = 0
        #: sessions found closed by the server at RSET / MAIL and replaced within the send
        self.replaced = 0

    # ------------------------------------------------------------ taking and giving back

    async def take(self, wait_s: Optional[float] = None) -> Optional[PooledSession]:
        """Wait for a slot (at most ``wait_s`` seconds when all are in use: then
        :class:`SmtpPoolTimeout`) and answer an idle session, or None: open one in
        this slot, then :meth:`opened_session` it (or :meth:`give_back` None)."""
        if self._closed:
            raise SmtpPoolClosed("the SMTP pool is closed")
        if wait_s is None or not self._slots.locked():
            await self._slots.acquire()  # when a slot is free: no wait, no timer
        else:
            try:
                async with asyncio.timeout(wait_s):
                    await self._slots.acquire()
            except TimeoutError:
                raise SmtpPoolTimeout(f"no SMTP session free within {wait_s:g} s ({self.size} in use)") from None
        if self._closed:  # closed while we waited
            self._slots.release()
            raise SmtpPoolClosed("the SMTP pool is closed")
        return self._reuse()

    def _reuse(self) -> Optional[PooledSession]:
        """The most recently used idle session that is still usable (the caller
        holds a slot), or None. Dead and stale ones met on the way are dropped."""
        now = self._clock()
        idle = self._idle
        while idle:
            s = idle.pop()
            if not s.smtp.is_connected:  # the server closed it while idle (we saw the EOF)
                self._discard(s)
                continue
            if now - s.idle_since >= self.idle_s:  # the rest are older still
                self._quit_later(s)
                while idle:
                    self._quit_later(idle.pop())
                break
            s.reused = True
            return s
        return None

    def opened_session(self, smtp: Any) -> PooledSession:
        """Wrap a session the caller opened in the slot it holds."""
        self.opened += 1
        return PooledSession(smtp)

    def give_back(self, session: Optional[PooledSession], *, reusable: bool) -> None:
        """Return the slot. ``reusable``: the session ended its transaction with a
        reply (keep it, after an RSET when ``needs_rset``); otherwise it is closed
        without QUIT (it is broken, or in a state we do not know)."""
        try:
            if session is None:
                return
            if not reusable or self._closed or not session.smtp.is_connected:
                self._discard(session)
                return
            if session.messages >= self.max_messages:
                self._quit_later(session)
                return
            session.idle_since = self._clock()
            session.reused = False
            self._idle.append(session)
            if self._sweep_handle is None:
                self._sweep_handle = self.loop.call_later(self.idle_s, self._sweep)
        finally:
            self._slots.release()

    def drop(self, session: PooledSession) -> None:
        """Close a session the server closed while it was idle; the caller keeps its
        slot, to open a fresh session in it."""
        self.replaced += 1
        self._discard(session)

    # ------------------------------------------------------------ ending sessions

    def _discard(self, session: PooledSession) -> None:
        self.discarded += 1
        session.smtp.close()

    def _quit_later(self, session: PooledSession) -> None:
        """QUIT in the background (nobody waits for it), then close."""
        task = self.loop.create_task(self._quit(session))
        self._quitting.add(task)
        task.add_done_callback(self._quitting.discard)

    async def _quit(self, session: PooledSession) -> None:
        self.quits += 1
        try:
            await session.smtp.quit(timeout=self.quit_timeout)
        except Exception:  # noqa: BLE001 - the session is done with either way
            pass
        finally:
            session.smtp.close()

    def _sweep(self) -> None:
        """Timer: quit the sessions idle for ``idle_s``; wake again when the next expires."""
        self._sweep_handle = None
        now = self._clock()
        idle = self._idle
        keep = []
        for s in idle:
            if not s.smtp.is_connected:
                self._discard(s)
            elif now - s.idle_since >= self.idle_s:
                self._quit_later(s)
            else:
                keep.append(s)
        idle[:] = keep
        if keep and not self._closed:
            delay = max(0.05, keep[0].idle_since + self.idle_s - now)
            self._sweep_handle = self.loop.call_later(delay, self._sweep)

    @property
    def idle_count(self) -> int:
        return len(self._idle)

    async def close(self) -> None:
        """Quit the idle sessions and wait for every QUIT under way. Sessions in use
        at that moment are closed (without QUIT) when they are given back; later
        takes raise :class:`SmtpPoolClosed`."""
        if self._closed:
            return
        self._closed = True
        if self._sweep_handle is not None:
            self._sweep_handle.cancel()
            self._sweep_handle = None
        idle, self._idle = self._idle, []
        for s in idle:
            if s.smtp.is_connected:
                self._quit_later(s)
            else:
                self._discard(s)
        # wake the waiters: each finds the pool closed and gives its slot back
        for _ in range(self.size):
            self._slots.release()
        if self._quitting:
            await asyncio.wait(list(self._quitting), timeout=self.quit_timeout + 1.0)
