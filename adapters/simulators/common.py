"""What every provider simulator shares: the failure profile, the runtime mode,
the per-message scenarios, the call ledger and the aiohttp plumbing.

Decision order for each provider call:

1. the runtime **mode** (``POST /_sim/mode``): ``ok`` | ``down`` (answer
   ``status``, 503 by default) | ``slow`` (add ``delay`` s) | ``flaky``
   (fail with probability ``rate``) | ``ratelimit`` (429 + Retry-After
   ``retry_after``) | ``timeout`` (accept, record, then hang past the client's
   timeout). Optional ``for_s`` (revert to ok after that long) and ``count``
   (apply to the next N calls only) make bursts;
2. the per-message **scenario**, from the address (see each simulator) or a
   ``#sim=<scenario>`` marker in the text: ``invalid``, ``bad_token``,
   ``gone``, ``opted_out``, ``error`` (always 500), ``flaky`` (500 on the first
   call for that message, then ok), ``throttle`` (429 on the first call, then
   ok), ``slow``, ``hang`` (accepted then no answer: the UNKNOWN case),
   ``undelivered`` (accepted, then a failed receipt);
3. the random **profile** (:class:`SimProfile`), when no scenario applies.

Every provider call is appended to the ledger (``GET /_sim/ledger[?key=]``)
with the idempotency key (our delivery id), the decision and whether the
message was accepted, so fault tests can count calls per delivery. With a
ledger file (:meth:`SimCore.attach_ledger_file`, ``python -m adapters.simulators
--ledger PATH``) every row is also appended to that file as one JSON line, as it
happens: a fault drill reads it whatever happened to the pipeline's processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import re
import time
from collections import Counter, deque
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Awaitable, Callable, Optional

import aiohttp
import orjson
from aiohttp import web

__all__ = ["SimProfile", "Decision", "SimCore", "HttpSim", "text_scenario", "phone_scenario", "token_scenario",
           "address_scenario"]

log = logging.getLogger("notify.sim")

SCENARIOS = ("invalid", "bad_token", "gone", "opted_out", "error", "flaky", "throttle", "slow", "hang", "undelivered", "reject")

_MARKER = re.compile(r"#sim=([a-z_]+)")

#: phone numbers: the last four digits pick the scenario (e.g. +15005550001)
PHONE_SCENARIOS = {
    "0001": "invalid",
    "0002": "throttle",
    "0003": "slow",
    "0004": "hang",
    "0005": "undelivered",
    "0006": "flaky",
    "0007": "error",
    "0008": "opted_out",
}

#: push tokens: the token's prefix picks the scenario (e.g. "bad-123")
TOKEN_PREFIXES = (
    ("bad", "bad_token"),
    ("gone", "gone"),
    ("throttle", "throttle"),
    ("slow", "slow"),
    ("hang", "hang"),
    ("flaky", "flaky"),
    ("error", "error"),
)


def text_scenario(text: Any) -> Optional[str]:
    if not isinstance(text, str):
        return None
    m = _MARKER.search(text)
    return m.group(1) if m and m.group(1) in SCENARIOS else None


def phone_scenario(number: str) -> Optional[str]:
    digits = re.sub(r"\D", "", number or "")
    return PHONE_SCENARIOS.get(digits[-4:]) if len(digits) >= 4 else None


def token_scenario(token: str) -> Optional[str]:
    return _prefix_scenario(token, TOKEN_PREFIXES)


def address_scenario(address: str, prefixes: tuple[tuple[str, str], ...]) -> Optional[str]:
    """The scenario an e-mail address's local part picks by its prefix (each
    e-mail simulator has its own ``(prefix, scenario)`` list)."""
    return _prefix_scenario((address or "").split("@", 1)[0], prefixes)


def _prefix_scenario(value: str, prefixes: tuple[tuple[str, str], ...]) -> Optional[str]:
    v = (value or "").lower()
    for prefix, scenario in prefixes:
        if v.startswith(prefix):
            return scenario
    return None


@dataclass
class SimProfile:
    """Random behaviour of a simulator when no scenario applies.

    The default is a realistic, mostly-successful provider (for the demo);
    :meth:`clean` is deterministic (for tests).
    """

    #: base answer time, seconds (with slow_* below: p50 ~30 ms, p99 ~300 ms, as a
    #: provider across the internet answers)
    latency: tuple[float, float] = (0.01, 0.05)
    error_rate: float = 0.01  #: random 5xx
    ratelimit_rate: float = 0.005  #: random 429
    slow_rate: float = 0.02  #: random slow answer ...
    slow_s: tuple[float, float] = (0.15, 0.5)  #: ... of this many extra seconds
    #: random accept-then-hang until the client's timeout (TIMEOUT_UNKNOWN): real
    #: providers do it about once in a thousand calls
    timeout_rate: float = 0.001
    undelivered_rate: float = 0.02  #: accepted, then a failed receipt
    receipt_delay: tuple[float, float] = (0.3, 2.0)  #: accept → final receipt
    retry_after: float = 1.0  #: Retry-After on 429
    scenario_slow_s: float = 0.3  #: extra delay of the "slow" scenario
    hang_s: float = 30.0  #: how long a "hang" keeps the request open
    seed: Optional[int] = None

    @classmethod
    def realistic(cls, **kw: Any) -> "SimProfile":
        return cls(**kw)

    @classmethod
    def clean(cls, **kw: Any) -> "SimProfile":
        base = dict(
            latency=(0.0, 0.0),
            error_rate=0.0,
            ratelimit_rate=0.0,
            slow_rate=0.0,
            timeout_rate=0.0,
            undelivered_rate=0.0,
            receipt_delay=(0.05, 0.1),
            hang_s=5.0,
            seed=1,
        )
        base.update(kw)
        return cls(**base)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "SimProfile":
        names = {f.name for f in fields(cls)}
        kw = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items() if k in names}
        return cls(**kw)


@dataclass
class Decision:
    action: str  # ok | error | ratelimit | hang | permanent
    delay: float = 0.0
    status: int = 200
    retry_after: Optional[float] = None
    scenario: Optional[str] = None
    undelivered: bool = False
    cause: str = "ok"  # mode:<m> | scenario:<s> | random:<r> | ok


@dataclass
class _Mode:
    mode: str = "ok"
    params: dict[str, Any] = field(default_factory=dict)
    until: Optional[float] = None
    count: Optional[int] = None


class SimCore:
    """State shared by one simulator: mode, ledger, messages, background tasks."""

    MODES = ("ok", "down", "slow", "flaky", "ratelimit", "timeout")

    def __init__(self, name: str, profile: SimProfile, *, max_ledger: int = 200_000, max_messages: int = 200_000) -> None:
        self.name = name
        self.profile = profile
        self.rng = random.Random(profile.seed)
        self._mode = _Mode()
        #: bounded, so a long demo does not grow without limit (oldest rows go first)
        self.ledger: deque[dict[str, Any]] = deque(maxlen=max_ledger)
        self.max_messages = max_messages
        self.attempts: Counter[str] = Counter()
        self.messages: dict[str, dict[str, Any]] = {}
        self.by_key: dict[str, str] = {}
        self.receipts: list[dict[str, Any]] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._seq = 0
        self._ledger_fd: Optional[int] = None

    # ------------------------------------------------------------ mode

    def set_mode(self, spec: dict[str, Any]) -> dict[str, Any]:
        mode = str(spec.get("mode", "ok"))
        if mode not in self.MODES:
            raise ValueError(f"unknown mode {mode!r}; one of {self.MODES}")
        params = {k: v for k, v in spec.items() if k not in ("mode", "for_s", "count")}
        until = time.monotonic() + float(spec["for_s"]) if spec.get("for_s") else None
        count = int(spec["count"]) if spec.get("count") else None
        self._mode = _Mode(mode, params, until, count)
        log.info("sim %s: mode %s %s", self.name, mode, params)
        return self.mode_info()

    def mode_info(self) -> dict[str, Any]:
        m = self._current()
        info: dict[str, Any] = {"mode": m.mode, **m.params}
        if m.until is not None:
            info["remaining_s"] = round(max(0.0, m.until - time.monotonic()), 3)
        if m.count is not None:
            info["count"] = m.count
        return info

    def _current(self) -> _Mode:
        m = self._mode
        if m.until is not None and time.monotonic() >= m.until:
            self._mode = m = _Mode()
        return m

    def _take_mode(self) -> _Mode:
        m = self._current()
        if m.count is not None:
            m.count -= 1
            if m.count <= 0:
                self._mode = _Mode()
        return m

    # ------------------------------------------------------------ decisions

    def decide(self, key: str, scenario: Optional[str]) -> Decision:
        p = self.profile
        n = self.attempts[key] = self.attempts[key] + 1
        lo, hi = p.latency
        delay = self.rng.uniform(lo, hi) if hi > 0 else 0.0
        m = self._take_mode()
        mp = m.params
        if m.mode == "down":
            return Decision("error", delay, int(mp.get("status", 503)), cause="mode:down")
        if m.mode == "ratelimit":
            return Decision("ratelimit", delay, 429, float(mp.get("retry_after", p.retry_after)), cause="mode:ratelimit")
        if m.mode == "flaky" and self.rng.random() < float(mp.get("rate", 0.5)):
            return Decision("error", delay, int(mp.get("status", 503)), cause="mode:flaky")
        if m.mode == "timeout":
            return Decision("hang", delay, cause="mode:timeout")
        if m.mode == "slow":
            delay += float(mp.get("delay", 2.0))
        if scenario:
            cause = f"scenario:{scenario}"
            if scenario in ("invalid", "bad_token", "gone", "opted_out", "reject"):
                return Decision("permanent", delay, 400, scenario=scenario, cause=cause)
            if scenario == "error":
                return Decision("error", delay, 500, scenario=scenario, cause=cause)
            if scenario == "flaky" and n == 1:
                return Decision("error", delay, 503, scenario=scenario, cause=cause)
            if scenario == "throttle" and n == 1:
                return Decision("ratelimit", delay, 429, p.retry_after, scenario=scenario, cause=cause)
            if scenario == "slow":
                delay += p.scenario_slow_s
            if scenario == "hang":
                return Decision("hang", delay, scenario=scenario, cause=cause)
            return Decision("ok", delay, scenario=scenario, undelivered=scenario == "undelivered", cause=cause)
        r = self.rng.random()
        if r < p.error_rate:
            return Decision("error", delay, 503, cause="random:error")
        r -= p.error_rate
        if r < p.ratelimit_rate:
            return Decision("ratelimit", delay, 429, p.retry_after, cause="random:ratelimit")
        r -= p.ratelimit_rate
        if r < p.timeout_rate:
            return Decision("hang", delay, cause="random:timeout")
        r -= p.timeout_rate
        if r < p.slow_rate:
            delay += self.rng.uniform(*p.slow_s)
        return Decision("ok", delay, undelivered=self.rng.random() < p.undelivered_rate)

    # ------------------------------------------------------------ ledger

    def record(self, **entry: Any) -> dict[str, Any]:
        self._seq += 1
        row = {"seq": self._seq, "t": time.time(), "sim": self.name, **entry}
        self.ledger.append(row)
        if self._ledger_fd is not None:
            # one write(2) per row on an O_APPEND descriptor: whole lines, never interleaved
            os.write(self._ledger_fd, orjson.dumps(row, default=str) + b"\n")
        if len(self.messages) > self.max_messages:
            self._trim()
        return row

    def _trim(self) -> None:
        drop = len(self.messages) - self.max_messages // 2
        for mid in list(self.messages)[:drop]:
            msg = self.messages.pop(mid)
            key = msg.get("key") or msg.get("_key") or msg.get("client_ref")
            if key and self.by_key.get(key) == mid:
                del self.by_key[key]
        if len(self.attempts) > self.max_messages:
            self.attempts.clear()

    def attach_ledger_file(self, fd: Optional[int]) -> None:
        """Also append every ledger row, as a JSON line, to ``fd`` (opened O_APPEND;
        the caller owns it). Unbounded, unlike the in-memory ledger."""
        self._ledger_fd = fd

    def ledger_view(self, key: Optional[str] = None) -> list[dict[str, Any]]:
        if key is None:
            return list(self.ledger)
        return [r for r in self.ledger if r.get("key") == key]

    def calls(self, key: str, op: str = "send") -> int:
        """How many provider calls (sends, by default) carried this idempotency key."""
        return sum(1 for r in self.ledger if r.get("key") == key and r.get("op", "send") == op)

    def reset(self) -> None:
        self._mode = _Mode()
        self.ledger.clear()
        self.attempts.clear()
        self.messages.clear()
        self.by_key.clear()
        self.receipts.clear()

    # ------------------------------------------------------------ tasks

    def spawn(self, coro: Awaitable[Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def close(self) -> None:
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(BaseException):
                await t

    def receipt_delay(self) -> float:
        lo, hi = self.profile.receipt_delay
        return self.rng.uniform(lo, hi) if hi > 0 else 0.0


async def post_receipt(
    session: aiohttp.ClientSession,
    core: SimCore,
    url: str,
    *,
    data: Any = None,
    body: Optional[bytes] = None,
    headers: dict[str, str],
    info: dict[str, Any],
) -> None:
    """POST one receipt callback (one retry on failure) and note it."""
    status: Any = None
    for attempt in range(2):
        try:
            async with session.post(url, data=body if body is not None else data, headers=headers) as resp:
                status = resp.status
                await resp.read()
            if status < 500:
                break
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            status = f"error: {type(exc).__name__}"
        if attempt == 0:
            await asyncio.sleep(0.5)
    core.receipts.append({"t": time.time(), "url": url, "status": status, **info})


class HttpSim:
    """Base of the aiohttp (HTTP/1.1) simulators, with the ``/_sim`` control API."""

    name = "sim"

    def __init__(
        self,
        profile: Optional[SimProfile] = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        receipts_url: Optional[str] = None,
        tls_hosts: Optional[tuple[str, ...]] = None,
    ) -> None:
        self.core = SimCore(self.name, profile or SimProfile.realistic())
        self.host = host
        self.port = port
        self.receipts_url = receipts_url
        self.tls_hosts = tls_hosts
        self.cert_pem: Optional[bytes] = None  #: set with tls_hosts: the certificate to trust
        self._runner: Optional[web.AppRunner] = None
        self.session: Optional[aiohttp.ClientSession] = None

    @property
    def base_url(self) -> str:
        return f"{'https' if self.tls_hosts else 'http'}://{self.host}:{self.port}"

    # the control API ---------------------------------------------------

    async def _h_mode(self, request: web.Request) -> web.Response:
        if request.method == "GET":
            return web.json_response(self.core.mode_info())
        try:
            spec = await request.json()
            return web.json_response(self.core.set_mode(spec))
        except (ValueError, TypeError) as exc:
            return web.json_response({"error": str(exc)}, status=400)

    async def _h_ledger(self, request: web.Request) -> web.Response:
        key = request.query.get("key")
        return web.json_response({"sim": self.name, "calls": self.core.ledger_view(key), "receipts": self.core.receipts})

    async def _h_reset(self, request: web.Request) -> web.Response:
        self.core.reset()
        return web.json_response({"ok": True})

    def add_routes(self, app: web.Application) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    async def start(self) -> str:
        app = web.Application(client_max_size=1 << 20)
        app.router.add_route("*", "/_sim/mode", self._h_mode)
        app.router.add_get("/_sim/ledger", self._h_ledger)
        app.router.add_post("/_sim/reset", self._h_reset)
        self.add_routes(app)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.2)
        await self._runner.setup()
        ssl_context = None
        if self.tls_hosts:
            from .tls import server_tls_context

            self.cert_pem, ssl_context = server_tls_context(*self.tls_hosts)
        site = web.TCPSite(self._runner, self.host, self.port, ssl_context=ssl_context)
        await site.start()
        server = site._server  # noqa: SLF001 - the bound port when port=0
        if server is not None and getattr(server, "sockets", None):
            self.port = server.sockets[0].getsockname()[1]
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))
        return self.base_url

    async def stop(self) -> None:
        await self.core.close()
        if self.session is not None:
            await self.session.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # helpers -------------------------------------------------------------

    async def hang(self) -> None:
        """Keep the request open past any sane client timeout."""
        await asyncio.sleep(self.core.profile.hang_s)

    @staticmethod
    async def read_json(request: web.Request) -> tuple[bytes, Any]:
        """The request's body and its JSON (None when it is not JSON)."""
        raw = await request.read()
        try:
            return raw, orjson.loads(raw)
        except orjson.JSONDecodeError:
            return raw, None

    async def accepted(self, entry: dict[str, Any], d: Decision, msg_id: str, status: int = 200) -> None:
        """Note a message taken as ``msg_id`` in the ledger (``accepted``, with the
        answer's ``status``); on a ``hang`` decision ``accepted_no_answer``, and then
        no answer before :meth:`hang` is over."""
        if d.action == "hang":
            self.core.record(**entry, status="hang", outcome="accepted_no_answer", cause=d.cause, accepted=True,
                             msg_id=msg_id)
            await self.hang()
        else:
            self.core.record(**entry, status=status, outcome="accepted", cause=d.cause, accepted=True, msg_id=msg_id)

    def asdict(self) -> dict[str, Any]:
        return {"name": self.name, "base_url": self.base_url, "profile": asdict(self.core.profile)}


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
