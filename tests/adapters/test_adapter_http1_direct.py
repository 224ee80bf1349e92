"""The HTTP/1.1 adapters send straight through their transport's aiohttp session
(:class:`adapters._http.Direct`, issue 18 item 3) instead of through
``httpx.AsyncClient``. The judge is the path they had: every adapter built as it
ships sends the same delivery as the same adapter given the client it used to build
(``client=``: through httpx's client layers), to a server of the test's own that
keeps the raw requests; the two requests must be the same on the wire (method,
target, every header, body) and the answers, whatever the server does (errors,
timeouts, dropped connections, redirects, a gzip answer, cookies), must map to the
same SendResult. Twilio's request is also judged by twilio's own client."""

from __future__ import annotations

import asyncio
import datetime
import gzip
from typing import Any, Awaitable, Callable, Optional
from urllib.parse import parse_qsl

import httpx
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from adapters import _http
from adapters._aiohttp import Answer
from adapters._http import client_for, make_client
from adapters.fcm import FcmConfig, FcmProvider
from adapters.sendgrid import SendGridConfig, SendGridProvider
from adapters.ses import SesConfig, SesProvider
from adapters.sms_twilio import TwilioConfig, TwilioSmsProvider
from adapters.sms_vendor import VendorSmsConfig, VendorSmsProvider
from adapters.sns import SnsSmsConfig, SnsSmsProvider
from adapters.webhook import WebhookConfig, WebhookProvider
from pipeline.models import Delivery

OK_BODY = {
    "twilio": b'{"sid": "SM0123", "status": "queued"}',
    "smsvendor": b'{"message_id": "m-1", "status": "accepted"}',
    "webhook": b"",
    "fcm": b'{"name": "projects/p1/messages/1"}',
    "sendgrid": b"",
    "ses": b'{"MessageId": "ses-1"}',
    "sns": b"<PublishResponse><PublishResult><MessageId>sns-1</MessageId></PublishResult></PublishResponse>",
}
CHANNEL = {"twilio": "sms", "smsvendor": "sms", "sns": "sms", "webhook": "webhook", "fcm": "push", "sendgrid": "email",
           "ses": "email"}
PROVIDERS = list(CHANNEL)


