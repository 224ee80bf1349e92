"""Webhook adapter: signing, the SSRF target guard, and the receiver simulator."""

from __future__ import annotations

import hashlib
import hmac

import httpx
import pytest

from adapters.base import QueryStatus
from adapters.webhook import TargetGuard, TargetRefused, WebhookConfig, WebhookProvider, sign, verify_signature
from pipeline.models import AttemptResult

LOCAL = ("127.0.0.1",)


def _no_network(request: httpx.Request) -> httpx.Response:  # the guard must refuse before any connection
    raise AssertionError(f"request to {request.url} should have been refused")


def guarded(allow=(), resolve=None) -> WebhookProvider:
    return WebhookProvider(
        WebhookConfig(secret="s", allow=allow, timeout=1.0),
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
        raw = b'{"event":"order.shipped","order":42}'
        expected = hmac.new(webhook_sim.secret.encode(), h["x-notify-timestamp"].encode() + b"." + raw, hashlib.sha256).hexdigest()
        assert h["x-notify-signature"] == f"sha256={expected}"
        assert h["x-notify-id"] == d.delivery_id
    finally:
        await p.close()


async def test_wrong_secret_is_refused_by_receiver(webhook_sim, make_delivery):
    p = provider_for(webhook_sim, secret="not-the-secret")
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


def test_verify_signature():
    body = b'{"a":1}'
    ts = 1_700_000_000
    header = "sha256=" + sign("k", ts, body)
    assert verify_signature("k", str(ts), body, header, now=ts + 10)
    assert verify_signature(b"k", ts, body, "sha256=deadbeef, " + header, now=ts)  # rotation: any listed value
    assert not verify_signature("k", ts, body + b" ", header, now=ts)  # tampered body
    assert not verify_signature("other", ts, body, header, now=ts)  # wrong secret
    assert not verify_signature("k", ts + 1, body, header, now=ts)  # timestamp not the signed one
    assert not verify_signature("k", ts, body, header, now=ts + 301)  # stale
    assert not verify_signature("k", ts, body, header, now=ts - 301)  # from the future
    assert not verify_signature("k", "abc", body, header, now=ts)
    assert not verify_signature("k", ts, body, None, now=ts)
    assert not verify_signature("k", ts, body, "md5=" + sign("k", ts, body), now=ts)


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
