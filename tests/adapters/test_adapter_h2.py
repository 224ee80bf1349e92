"""The HTTP/2 transport of the push adapters (adapters/_h2.py) judged by a server
of its own: an HTTP/2 server written here on the ``h2`` state machine, over TLS
with ALPN ``h2`` on 127.0.0.1, that announces few concurrent streams and a small
flow-control window, counts what it sees and misbehaves on demand (GOAWAY with
or without finishing what it took, REFUSED_STREAM, silence, a dropped
connection). It shares nothing with the APNs simulator but the certificate
helper."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Optional

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import orjson
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from hyperframe.frame import GoAwayFrame

from adapters.apns import ApnsConfig, ApnsProvider
from adapters.fcm import FcmConfig, FcmProvider
from adapters.simulators.tls import client_tls_context, server_tls_context
from pipeline.models import AttemptResult

MAX = h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS
WINDOW = h2.settings.SettingCodes.INITIAL_WINDOW_SIZE
TABLE = h2.settings.SettingCodes.HEADER_TABLE_SIZE


class Judge:
    """An HTTP/2 server on h2: every request is checked (an APNs push, or FCM's
    token and send calls) and answered after ``delay`` seconds.

    * ``max_streams`` / ``window``: the SETTINGS it announces; a request beyond
      ``max_streams`` open streams is counted in ``too_many`` and refused;
    * ``goaway_after=n``: once n requests were taken on the first connection, GOAWAY with
      the last of them as last_stream_id: later streams are not processed; with
      ``goaway_hard`` the connection is closed at once, without answering the
      streams it took, else those are answered and the connection closed after;
    * ``refuse_first``: RST_STREAM REFUSED_STREAM on the first request;
    * ``silent``: take requests and never answer; ``drop_after=n``: close the
      connection once n requests were taken, none answered.
    """

    def __init__(self, *, max_streams: int = 2, window: int = 64, delay: float = 0.005, goaway_after: Optional[int] = None,
                 goaway_hard: bool = False, refuse_first: bool = False, silent: bool = False,
                 drop_after: Optional[int] = None, raise_streams_to: Optional[int] = None,
                 header_table_size: Optional[int] = None) -> None:
        self.max_streams, self.window, self.delay = max_streams, window, delay
        self.goaway_after, self.goaway_hard = goaway_after, goaway_hard
        self.refuse_first, self.silent, self.drop_after = refuse_first, silent, drop_after
        self.raise_streams_to = raise_streams_to
        self.header_table_size = header_table_size  #: SETTINGS_HEADER_TABLE_SIZE it announces (None: the default)
        self.connections = 0
        self.max_open = 0  #: most streams open at once on a connection
        self.too_many = 0  #: streams opened beyond max_streams
        self.processed: list[dict[str, Any]] = []  #: requests taken (and acted on)
        self.ignored = 0  #: streams above a GOAWAY's last_stream_id, not processed
        self.refused = 0
        self.bad: list[str] = []  #: requests that broke a rule
        self.cert_pem, self.ctx = server_tls_context()
        self.ctx.set_alpn_protocols(["h2"])
        self._server: Optional[asyncio.AbstractServer] = None
        self._protocols: set[_JudgeProtocol] = set()
        self.port = 0

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    async def __aenter__(self) -> "Judge":
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _JudgeProtocol(self), "127.0.0.1", 0, ssl=self.ctx)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: Any) -> None:
        assert self._server is not None
        self._server.close()
        for p in list(self._protocols):
            p.abort()
        await asyncio.sleep(0)


class _JudgeProtocol(asyncio.Protocol):
    def __init__(self, judge: Judge) -> None:
        self.judge = judge
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding="utf-8"))
        self.transport: Optional[asyncio.Transport] = None
        self.open: dict[int, dict[str, Any]] = {}
        self.taken = 0
        self.last_stream_id: Optional[int] = None  #: set once GOAWAY went
        self.tasks: set[asyncio.Task] = set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.judge.connections += 1
        self.judge._protocols.add(self)
        initial = {MAX: self.judge.max_streams, WINDOW: self.judge.window}
        if self.judge.header_table_size is not None:
            initial[TABLE] = self.judge.header_table_size
        self.conn.local_settings = h2.settings.Settings(client=False, initial_values=initial)
        self.conn.initiate_connection()
        self.flush()

    def connection_lost(self, exc: Optional[BaseException]) -> None:
        self.judge._protocols.discard(self)
        for t in self.tasks:
            t.cancel()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def flush(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(self.conn.data_to_send())

    def data_received(self, data: bytes) -> None:
        try:
            events = self.conn.receive_data(data)
        except h2.exceptions.ProtocolError as exc:
            self.judge.bad.append(f"protocol error: {exc}")
            self.flush()
            self.abort()
            return
        for ev in events:
            if isinstance(ev, h2.events.RequestReceived):
                if self.last_stream_id is not None and ev.stream_id > self.last_stream_id:
                    self.judge.ignored += 1  # after our GOAWAY: not processed
                    continue
                if len(self.open) >= self.conn.local_settings.max_concurrent_streams:
                    self.judge.too_many += 1  # (h2 itself would refuse it first)
                self.open[ev.stream_id] = {"headers": dict(ev.headers), "body": bytearray()}
                self.judge.max_open = max(self.judge.max_open, len(self.open))
            elif isinstance(ev, h2.events.DataReceived):
                if ev.stream_id in self.open:
                    self.open[ev.stream_id]["body"] += ev.data
                self.conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            elif isinstance(ev, h2.events.StreamEnded):
                if ev.stream_id in self.open:
                    self.take(ev.stream_id)
            elif isinstance(ev, h2.events.StreamReset):
                self.open.pop(ev.stream_id, None)
        self.flush()

    def take(self, stream_id: int) -> None:
        judge = self.judge
        if judge.refuse_first and judge.refused == 0:
            judge.refused += 1
            self.open.pop(stream_id)
            self.conn.reset_stream(stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)
            return
        req = self.open[stream_id]
        judge.processed.append({"stream_id": stream_id, "connection": judge.connections, **req})
        self.taken += 1
        if judge.drop_after is not None and self.taken >= judge.drop_after:
            self.abort()
            return
        if judge.goaway_after is not None and self.taken == judge.goaway_after and judge.connections == 1:
            # GOAWAY written by hand, so that this h2 connection still answers the
            # streams it took (h2 closes itself on a GOAWAY it sends)
            self.last_stream_id = stream_id
            self.transport.write(GoAwayFrame(0, last_stream_id=stream_id, error_code=0).serialize())  # type: ignore[union-attr]
            for sid in [s for s in self.open if s > stream_id]:
                self.open.pop(sid)  # taken in part (headers), never processed
                judge.ignored += 1
            if judge.goaway_hard:
                self.transport.close()  # the GOAWAY goes out first  # type: ignore[union-attr]
                return
        if judge.silent:
            return
        task = asyncio.ensure_future(self.answer(stream_id, req))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def answer(self, stream_id: int, req: dict[str, Any]) -> None:
        await asyncio.sleep(self.judge.delay)
        status, headers, body = self.judge_request(req)
        self.open.pop(stream_id, None)
        if self.transport is None or self.transport.is_closing():
            return
        self.conn.send_headers(stream_id, [(":status", str(status)), *headers], end_stream=not body)
        if body:
            self.conn.send_data(stream_id, body, end_stream=True)
        if self.judge.raise_streams_to and self.conn.local_settings.max_concurrent_streams < self.judge.raise_streams_to:
            self.conn.update_settings({MAX: self.judge.raise_streams_to})  # as APNs once the token is accepted
        self.flush()
        if self.last_stream_id is not None and not self.open:
            self.transport.close()  # every stream it took is answered

    def judge_request(self, req: dict[str, Any]) -> tuple[int, list[tuple[str, str]], bytes]:
        h = req["headers"]
        body = bytes(req["body"])
        if h.get(":scheme") != "https" or h.get(":authority") != f"127.0.0.1:{self.judge.port}":
            self.judge.bad.append(f"pseudo-headers {h}")
        if "content-length" in h and int(h["content-length"]) != len(body):
            self.judge.bad.append(f"content-length {h['content-length']} for {len(body)} bytes")
        path = h.get(":path", "")
        if path == "/token":  # FCM's OAuth token (JWT bearer grant, form-encoded)
            ok = h.get(":method") == "POST" and b"grant_type=" in body and b"assertion=" in body
            return (200, [("content-type", "application/json")], orjson.dumps({"access_token": "ya29.judge", "expires_in": 3600})) if ok \
                else (400, [], b'{"error":"invalid_grant"}')
        if path.endswith("/messages:send"):
            msg = orjson.loads(body)["message"]
            if h.get("authorization") != "Bearer ya29.judge":
                return 401, [("content-type", "application/json")], b'{"error":{"code":401,"status":"UNAUTHENTICATED"}}'
            return 200, [("content-type", "application/json")], orjson.dumps({"name": f"projects/p/messages/{msg['token']}"})
        # APNs: POST /3/device/<token>, a bearer JWT, the topic, JSON with aps
        token = path.removeprefix("/3/device/")
        if h.get(":method") != "POST" or not path.startswith("/3/device/") or not h.get("authorization", "").startswith("bearer "):
            self.judge.bad.append(f"not an APNs push: {h}")
            return 400, [("content-type", "application/json")], b'{"reason":"BadPath"}'
        if h.get("apns-topic") != "com.example.judge" or "aps" not in orjson.loads(body):
            self.judge.bad.append(f"bad push: {h} {body!r}")
            return 400, [("content-type", "application/json")], b'{"reason":"BadTopic"}'
        if token.startswith("bad"):
            return 400, [("content-type", "application/json")], b'{"reason":"BadDeviceToken"}'
        return 200, [("apns-id", h["apns-id"])], b""


def _ec_pem() -> bytes:
    return ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def apns_for(judge: Judge, **kw: Any) -> ApnsProvider:
    cfg: dict[str, Any] = dict(team_id="TEAM123456", key_id="KEY1234567", private_key=_ec_pem(), topic="com.example.judge",
                               base_url=judge.url, timeout=2.0, verify=client_tls_context(judge.cert_pem))
    cfg.update(kw)
    return ApnsProvider(ApnsConfig(**cfg))


async def send_many(p: ApnsProvider, make_delivery: Any, n: int = 50) -> list[Any]:
    deliveries = [make_delivery("push", f"apns:{i:064x}", {"title": "Hi", "body": f"n{i}"}) for i in range(n)]
    return await asyncio.gather(*(p.send(d) for d in deliveries))


def apns_ids(judge: Judge) -> list[str]:
    return [r["headers"]["apns-id"] for r in judge.processed]


async def test_50_concurrent_pushes_share_one_connection_within_its_limits(make_delivery):
    """Two streams at a time and a 64-byte window: every push waits its turn (none
    refused), its body goes in window-sized pieces, all on one connection."""
    async with Judge(max_streams=2, window=64) as judge:
        p = apns_for(judge)
        try:
            results = await send_many(p, make_delivery)
            assert [r.result for r in results] == [AttemptResult.ACCEPTED] * 50, results
            assert judge.bad == [] and judge.too_many == 0
            assert judge.connections == 1 and judge.max_open == 2
            assert len(set(apns_ids(judge))) == 50 and len(judge.processed) == 50
            assert {r.provider_msg_id for r in results} == set(apns_ids(judge))
            # the answers are mapped as ever (apns_outcome), over this transport too
            r = await p.send(make_delivery("push", "apns:bad-token"))
            assert (r.result, r.permanent_kind, r.error) == (AttemptResult.PERMANENT_ERROR, "bad_token", "400 BadDeviceToken")
        finally:
            await p.close()


async def test_streams_raised_after_the_first_answer_as_apns_does(make_delivery):
    """APNs opens a connection at one stream and raises the limit once the provider
    token is accepted: the waiting pushes go as soon as the new SETTINGS arrive."""
    async with Judge(max_streams=1, window=65535, raise_streams_to=20) as judge:
        p = apns_for(judge)
        try:
            results = await send_many(p, make_delivery)
            assert [r.result for r in results] == [AttemptResult.ACCEPTED] * 50
            assert judge.too_many == 0 and judge.connections == 1 and judge.bad == []
            assert 2 <= judge.max_open <= 20
        finally:
            await p.close()


async def test_goaway_mid_run_sends_the_unprocessed_streams_again(make_delivery):
    """GOAWAY after 10 pushes: the streams it took are answered on the old
    connection; those above last_stream_id go again on a new one, and no push is
    processed twice."""
    async with Judge(max_streams=8, window=65535, goaway_after=10) as judge:
        p = apns_for(judge)
        try:
            results = await send_many(p, make_delivery)
            assert [r.result for r in results] == [AttemptResult.ACCEPTED] * 50, [r.error for r in results if r.error]
            assert judge.connections == 2 and judge.ignored > 0 and judge.bad == []
            ids = apns_ids(judge)
            assert len(ids) == 50 and len(set(ids)) == 50  # each once
            assert sum(1 for r in judge.processed if r["connection"] == 1) == 10
        finally:
            await p.close()


async def test_hard_goaway_leaves_the_taken_streams_unknown(make_delivery):
    """GOAWAY and the connection closed at once: the streams the server took (at or
    below last_stream_id) get no answer, their fate is unknown (TIMEOUT_UNKNOWN);
    those above it were not processed and are sent again."""
    async with Judge(max_streams=4, window=65535, goaway_after=3, goaway_hard=True) as judge:
        p = apns_for(judge)
        try:
            results = await send_many(p, make_delivery, 20)
            unknown = [r for r in results if r.result == AttemptResult.TIMEOUT_UNKNOWN]
            assert len(unknown) == 3 and all(r.error.startswith("connection lost after send") for r in unknown)
            assert sum(r.result == AttemptResult.ACCEPTED for r in results) == 17
            assert judge.connections == 2 and len(set(apns_ids(judge))) == 20
        finally:
            await p.close()


async def test_refused_stream_is_sent_again(make_delivery):
    async with Judge(refuse_first=True) as judge:
        p = apns_for(judge)
        try:
            r = await p.send(make_delivery("push", "apns:abcd"))
            assert r.result == AttemptResult.ACCEPTED and judge.refused == 1 and len(judge.processed) == 1
        finally:
            await p.close()


async def test_a_server_that_stops_answering_is_timeout_unknown_within_the_timeout(make_delivery):
    async with Judge(silent=True) as judge:
        p = apns_for(judge, timeout=0.3)
        try:
            t0 = time.monotonic()
            results = await send_many(p, make_delivery, 5)
            elapsed = time.monotonic() - t0
            assert [r.result for r in results] == [AttemptResult.TIMEOUT_UNKNOWN] * 5, results
            assert all(r.error.startswith("timeout after send") for r in results)
            # two streams at a time: the others waited for a free stream, not for the
            # read timeout, and each got the timeout of its own once it was sent
            assert 0.3 * 3 <= elapsed < 0.3 * 3 + 0.5
            assert len(judge.processed) == 5  # each was reset by the client, freeing its stream
        finally:
            await p.close()


async def test_a_connection_dropped_mid_request_is_timeout_unknown(make_delivery):
    async with Judge(max_streams=4, window=65535, drop_after=4) as judge:
        p = apns_for(judge)
        try:
            results = await send_many(p, make_delivery, 4)
            assert [r.result for r in results] == [AttemptResult.TIMEOUT_UNKNOWN] * 4
            assert all(r.error.startswith("connection lost after send") for r in results)
            judge.drop_after = None  # the next push opens a new connection
            r = await p.send(make_delivery("push", "apns:abcd"))
            assert r.result == AttemptResult.ACCEPTED and judge.connections == 2
        finally:
            await p.close()


async def test_untrusted_certificate_and_refused_connection_are_transient(make_delivery, free_port):
    async with Judge() as judge:
        p = apns_for(judge, verify=True)  # the system CAs: the judge's certificate is not among them
        try:
            r = await p.send(make_delivery("push", "apns:abcd"))
            assert r.result == AttemptResult.TRANSIENT_ERROR and r.error.startswith("connect:")
            assert judge.processed == []
        finally:
            await p.close()
    p = apns_for(judge, base_url=f"https://127.0.0.1:{free_port}")
    try:
        r = await p.send(make_delivery("push", "apns:abcd"))
        assert r.result == AttemptResult.TRANSIENT_ERROR and r.error.startswith("connect:")
    finally:
        await p.close()


async def test_fcm_over_http2_through_httpx(make_delivery):
    """FCM with ``http2 = true`` sends over the same transport through httpx's client:
    the OAuth token and the message, both on the judge."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    async with Judge(max_streams=2, window=64) as judge:
        p = FcmProvider(FcmConfig(project_id="p", client_email="sa@p.iam.gserviceaccount.com", private_key=key,
                                  token_uri=judge.url + "/token", base_url=judge.url, http2=True, timeout=2.0,
                                  verify=client_tls_context(judge.cert_pem)))
        try:
            results = await asyncio.gather(*(p.send(make_delivery("push", f"fcm:tok{i}")) for i in range(20)))
            assert [r.result for r in results] == [AttemptResult.ACCEPTED] * 20, results
            assert results[3].provider_msg_id == "projects/p/messages/tok3"
            assert p.token_fetches == 1 and judge.connections == 1 and judge.bad == [] and judge.too_many == 0
        finally:
            await p.close()


