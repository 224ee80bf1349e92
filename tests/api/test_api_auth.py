"""Every endpoint × auth: no key 401, wrong key 401, a key without the scope
403, the right scope passes; open endpoints need nothing; keys are stored
hashed, reloaded when the file changes, and the bootstrap key has every scope."""

from __future__ import annotations

import orjson
import pytest

from pipeline.api.auth import KeyFileError, KeyStore, add_key, list_keys, revoke_key

NID = "n_" + "0" * 20

#: (method, path, scope, request kwargs, status with the right scope)
ENDPOINTS = [
    ("POST", "/v1/events", "events:write",
     {"json": {"biz_key": "auth:1", "category": "otp", "template": "otp", "recipients": ["u1"],
               "params": {"code": "1"}}}, 202),
    ("GET", f"/v1/notifications/{NID}", "records:read", {}, 404),
    ("GET", "/v1/notifications?user_id=u1", "records:read", {}, 200),
    ("GET", "/v1/users/u1/preferences", "users:read", {}, 404),
    ("PUT", "/v1/users/u1/preferences", "users:write", {"json": {"tz": "Europe/Paris"}}, 202),
    ("PUT", "/v1/users/u1/devices/tok1", "users:write", {"json": {"platform": "apns"}}, 202),
    ("DELETE", "/v1/users/u1/devices/tok1", "users:write", {}, 202),
    ("GET", "/v1/users/u1/inbox", "users:read", {}, 200),
    ("POST", "/v1/users/u1/inbox/read", "users:write", {"json": {"all": True}}, 200),
]
#: a key that lacks each scope
LACKING = {"events:write": "reader", "records:read": "users", "users:read": "events", "users:write": "events"}
#: the key with exactly that scope
HAVING = {"events:write": "events", "records:read": "reader", "users:read": "reader", "users:write": "users"}


@pytest.mark.parametrize("method,path,scope,kw,ok", ENDPOINTS, ids=[f"{m} {p}" for m, p, *_ in ENDPOINTS])
async def test_endpoint_auth(api, method, path, scope, kw, ok):
    status, body = await api.call(method, path, None, **kw)
    assert status == 401 and body["error"]["code"] == "unauthorized", body
    status, body = await api.call(method, path, "nfk_0123456789ab_wrong", **kw)
    assert status == 401 and body["error"]["code"] == "unauthorized"
    # a real key id with a wrong secret
    kid_only = api.keys[HAVING[scope]][: len("nfk_") + 13] + "x"
    status, body = await api.call(method, path, kid_only, **kw)
    assert status == 401
    status, body = await api.call(method, path, "Basic abc", headers={"Authorization": "Basic abc"}, **kw)
    assert status == 401
    status, body = await api.call(method, path, LACKING[scope], **kw)
    assert status == 403 and body["error"]["code"] == "forbidden" and scope in body["error"]["message"]
    status, body = await api.call(method, path, HAVING[scope], **kw)
    assert status == ok, body
    status, body = await api.call(method, path, "bootstrap-demo-key", **kw)
    assert status not in (401, 403), body


async def test_open_endpoints(api):
    for path, ctype in (("/healthz", "application/json"), ("/metrics", "text/plain"), ("/", "text/html"),
                        ("/v1/openapi.json", "application/json"), ("/v1/status.json", "application/json")):
        async with api.http.get(api.url + path) as resp:
            assert resp.status == 200, path
            assert resp.headers["Content-Type"].startswith(ctype), path
    # receipts need no API key but a signature: 401 from the signature check
    status, body = await api.call("POST", "/v1/receipts/smsvendor", None, data=b"{}")
    assert status == 401 and body["error"]["code"] == "bad_signature"


async def test_json_errors_everywhere(api):
    status, body = await api.call("GET", "/nope", None)
    assert status == 404 and body["error"]["code"] == "not_found"
    status, body = await api.call("PATCH", "/v1/events", None)
    assert status == 405 and body["error"]["code"] == "method_not_allowed"
    status, body = await api.call("PUT", "/v1/users/u1/preferences", "users", data=b"[1",
                                  headers={"Content-Type": "application/json"})
    assert status == 400 and body["error"]["code"] == "bad_json"


async def test_keys_hashed_and_reloaded(api):
    raw = api.keys_path.read_bytes()
    for key in api.keys.values():
        assert key.encode() not in raw
        assert key[len("nfk_") + 13:].encode() not in raw  # nfk_<12 hex id>_<secret>
    data = orjson.loads(raw)
    entry = next(iter(data["keys"].values()))
    assert set(entry) >= {"salt", "hash", "scopes", "producer"} and len(entry["hash"]) == 64
    assert (api.keys_path.stat().st_mode & 0o777) == 0o600

    # a key added while the API runs works at once; a revoked one stops working
    kid, key = add_key(api.keys_path, "late", ["records:read"])
    status, _ = await api.call("GET", "/v1/notifications", key)
    assert status == 200
    assert any(k["key_id"] == kid and k["producer"] == "late" for k in list_keys(api.keys_path))
    assert revoke_key(api.keys_path, kid)
    status, _ = await api.call("GET", "/v1/notifications", key)
    assert status == 401


def test_key_store_rules(tmp_path):
    path = tmp_path / "k.json"
    with pytest.raises(KeyFileError):
        add_key(path, "p", ["events:delete"])
    with pytest.raises(KeyFileError):
        add_key(path, "bad name!", ["events:write"])
    _kid, key = add_key(path, "p", ["events:write", "events:write"])
    store = KeyStore(path)
    principal = store.verify(key)
    assert principal is not None and principal.producer == "p" and principal.scopes == {"events:write"}
    assert store.verify(key + "x") is None
    assert store.verify("") is None
    path.write_text("{broken")
    with pytest.raises(KeyFileError):
        KeyStore(path)
