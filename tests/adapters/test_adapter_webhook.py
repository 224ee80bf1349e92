"""Webhook adapter: Standard Webhooks signing (judged by the ``standardwebhooks``
library), the JSON body, the SSRF target guard, and the receiver simulator."""

from __future__ import annotations

import base64
import time
from datetime import datetime, timezone

import httpx
import orjson
import pytest
from aiohttp import web
from standardwebhooks import Webhook, WebhookVerificationError

from adapters.base import QueryStatus
from adapters.webhook import (
    TargetGuard,
    TargetRefused,
    WebhookConfig,
    WebhookProvider,
    new_secret,
    sign,
    signing_key,
    verify,
)
from pipeline.models import AttemptResult

LOCAL = ("127.0.0.1",)
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"  # the Standard Webhooks spec's example secret


def _no_network(request: httpx.Request) -> httpx.Response:  # the guard must refuse before any connection
    raise AssertionError(f"request to {request.url} should have been refused")


def guarded(allow=(), resolve=None) -> WebhookProvider:
    return WebhookProvider(
        WebhookConfig(secret=SECRET, allow=allow, timeout=1.0),
        client=httpx.AsyncClient(transport=httpx.MockTransport(_no_network)),
        resolve=resolve,
    )


def fake_dns(table):
    async def resolve(host, port):
        if host not in table:
            raise OSError(f"no such host {host}")
        return table[host]

    return resolve


@pytest.mark.parametrize(
    "url",
    [
        "http://10.0.0.1/hook",
        "http://169.254.169.254/latest/meta-data",
        "http://[::1]:8080/hook",
        "http://127.0.0.1:9/hook",
        "http://[::ffff:127.0.0.1]/hook",
        "http://0.0.0.0/hook",
        "http://224.0.0.1/hook",
        "http://100.64.0.1/hook",
        "http://192.168.1.10/hook",
        "http://[fe80::1]/hook",
        "http://[fc00::1]/hook",
        "http://240.0.0.1/hook",
        "ftp://example.com/hook",
        "http://user:pw@93.184.216.34/hook",
        "http://internal.example/hook",
        "http://mixed.example/hook",
    ],
)
async def test_guard_refuses_non_public_targets(make_delivery, url):
    dns = fake_dns({"internal.example": ["10.1.2.3"], "mixed.example": ["93.184.216.34", "172.16.0.5"]})
    p = guarded(resolve=dns)
    try:
        r = await p.send(make_delivery("webhook", url, {"body": {"a": 1}}))
        assert r.result == AttemptResult.PERMANENT_ERROR and r.permanent_kind == "target_refused", r
    finally:
        await p.close()


async def test_guard_allowlist_by_cidr_and_host():
    g = TargetGuard(allow=("127.0.0.1", "10.20.0.0/16", "hooks.internal"), resolve=fake_dns({"hooks.internal": ["10.9.9.9"], "svc": ["10.20.1.1"]}))
    assert (await g.check("http://127.0.0.1:8080/x"))[3] == "127.0.0.1"
    assert (await g.check("https://svc/x"))[3] == "10.20.1.1"
    assert (await g.check("https://hooks.internal/x"))[3] == "10.9.9.9"
    with pytest.raises(TargetRefused):
        await g.check("http://10.0.0.1/")
    with pytest.raises(TargetRefused):
        await g.check("http://[::1]/")
    with pytest.raises(TargetRefused):
        await g.check("http://169.254.1.1/")
    # a public address passes without any allowlist
    assert (await TargetGuard(resolve=fake_dns({"example.com": ["93.184.216.34"]})).check("https://example.com/h"))[3] == "93.184.216.34"


async def test_unresolvable_host_is_transient(make_delivery):
    p = guarded(resolve=fake_dns({}))
    try:
        r = await p.send(make_delivery("webhook", "https://nowhere.example/h", {"body": {}}))
        assert r.result == AttemptResult.TRANSIENT_ERROR and r.error.startswith("resolve:")
    finally:
        await p.close()


def provider_for(sim, **kw) -> WebhookProvider:
    cfg = dict(secret=sim.secret, allow=LOCAL, timeout=2.0)
    cfg.update(kw)
    return WebhookProvider(WebhookConfig(**cfg))


async def test_signed_post_reaches_receiver(webhook_sim, make_delivery):
    p = provider_for(webhook_sim)
    try:
        d = make_delivery("webhook", webhook_sim.url("ok"), {"body": {"event": "order.shipped", "order": 42}})
        r = await p.send(d)
        assert r.result == AttemptResult.ACCEPTED and r.provider_msg_id == d.delivery_id
        [row] = webhook_sim.core.ledger_view(d.delivery_id)
        assert row["signature_ok"] is True and row["host"] == f"127.0.0.1:{webhook_sim.port}"
        stored = webhook_sim.core.messages[d.delivery_id]
        assert stored["body"] == {"event": "order.shipped", "order": 42}
        h = {k.lower(): v for k, v in stored["headers"].items()}
        assert h["webhook-id"] == d.delivery_id
        # the judge: the Standard Webhooks library verifies what was sent
        raw = b'{"event":"order.shipped","order":42}'
        assert Webhook(webhook_sim.secret).verify(raw, h) == {"event": "order.shipped", "order": 42}
        assert h["webhook-signature"].startswith("v1,")
    finally:
        await p.close()