async def test_pool_timeout_when_no_stream_comes_free(make_delivery):
    """A stream that never frees (a silent server) makes the next pushes wait for one:
    past the pool timeout (``connect_timeout``) they are TRANSIENT_ERROR, never sent."""
    n = 3
    async with Judge(max_streams=1, silent=True) as judge:
        p = apns_for(judge, timeout=0.8, connect_timeout=0.3)
        try:
            results = await send_many(p, make_delivery, 1 + n)
            assert results[0].result == AttemptResult.TIMEOUT_UNKNOWN
            assert [r.result for r in results[1:]] == [AttemptResult.TRANSIENT_ERROR] * n
            assert all(r.error.startswith("connect: PoolTimeout") for r in results[1:])
            assert len(judge.processed) == 1
        finally:
            await p.close()


async def test_pushes_started_in_one_turn_leave_in_one_write(make_delivery):
    """A lane starts its calls in the same turn of the loop: their HEADERS and DATA
    frames go out as one socket write (counted on our side of the connection), and
    every push is answered as before."""
    async with Judge(max_streams=100, window=65535) as judge:
        p = apns_for(judge)
        try:
            assert (await p.send(make_delivery("push", "apns:" + "f" * 64))).ok  # the connection, its SETTINGS
            [conn] = p._h2._conns.values()  # noqa: SLF001 - the one connection of the origin
            writes: list[int] = []
            write = conn.transport.write

            def counted(data: bytes) -> None:
                writes.append(len(data))
                write(data)

            conn.transport.write = counted
            results = await send_many(p, make_delivery, 20)
            assert [r.result for r in results] == [AttemptResult.ACCEPTED] * 20 and judge.bad == []
            requests = [w for w in writes if w > 200]  # window updates and pings are a few bytes
            assert len(requests) == 1, writes
        finally:
            await p.close()


async def test_headers_arrive_whole_with_a_header_table_the_server_shrank(make_delivery):
    """Our HPACK encoder (adapters/_h2.py ``_Encoder``: no Huffman, no dynamic table)
    read by h2's server-side decoder: a server that announces a header table of 0
    bytes gets the size update first, and every push's path, apns-id and bearer
    token arrive as sent, over several blocks of one connection."""
    async with Judge(max_streams=100, window=65535, header_table_size=0) as judge:
        p = apns_for(judge)
        try:
            results = await send_many(p, make_delivery, 30)
            assert [r.result for r in results] == [AttemptResult.ACCEPTED] * 30 and judge.bad == []
            assert sorted(r["headers"][":path"] for r in judge.processed) == [f"/3/device/{i:064x}" for i in range(30)]
            assert sorted(apns_ids(judge)) == sorted(r.provider_msg_id for r in results)
            assert {r["headers"]["authorization"] for r in judge.processed} == {f"bearer {p.bearer_token()}"}
            assert {r["headers"]["apns-topic"] for r in judge.processed} == {"com.example.judge"}
        finally:
            await p.close()