class Request:
    def __init__(self, line: bytes, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        self.method, self.target, self.version = line.decode().split(" ", 2)
        self.headers = headers
        self.body = body

    def wire(self) -> tuple[str, str, list[tuple[bytes, bytes]], bytes]:
        """What two requests must share: the header names are compared in lower
        case, in any order (HTTP gives neither a meaning)."""
        return self.method, self.target, sorted((k.lower(), v) for k, v in self.headers), self.body

    def header(self, name: str) -> Optional[str]:
        for k, v in self.headers:
            if k.lower() == name.encode():
                return v.decode()
        return None


Answerer = Callable[[Request], Awaitable[Optional[bytes]]]


class RawServer:
    """HTTP/1.1 on asyncio streams, keep-alive: keeps every request as received;
    ``answer(request)`` gives the bytes to write back (None: close the connection
    without answering; it may also sleep)."""

    def __init__(self) -> None:
        self.requests: list[Request] = []
        self.connections = 0
        self.open = 0
        self.most_open = 0
        self.answer: Answerer = self.ok
        self.ok_body = b""
        self.port = 0
        self._tasks: set[asyncio.Task] = set()

    async def ok(self, req: Request) -> Optional[bytes]:
        return response(200, self.ok_body, [(b"content-type", b"application/json"), (b"x-message-id", b"sg-1")])

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.connections += 1
        self.open += 1
        self.most_open = max(self.most_open, self.open)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                line, *rest = head[:-4].split(b"\r\n")
                headers = [tuple(h.split(b": ", 1)) for h in rest]
                n = next((int(v) for k, v in headers if k.lower() == b"content-length"), 0)
                req = Request(line, headers, await reader.readexactly(n))  # type: ignore[arg-type]
                self.requests.append(req)
                out = await self.answer(req)
                if out is None:
                    return
                writer.write(out)
                await writer.drain()
        finally:
            self.open -= 1
            writer.close()

    async def __aenter__(self) -> "RawServer":
        self._server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self._server.close()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def response(status: int, body: bytes = b"", headers: list[tuple[bytes, bytes]] = (), reason: bytes = b"OK") -> bytes:
    head = [f"HTTP/1.1 {status} ".encode() + reason] + [k + b": " + v for k, v in headers]
    head.append(b"content-length: " + str(len(body)).encode())
    return b"\r\n".join(head) + b"\r\n\r\n" + body


_RSA = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
    serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()


def build(name: str, url: str, old: bool, **kw: Any) -> Any:
    """The adapter ``name`` to the server at ``url``: as it ships (``old`` False), or
    given the client it built before the direct path (``old`` True)."""
    timeout = kw.pop("timeout", 2.0)
    if name == "twilio":
        cfg = TwilioConfig(account_sid="AC0123", auth_token="secret", from_number="+15005550006", base_url=url,
                           status_callback="https://hooks.example/twilio?x=1&y=a b", timeout=timeout, **kw)
        return TwilioSmsProvider(cfg, client=client_for(cfg) if old else None)
    if name == "smsvendor":
        cfg = VendorSmsConfig(api_key="vk-1", base_url=url + "/prefix/", sender="NOTIFY", timeout=timeout, **kw)
        return VendorSmsProvider(cfg, client=client_for(cfg, headers={"x-api-key": cfg.api_key}) if old else None)
    if name == "webhook":
        cfg = WebhookConfig(secret="whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", allow=("127.0.0.1",), timeout=timeout,
                            **kw)
        client = make_client(timeout=cfg.timeout, connect_timeout=cfg.connect_timeout, verify=cfg.verify,
                             max_connections=cfg.max_connections, headers={"user-agent": cfg.user_agent})
        return WebhookProvider(cfg, clock=lambda: 1_700_000_000.0, client=client if old else None)
    if name == "fcm":
        cfg = FcmConfig(project_id="p1", client_email="sa@p1.iam.gserviceaccount.com", private_key=_RSA,
                        base_url=url, token_uri=url + "/token", timeout=timeout, **kw)
        p = FcmProvider(cfg, client=client_for(cfg) if old else None)
        p._token.put("ya29.test-token", 3600)
        return p
    if name == "sendgrid":
        cfg = SendGridConfig(api_key="SG.key", from_addr="noreply@example.com", from_name="Notify", base_url=url,
                             timeout=timeout, **kw)
        return SendGridProvider(cfg, client=client_for(cfg) if old else None)
    if name == "ses":
        cfg = SesConfig(region="eu-west-1", access_key_id="AKIDEXAMPLE", secret_access_key="s" * 40,
                        session_token="tok", from_addr="noreply@example.com", base_url=url + "/",
                        configuration_set="cs", timeout=timeout, **kw)
        return SesProvider(cfg, client=client_for(cfg, cfg.endpoint) if old else None)
    if name == "sns":
        cfg = SnsSmsConfig(region="eu-west-1", access_key_id="AKIDEXAMPLE", secret_access_key="s" * 40, base_url=url,
                           sender_id="NOTIFY", timeout=timeout, **kw)
        return SnsSmsProvider(cfg, client=client_for(cfg, cfg.endpoint) if old else None)
    raise AssertionError(name)


def delivery(name: str, url: str, **kw: Any) -> Delivery:
    address = {"sms": "+14155550123", "email": "ann@example.com", "push": "fcm:tok-1",
               "webhook": url + "/hook/a?b=c%20d&e=%C3%BC"}[CHANNEL[name]]
    content = {"title": "Hi ü", "body": "Your code is 123456 & more", "subject": "Hi", "text": "Hi ü",
               "html": "<p>Hi</p>", "data": {"n": 1}}
    if name == "webhook":
        content = {"body": {"type": "order.shipped", "ü": [1, 2.5, None]}}
    fields = dict(delivery_id="n_00000000000000000001." + CHANNEL[name], notification_id="n_00000000000000000001",
                  biz_key="b:1", user_id="u1", channel=CHANNEL[name], category="transaction", template="t",
                  priority="high", address=address, content=content)
    fields.update(kw)
    return Delivery(**fields)


@pytest.fixture
def frozen_aws_clock(monkeypatch):
    """SigV4 signs the time (X-Amz-Date): both paths sign the same second."""
    import botocore.auth

    now = datetime.datetime(2026, 12, 5, 12, 0, 0)
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda *a, **k: now)


