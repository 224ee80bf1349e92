"""The API under hostile requests: every route the aiohttp app has (enumerated,
so a new route cannot be forgotten) refuses a missing, wrong or malformed key
and a key without its scope, unless it is one of the documented open routes;
a handler that declares no scope is closed to every key; receipts need a valid,
fresh, unseen signature (also across API processes sharing Redis); and the
limits on body size, recipients and params give a clear 4xx."""

from __future__ import annotations

import re
import time

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from adapters.receipts import twilio_signature, vendor_signature_header
from pipeline.api.auth import OPEN, SCOPES, SIGNED, add_key

from tests.api.conftest import TWILIO_TOKEN, VENDOR_SECRET

#: the routes open without a key: health and metrics (the issue), plus the status
#: page, its JSON (documented open like /metrics, no message contents) and the
#: OpenAPI document. Anything else marked OPEN fails this test.
OPEN_ROUTES = {("GET", "/healthz"), ("GET", "/metrics"), ("GET", "/"), ("GET", "/v1/status.json"),
               ("GET", "/v1/openapi.json")}
SIGNED_ROUTES = {("POST", "/v1/receipts/{provider}")}
#: open, the signed token in the path being the authority (tracked links, the open pixel, the
#: one-click unsubscribe link of RFC 8058, which must take a POST without any key or cookie):
#: a token this deployment did not sign is a 404
TRACKED_ROUTES = {("GET", "/t/c/{token}"), ("GET", "/t/o/{token}.gif"), ("GET", "/u/{token}"), ("POST", "/u/{token}")}
SAMPLE = {"id": "u1", "token": "tok1", "provider": "twilio", "name": "ship-v2"}


def routes(app: web.Application):
    for route in app.router.routes():
        if route.method in ("HEAD", "OPTIONS", "*"):
            continue
        canonical = route.resource.canonical
        path = re.sub(r"\{(\w+)\}", lambda m: SAMPLE[m.group(1)], canonical)
        yield route.method, canonical, path, getattr(route.handler, "scope", None)


def test_every_route_declares_its_scope(api_app_factory):
    app = api_app_factory()
    found = list(routes(app))
    assert len(found) >= 15
    for method, canonical, _path, scope in found:
        assert scope in SCOPES or scope in (OPEN, SIGNED), f"{method} {canonical} declares no scope"
        if scope == OPEN:
            assert (method, canonical) in OPEN_ROUTES | TRACKED_ROUTES, f"{method} {canonical} is open to anyone"
        if scope == SIGNED:
            assert (method, canonical) in SIGNED_ROUTES


async def test_every_route_refuses_bad_keys_and_scopes(api):
    lacking = {s: add_key(api.keys_path, f"no-{s.split(':')[0]}", [o for o in SCOPES if o != s])[1] for s in SCOPES}
    only = {s: add_key(api.keys_path, f"only-{s.split(':')[0]}", [s])[1] for s in SCOPES}
    bad_headers = [
        {},
        {"Authorization": "Bearer"},
        {"Authorization": "Bearer nfk_0123456789ab_wrong"},
        {"Authorization": "Bearer " + only[SCOPES[0]][:-2] + "xx"},  # a real key id, another secret
        {"Authorization": "Basic " + only[SCOPES[0]]},
        {"Authorization": only[SCOPES[0]]},  # no scheme
        {"X-Api-Key": only[SCOPES[0]]},
    ]
    checked = 0
    for method, canonical, path, scope in routes(api.app):
        if scope in (OPEN, SIGNED):
            continue
        kw = {"data": b"{}", "headers": {"Content-Type": "application/json"}} if method in ("POST", "PUT") else {}
        for h in bad_headers:
            async with api.http.request(method, api.url + path, headers={**kw.get("headers", {}), **h},
                                        data=kw.get("data")) as resp:
                body = await resp.json()
                assert resp.status == 401 and body["error"]["code"] == "unauthorized", (method, canonical, h, body)
                assert resp.headers.get("WWW-Authenticate", "").startswith("Bearer")
        status, body = await api.call(method, path, lacking[scope], **kw)
        assert status == 403 and body["error"]["code"] == "forbidden", (method, canonical, body)
        status, body = await api.call(method, path, only[scope], **kw)
        assert status not in (401, 403), (method, canonical, body)
        checked += 1
    assert checked >= 9


async def test_open_routes_answer_without_a_key(api):
    for method, canonical, path, scope in routes(api.app):
        if scope == OPEN:
            async with api.http.request(method, api.url + path, allow_redirects=False) as resp:
                expected = 404 if (method, canonical) in TRACKED_ROUTES else 200  # "tok1" is no signed token
                assert resp.status == expected, (method, canonical)