class PlainReceiver:
    """A receiver as a customer writes one: aiohttp, the raw body kept, JSON parsed
    with the standard library, the signature checked with ``standardwebhooks``."""

    def __init__(self, secret: str) -> None:
        self.webhook = Webhook(secret)
        self.got: list[tuple[bytes, dict[str, str]]] = []
        self.verified: list[object] = []
        self.refused: list[str] = []
        self.port = 0

    async def handle(self, request: web.Request) -> web.Response:
        raw = await request.read()
        headers = dict(request.headers)
        self.got.append((raw, headers))
        try:
            self.verified.append(self.webhook.verify(raw, headers))
        except WebhookVerificationError as exc:
            self.refused.append(str(exc))
            return web.Response(status=401)
        return web.Response(status=204)

    async def __aenter__(self) -> "PlainReceiver":
        app = web.Application()
        app.router.add_post("/hook", self.handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def __aexit__(self, *exc) -> None:
        await self._runner.cleanup()


async def test_templated_webhook_arrives_as_an_object_and_verifies_with_standardwebhooks(make_delivery):
    """Issue 28: the template renders JSON text; the receiver must get the object
    (not a JSON string of it), signed so that ``standardwebhooks`` verifies it."""
    from config.settings import load_settings
    from pipeline.templates import Renderer

    rendered = Renderer.from_settings(load_settings(env={})).render("order_shipped", 1, "webhook", "en", {
        "order_no": "A1", "carrier": "UPS", "tracking_no": "1Z", "tracking_url": "https://t"})
    assert isinstance(rendered["body"], str)  # JSON text, as the renderer makes it
    secret = new_secret()
    async with PlainReceiver(secret) as receiver:
        p = WebhookProvider(WebhookConfig(secret=secret, allow=LOCAL, timeout=2.0))
        try:
            d = make_delivery("webhook", f"http://127.0.0.1:{receiver.port}/hook", rendered)
            r = await p.send(d)
        finally:
            await p.close()
    assert r.result == AttemptResult.ACCEPTED, (r, receiver.refused)
    [(raw, headers)] = receiver.got
    body = orjson.loads(raw)
    assert isinstance(body, dict) and body == orjson.loads(rendered["body"])
    assert receiver.verified == [body]  # standardwebhooks: verified, and the same object
    assert headers["webhook-id"] == d.delivery_id


async def test_a_template_that_renders_invalid_json_is_refused_naming_it(webhook_sim, make_delivery):
    p = provider_for(webhook_sim)
    try:
        d = make_delivery("webhook", webhook_sim.url("ok"), {"body": '{"type": "order_shipped",'})
        r = await p.send(d)
        assert r.result == AttemptResult.PERMANENT_ERROR and r.permanent_kind == "invalid_request"
        assert r.error.startswith(f"bad_webhook_json: template {d.template}:"), r.error
        assert webhook_sim.core.ledger_view(d.delivery_id) == []  # no call
        # JSON text that is a string, a list or a number is sent as that JSON, once
        d2 = make_delivery("webhook", webhook_sim.url("ok"), {"body": "[1, 2]"})
        assert (await p.send(d2)).result == AttemptResult.ACCEPTED
        assert webhook_sim.core.messages[d2.delivery_id]["body"] == [1, 2]
    finally:
        await p.close()


async def test_replay_under_a_new_id_does_not_verify(webhook_sim, make_delivery):
    """The id is signed: a captured request replayed with another webhook-id (to
    slip past de-duplication) fails the receiver's check, the library's too."""
    p = provider_for(webhook_sim)
    try:
        d = make_delivery("webhook", webhook_sim.url("ok"), {"body": {"n": 1}})
        assert (await p.send(d)).result == AttemptResult.ACCEPTED
        h = {k.lower(): v for k, v in webhook_sim.core.messages[d.delivery_id]["headers"].items()}
        raw = b'{"n":1}'
        replayed = {**h, "webhook-id": "n_other.webhook"}
        with pytest.raises(WebhookVerificationError):
            Webhook(webhook_sim.secret).verify(raw, replayed)
        async with httpx.AsyncClient() as c:
            resp = await c.post(webhook_sim.url("ok"), content=raw, headers={k: v for k, v in replayed.items()
                                                                              if k.startswith("webhook-")})
        assert resp.status_code == 401
        assert webhook_sim.core.ledger_view("n_other.webhook")[0]["outcome"] == "bad_signature"
    finally:
        await p.close()


async def test_wrong_secret_is_refused_by_receiver(webhook_sim, make_delivery):
    p = provider_for(webhook_sim, secret=new_secret())
    try:
        r = await p.send(make_delivery("webhook", webhook_sim.url("ok"), {"body": {}}))
        assert r.result == AttemptResult.PERMANENT_ERROR and r.error.startswith("401")
    finally:
        await p.close()


@pytest.mark.parametrize(
    "scenario,result,kind",
    [
        ("error", AttemptResult.TRANSIENT_ERROR, None),
        ("gone", AttemptResult.PERMANENT_ERROR, "gone"),
        ("reject", AttemptResult.PERMANENT_ERROR, "rejected"),
        ("throttle", AttemptResult.RATE_LIMITED, None),
    ],
)
async def test_receiver_answers(webhook_sim, make_delivery, scenario, result, kind):
    p = provider_for(webhook_sim)
    try:
        r = await p.send(make_delivery("webhook", webhook_sim.url(scenario), {"body": {}}))
        assert (r.result, r.permanent_kind) == (result, kind)
        if result == AttemptResult.RATE_LIMITED:
            assert r.retry_after == 1.0
    finally:
        await p.close()


async def test_timeout_is_unknown_and_resend_is_flagged_duplicate(webhook_sim, make_delivery):
    p = provider_for(webhook_sim, timeout=0.3)
    try:
        d = make_delivery("webhook", webhook_sim.url("hang"), {"body": {"x": 1}})
        r = await p.send(d)
        assert r.result == AttemptResult.TIMEOUT_UNKNOWN
        q = await p.query(d.delivery_id)
        assert (q.supported, q.status) == (False, QueryStatus.NOT_FOUND)
        webhook_sim.core.set_mode({"mode": "ok"})
        d2 = d.derive(address=webhook_sim.url("ok"))
        assert (await p.send(d2)).result == AttemptResult.ACCEPTED
        rows = webhook_sim.core.ledger_view(d.delivery_id)
        assert [row.get("duplicate") for row in rows] == [False, True]
    finally:
        await p.close()


def test_sign_and_verify_agree_with_standardwebhooks():
    body = b'{"a":1}'
    ts = int(time.time())
    lib = Webhook(SECRET)
    ours = sign(SECRET, "msg_1", ts, body)
    assert ours == lib.sign("msg_1", datetime.fromtimestamp(ts, tz=timezone.utc), body)  # byte for byte
    assert signing_key(SECRET) == base64.b64decode(SECRET[len("whsec_"):])
    headers = {"webhook-id": "msg_1", "webhook-timestamp": str(ts), "webhook-signature": ours}
    assert verify(SECRET, body, headers, now=ts + 10)
    assert lib.verify(body, headers) == {"a": 1}
    rotated = {**headers, "webhook-signature": "v1,AAAA " + ours}  # several signatures, space-separated
    assert verify(SECRET, body, rotated, now=ts) and lib.verify(body, rotated)
    assert verify([new_secret(), SECRET], body, headers, now=ts)  # the receiver holds two secrets
    assert not verify(SECRET, body + b" ", headers, now=ts)  # tampered body
    assert not verify(new_secret(), body, headers, now=ts)  # wrong secret
    assert not verify(SECRET, body, {**headers, "webhook-id": "msg_2"}, now=ts)  # the id is signed
    assert not verify(SECRET, body, {**headers, "webhook-timestamp": str(ts + 1)}, now=ts)
    assert not verify(SECRET, body, headers, now=ts + 301)  # stale
    assert not verify(SECRET, body, headers, now=ts - 301)  # from the future
    assert not verify(SECRET, body, {**headers, "webhook-timestamp": "abc"}, now=ts)
    assert not verify(SECRET, body, {k: v for k, v in headers.items() if k != "webhook-signature"}, now=ts)
    assert not verify(SECRET, body, {**headers, "webhook-signature": "v2," + ours[3:]}, now=ts)
    assert new_secret().startswith("whsec_") and len(signing_key(new_secret())) == 32
    with pytest.raises(ValueError):
        signing_key("whsec_not base64!")


async def test_https_pinned_to_checked_address_keeps_name_for_tls(profile, make_delivery):
    """The request goes to the address the guard checked, while TLS (SNI and
    certificate check) and Host use the URL's name: the certificate names only
    hooks.test, not 127.0.0.1."""
    from adapters.simulators.tls import client_tls_context
    from adapters.simulators.webhook_sim import WebhookSim

    sim = WebhookSim(profile, tls_hosts=("hooks.test",))
    await sim.start()
    calls = []

    async def resolve(host, port):
        calls.append(host)
        return ["127.0.0.1"]

    p = WebhookProvider(
        WebhookConfig(secret=sim.secret, allow=LOCAL, timeout=2.0, verify=client_tls_context(sim.cert_pem)), resolve=resolve
    )
    try:
        d = make_delivery("webhook", f"https://hooks.test:{sim.port}/hook/ok", {"body": {"a": 1}})
        r = await p.send(d)
        assert r.result == AttemptResult.ACCEPTED, r
        assert calls == ["hooks.test"]
        [row] = sim.core.ledger_view(d.delivery_id)
        assert row["host"] == f"hooks.test:{sim.port}" and row["signature_ok"]
    finally:
        await p.close()
        await sim.stop()