async def send_both(name: str, server: RawServer, **kw: Any):
    """The SendResults and the requests of the shipped adapter and of the old path,
    ``kw`` overriding the delivery's fields."""
    out = []
    for old in (False, True):
        p = build(name, server.url, old)
        try:
            direct = getattr(p, "_route", None) or getattr(p, "_direct", None)
            assert (direct is None) == old
            before = len(server.requests)
            r = await p.send(delivery(name, server.url, **kw))
            out.append((r, server.requests[before:]))
        finally:
            await p.close()
    return out


def same_result(a: Any, b: Any) -> None:
    fields = ("result", "provider", "provider_msg_id", "retry_after", "error", "permanent_kind", "fault")
    assert {f: getattr(a, f) for f in fields} == {f: getattr(b, f) for f in fields}


# ---------------------------------------------------------------- the same request on the wire


@pytest.mark.parametrize("name", PROVIDERS)
async def test_the_same_request_as_through_httpx_client(name, frozen_aws_clock):
    async with RawServer() as server:
        server.ok_body = OK_BODY[name]
        (new, [got]), (old, [want]) = await send_both(name, server)
    assert got.wire() == want.wire()
    assert new.result == "ACCEPTED", new
    same_result(new, old)
    names = {k.lower() for k, _ in got.headers}
    assert {b"host", b"user-agent", b"accept", b"accept-encoding", b"content-length"} <= names
    assert len(names) == len(got.headers)  # no header twice


async def test_twilios_own_client_sends_the_same_message():
    """twilio's library (``Client.messages.create`` over its own HTTP client, to the
    same server) as the judge of the send: the same method and path, the same form
    fields, the same Basic credentials and content type."""
    from twilio.rest import Client

    d = delivery("twilio", "")
    async with RawServer() as server:
        server.ok_body = OK_BODY["twilio"]
        p = build("twilio", server.url, old=False)
        try:
            assert (await p.send(d)).result == "ACCEPTED"
        finally:
            await p.close()
        server.answer = lambda req: server.ok(req)
        server.ok_body = b'{"sid": "SM0123", "status": "queued", "account_sid": "AC0123"}'
        judge = Client("AC0123", "secret")
        judge.api.base_url = server.url
        await asyncio.to_thread(judge.messages.create, to=d.address, from_="+15005550006", body=d.content["body"],
                                status_callback="https://hooks.example/twilio?x=1&y=a b")
        ours, theirs = server.requests
    assert (ours.method, ours.target) == (theirs.method, theirs.target) == (
        "POST", "/2010-04-01/Accounts/AC0123/Messages.json")
    assert parse_qsl(ours.body.decode(), keep_blank_values=True, strict_parsing=True) != []
    assert dict(parse_qsl(ours.body.decode(), strict_parsing=True)) == dict(parse_qsl(theirs.body.decode(),
                                                                                       strict_parsing=True))
    for name in ("authorization", "content-type"):
        assert ours.header(name) == theirs.header(name), name
    assert ours.header("x-notify-idempotency-key") == d.delivery_id


# ---------------------------------------------------------------- the same answers


async def _hang(req: Request) -> Optional[bytes]:
    await asyncio.sleep(5)
    return None


async def _close(req: Request) -> Optional[bytes]:
    return None


async def _garbage(req: Request) -> Optional[bytes]:
    return b"HTTP/1.1 abc\r\nthis is not http\r\n\r\n"