async def test_a_handler_without_a_scope_is_closed(api_app_factory):
    app = api_app_factory()

    async def forgot(request):  # no @requires
        return web.json_response({"secret": True})

    app.router.add_get("/v1/forgotten", forgot)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as http:
            url = str(server.make_url("/v1/forgotten"))
            async with http.get(url) as resp:
                assert resp.status == 401
            key = api_app_factory.keys["all"]
            async with http.get(url, headers={"Authorization": f"Bearer {key}"}) as resp:
                assert resp.status == 403 and (await resp.json())["error"]["code"] == "forbidden"
    finally:
        await server.close()


async def test_unauthenticated_large_body_is_refused_before_it_is_read(api):
    status, body = await api.call("POST", "/v1/events", None, data=b"x" * (3 << 20),
                                  headers={"Content-Type": "application/json"})
    assert status == 401


# ------------------------------------------------------------------ limits


def event(**kw):
    return {"biz_key": f"lim:{time.time_ns()}", "category": "otp", "template": "otp", "recipients": ["u1"],
            "params": {"code": "1"}, **kw}


async def test_limits_give_clear_4xx(api):
    cases = [
        (event(recipients=[f"u{i}" for i in range(10001)]), 400, "too_many_recipients", "recipients"),
        (event(params={"code": "1", "a": [[[[[[[[1]]]]]]]]}), 400, "params_too_deep", "params"),
        (event(params={"code": "1", "blob": "x" * 70_000}), 400, "params_too_large", "params"),
        (event(params={"code": "1", "blob": "x" * 300_000}), 413, "oversized", None),
    ]
    for body, status, code, field in cases:
        got, resp = await api.call("POST", "/v1/events", "events", json=body)
        assert (got, resp["error"]["code"], resp["error"].get("field")) == (status, code, field), resp
        assert resp["error"]["message"]
    big = b"{" + b" " * (5 << 20) + b"}"
    for method, path, who in (("PUT", "/v1/users/u1/preferences", "users"), ("PUT", "/v1/users/u1/devices/t1", "users"),
                              ("POST", "/v1/users/u1/inbox/read", "users"), ("POST", "/v1/receipts/smsvendor", None)):
        got, resp = await api.call(method, path, who, data=big, headers={"Content-Type": "application/json"})
        assert got == 413 and resp["error"]["code"] == "too_large", (method, path, resp)
    got, resp = await api.call("PUT", "/v1/users/u1/devices/" + "a" * 513, "users", json={"platform": "apns"})
    assert got == 400 and resp["error"]["field"] == "token"
    got, resp = await api.call("PUT", "/v1/users/" + "u" * 129 + "/preferences", "users", json={})
    assert got == 400 and resp["error"]["field"] == "id"


# ------------------------------------------------------------------ receipts


def _vendor(body: bytes, secret=VENDOR_SECRET, ts=None):
    ts = str(int(time.time())) if ts is None else ts
    return {"Content-Type": "application/json", "X-Vendor-Timestamp": ts,
            "X-Vendor-Signature": vendor_signature_header(secret, ts, body)}


async def test_receipt_signatures_and_replays_across_api_processes(api, api_app_factory):
    """Two API instances (as two processes behind a balancer) share the replay guard
    in Redis: a callback taken by one is a replay at the other."""
    other = TestServer(api_app_factory(), host="127.0.0.1")
    await other.start_server()
    try:
        other_url = str(other.make_url("")).rstrip("/")
        body = orjson.dumps({"message_id": "vm_x1", "status": "delivered"})
        headers = _vendor(body)
        async with api.http.post(api.url + "/v1/receipts/smsvendor", data=body, headers=headers) as resp:
            assert resp.status == 200 and (await resp.json()) == {"received": 1}
        async with api.http.post(other_url + "/v1/receipts/smsvendor", data=body, headers=headers) as resp:
            assert resp.status == 401 and (await resp.json())["error"]["code"] == "replay"

        form = {"MessageSid": "SMx1", "MessageStatus": "delivered", "AccountSid": "AC1"}
        sig = twilio_signature(TWILIO_TOKEN, api.url + "/v1/receipts/twilio", form)
        status, resp = await api.call("POST", "/v1/receipts/twilio", None, data=form, headers={"X-Twilio-Signature": sig})
        assert status == 200
        sig2 = twilio_signature(TWILIO_TOKEN, other_url + "/v1/receipts/twilio", form)
        async with api.http.post(other_url + "/v1/receipts/twilio", data=form, headers={"X-Twilio-Signature": sig2}) as r:
            assert r.status == 200  # signed for another URL: another callback (the guard keys on signatures)
        async with api.http.post(other_url + "/v1/receipts/twilio", data=form, headers={"X-Twilio-Signature": sig2}) as r:
            # taken already: acknowledged, as Twilio retries identical callbacks, and
            # never written twice (issue 28: 200, not a 401 replay)
            assert r.status == 200 and (await r.json()) == {"received": 0}
    finally:
        await other.close()


@pytest.mark.parametrize("mutate", ["body", "timestamp", "secret", "nan", "missing", "scheme"])
async def test_bad_vendor_signatures_are_refused(api, mutate):
    body = orjson.dumps({"message_id": f"vm_{mutate}", "status": "delivered"})
    headers = _vendor(body)
    if mutate == "body":
        body = body.replace(b"delivered", b"failed")
    elif mutate == "timestamp":
        headers["X-Vendor-Timestamp"] = str(int(headers["X-Vendor-Timestamp"]) + 1)
    elif mutate == "secret":
        headers = _vendor(body, secret="guess")
    elif mutate == "nan":
        headers = _vendor(body, ts="nan")
    elif mutate == "missing":
        del headers["X-Vendor-Signature"]
    elif mutate == "scheme":
        headers["X-Vendor-Signature"] = headers["X-Vendor-Signature"].replace("sha256=", "sha1=")
    status, resp = await api.call("POST", "/v1/receipts/smsvendor", None, data=body, headers=headers)
    assert status in (400, 401) and resp["error"]["code"] in ("bad_signature", "malformed"), resp
    status, resp = await api.call("GET", "/v1/notifications?biz_key=x", "reader")
    assert status == 200


async def test_hostile_receipt_bodies_never_500(api):
    """Signed but malformed bodies (the signature is valid: a provider bug or a leaked
    secret) are 400 malformed, never a 500, and write nothing the pipeline would
    dead-letter."""
    for doc in ({"receipts": 5}, {"receipts": [{"message_id": {"a": 1}, "status": "delivered"}]},
                {"message_id": "m", "status": ["delivered"]}, {"message_id": "x" * 300, "status": "delivered"},
                {"message_id": "m", "status": "failed", "error": {"code": 1}}, [1, 2], "s", 5):
        body = orjson.dumps(doc)
        status, resp = await api.call("POST", "/v1/receipts/smsvendor", None, data=body, headers=_vendor(body))
        assert status == 400 and resp["error"]["code"] == "malformed", (doc, resp)
    form = {"MessageSid": "S" * 300, "MessageStatus": "delivered"}
    sig = twilio_signature(TWILIO_TOKEN, api.url + "/v1/receipts/twilio", form)
    status, resp = await api.call("POST", "/v1/receipts/twilio", None, data=form, headers={"X-Twilio-Signature": sig})
    assert status == 400 and resp["error"]["code"] == "malformed"
    # a form body that is not UTF-8
    status, resp = await api.call("POST", "/v1/receipts/twilio", None, data=b"MessageSid=\xff\xfe&MessageStatus=x",
                                  headers={"Content-Type": "application/x-www-form-urlencoded",
                                           "X-Twilio-Signature": "x"})
    assert status in (400, 401), resp


async def test_open_status_page_masks_recipients_in_dead_letters(api):
    """/v1/status.json is open: a dead letter's detail or key that quotes a hostile
    value (here a phone number sent as a time zone, an e-mail as a user id) is masked,
    and the payload is never shown."""
    from pipeline.models import DeadLetter
    from tests.transport.helpers import produce_async

    dl = DeadLetter(source="notify.preferences", reason="bad_timezone", at=time.time(),
                    payload='{"user_id": "jane.doe@example.org", "tz": "+15550009876", "phone": "+15550001234"}',
                    detail="bad_timezone: tz (not an IANA time zone: '+15550009876')", key="jane.doe@example.org")
    await produce_async(api.redis_url, "notify.dlq", [(b"jane.doe@example.org", dl.dumps())], partitions=4)
    status, doc = await api.call("GET", "/v1/status.json", None)
    assert status == 200
    text = orjson.dumps(doc).decode()
    for secret in ("+15550009876", "+15550001234", "jane.doe@example.org"):
        assert secret not in text, secret
    [row] = doc["dead_letters"]
    assert row["detail"] == "bad_timezone: tz (not an IANA time zone: '+15*******76')"
    assert row["key"] == "j***@example.org"