async def _truncated(req: Request) -> Optional[bytes]:
    return b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{\"sid\""


async def _redirect(req: Request) -> Optional[bytes]:
    return response(302, b"", [(b"location", b"http://169.254.169.254/latest")], b"Found")


async def _gzip(req: Request) -> Optional[bytes]:
    body = b'{"sid": "SMgz", "message_id": "m-gz", "name": "projects/p1/messages/gz", "MessageId": "gz"}'
    return response(200, gzip.compress(body), [(b"content-encoding", b"gzip"), (b"content-type", b"application/json"),
                                               (b"x-message-id", b"sg-gz")])


async def _bad_gzip(req: Request) -> Optional[bytes]:
    return response(200, b"not gzip at all", [(b"content-encoding", b"gzip")])


async def _rate(req: Request) -> Optional[bytes]:
    return response(429, b'{"code": 20429, "message": "Too Many Requests", "error": "rate"}',
                    [(b"retry-after", b"7"), (b"content-type", b"application/json; charset=latin-1")],
                    b"Too Many Requests \xff")


async def _error_text(req: Request) -> Optional[bytes]:
    body = "<ErrorResponse><Error><Code>Throttling</Code><Message>slow ü</Message></Error></ErrorResponse>"
    return response(400, body.encode("latin-1"), [(b"content-type", b"text/xml; charset=iso-8859-1"),
                                                  (b"x-amzn-errortype", b"Throttling:http://internal")], b"Bad Request")


async def _cookie(req: Request) -> Optional[bytes]:
    assert req.header("cookie") is None  # the first call's cookie is never sent back
    return response(503, b'{"error": {"status": "UNAVAILABLE"}}', [(b"set-cookie", b"AWSALB=abc; Path=/")],
                    b"Service Unavailable")


ANSWERS = {"hang": _hang, "close": _close, "garbage": _garbage, "truncated": _truncated, "redirect": _redirect,
           "gzip": _gzip, "bad_gzip": _bad_gzip, "rate": _rate, "error_text": _error_text}


@pytest.mark.parametrize("answer", list(ANSWERS))
@pytest.mark.parametrize("name", PROVIDERS)
async def test_the_same_result_whatever_the_server_does(name, answer, frozen_aws_clock):
    async with RawServer() as server:
        server.answer = ANSWERS[answer]
        results = []
        for old in (False, True):
            p = build(name, server.url, old, timeout=0.3)
            try:
                results.append(await p.send(delivery(name, server.url)))
            finally:
                await p.close()
    new, old_r = results
    same_result(new, old_r)
    expected = {"hang": "TIMEOUT_UNKNOWN", "close": "TIMEOUT_UNKNOWN", "garbage": "TIMEOUT_UNKNOWN",
                "truncated": "TIMEOUT_UNKNOWN", "bad_gzip": "TRANSIENT_ERROR", "rate": "RATE_LIMITED"}
    if answer in expected:
        assert new.result == expected[answer], new
    if answer == "gzip" and name != "sns":  # decoded as httpx decodes it (SNS answers XML: no MessageId in JSON)
        assert new.result == "ACCEPTED" and new.provider_msg_id, new
    if answer == "redirect":  # never followed: the receiver's address is not called
        assert new.result != "ACCEPTED" and len(server.requests) == 2


@pytest.mark.parametrize("name", PROVIDERS)
async def test_cookies_are_never_sent_back(name, frozen_aws_clock):
    """httpx's client kept a provider's cookies and sent them back; the direct path
    keeps none (the change's one difference on the wire, see _http.Direct)."""
    async with RawServer() as server:
        server.answer = _cookie
        p = build(name, server.url, old=False)
        try:
            for _ in range(2):
                assert (await p.send(delivery(name, server.url))).result == "TRANSIENT_ERROR"
        finally:
            await p.close()
    assert [r.header("cookie") for r in server.requests] == [None, None]


@pytest.mark.parametrize("name", PROVIDERS)
async def test_unreachable_closed_and_not_ascii_are_the_same(name, free_port, frozen_aws_clock):
    url = f"http://127.0.0.1:{free_port}"
    for kw in ({}, {"category": "caté"}, {"delivery_id": "n_ü.sms"}):
        results = []
        for old in (False, True):
            p = build(name, url, old)
            try:
                results.append(await p.send(delivery(name, url, **kw)))
            finally:
                await p.close()
        same_result(*results)
    results = []
    for old in (False, True):  # sent after close(): httpx's RuntimeError, no new session
        p = build(name, url, old)
        await p.close()
        results.append(await p.send(delivery(name, url)))
        if not old:
            assert p._client._transport._session is None
    same_result(*results)
    assert results[0].result == "TRANSIENT_ERROR" and "closed" in results[0].error


async def test_the_connection_pool_and_its_limit_are_the_clients():
    """Sends and queries share one pool of ``max_connections`` kept-alive
    connections; a send waiting for one longer than the connect timeout was never
    sent (TRANSIENT_ERROR)."""
    async with RawServer() as server:
        server.ok_body = OK_BODY["twilio"]

        async def slow(req: Request) -> Optional[bytes]:
            await asyncio.sleep(0.05)
            return await server.ok(req)

        server.answer = slow
        p = build("twilio", server.url, old=False, max_connections=2)
        try:
            rs = await asyncio.gather(*(p.send(delivery("twilio", server.url)) for _ in range(10)))
            assert {r.result for r in rs} == {"ACCEPTED"}
            await p.query("n_x.sms", "SM0123")
            assert server.connections == 2 and server.most_open == 2
        finally:
            await p.close()
        server.answer = _hang
        p = build("twilio", server.url, old=False, max_connections=1, timeout=1.0, connect_timeout=0.2)
        try:
            first = asyncio.ensure_future(p.send(delivery("twilio", server.url)))
            await asyncio.sleep(0.05)
            second = await p.send(delivery("twilio", server.url))
            assert second.result == "TRANSIENT_ERROR" and second.error.startswith("connect: ConnectTimeout"), second
            assert (await first).result == "TIMEOUT_UNKNOWN"
        finally:
            await p.close()


async def test_a_transport_not_ours_goes_through_the_client(monkeypatch):
    """The benchmark's baseline swaps the transport for httpx's own: then there is
    no direct path, and the client sends, as before."""
    monkeypatch.setattr(_http, "AiohttpTransport", lambda max_connections, verify: httpx.AsyncHTTPTransport())
    async with RawServer() as server:
        server.ok_body = OK_BODY["twilio"]
        p = build("twilio", server.url, old=False)
        try:
            assert p._route is None
            assert (await p.send(delivery("twilio", server.url))).result == "ACCEPTED"
        finally:
            await p.close()


def test_an_answer_reads_as_httpx_reads_a_response():
    raw = [(b"Content-Type", b"text/plain; charset=iso-8859-1"), (b"Retry-After", b"1"), (b"retry-after", b"2"),
           (b"X-Odd", "é".encode("latin-1"))]
    body = "café".encode("latin-1")
    a = Answer(429, raw, body, "Too Many ü")
    h = httpx.Response(429, headers=raw, content=body, extensions={"reason_phrase": "Too Many ü".encode()})
    assert (a.status_code, a.content, a.text, a.reason_phrase) == (h.status_code, h.content, h.text, h.reason_phrase)
    assert a.headers.get("retry-after") == h.headers.get("retry-after") == "1, 2"
    assert a.headers.get("x-odd") == h.headers.get("x-odd")
    for ct in (b"application/json", b"application/json; charset=nope", b"text/plain; charset=utf-16"):
        body = '{"a": "ü"}'.encode("utf-16" if b"16" in ct else "utf-8")
        a, h = Answer(200, [(b"content-type", ct)], body), httpx.Response(200, headers=[(b"content-type", ct)],
                                                                            content=body)
        assert a.text == h.text and a.json() == h.json()
    assert Answer(200, [], b"").text == "" and Answer(204, [], b"", None).reason_phrase == ""
    with pytest.raises(ValueError):
        Answer(200, [], b"{nope").json()
