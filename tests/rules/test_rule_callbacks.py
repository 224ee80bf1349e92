"""Producer status callbacks, the pure parts (pipeline/rules/callbacks.py), the
signature (adapters/callbacks.py, judged by the ``standardwebhooks`` library a
producer verifies with), the door's URL check, the key file's callback secret and
the [callbacks] config."""

import asyncio
import base64

import orjson
import pytest
from standardwebhooks import Webhook, WebhookVerificationError

from adapters.callbacks import CallbackSender, signature_headers
from adapters.webhook import new_secret
from config.settings import ConfigError, load_settings
from pipeline.api.auth import KeyFileError, ProducerCallbacks, add_key, key_callback, list_keys, revoke_key
from pipeline.rules import callbacks as R
from pipeline.parsers.events import InvalidEvent, callback_url, parse_event

DEFAULTS = load_settings(env={})


def _outcome(state="ACCEPTED", retry=1, at=100.0, **kw):
    o = {"delivery_id": "n_1.sms", "notification_id": "n_1", "biz_key": "order:1", "user_id": "u1",
         "channel": "sms", "category": "transaction", "template": "t", "priority": "normal", "state": state,
         "at": at, "reason": None, "provider": "twilio", "retry_count": retry, "producer": "shop",
         "address": "+15550001234"}
    o.update(kw)
    return o


# ---------------------------------------------------------------- what a producer is told


def test_a_change_has_an_id_per_delivery_state_and_seq_and_no_address():
    c = R.change(_outcome())
    assert c["id"] == "n_1.sms.ACCEPTED.1"
    assert set(c) == {"id", *R.CHANGE_FIELDS}
    assert "+15550001234" not in orjson.dumps(c).decode()
    # the same outcome read twice is the same change; a retry's PENDING is another one
    assert R.change_id(_outcome()) == R.change_id(dict(_outcome(), at=999.0))
    assert R.change_id(_outcome("PENDING", 1)) != R.change_id(_outcome("PENDING", 2))
    assert R.change_id(_outcome("PENDING", None)) == "n_1.sms.PENDING.0"


def test_changes_are_batched_per_event_and_url_and_capped():
    a1 = _outcome("PENDING", 0, at=1.0)
    a2 = _outcome("ACCEPTED", 1, at=2.0)
    other = _outcome("PENDING", 0, biz_key="order:2")
    shop2 = _outcome("PENDING", 0, producer="shop2")
    batches = R.group([(a1, "https://a/cb"), (a2, "https://a/cb"), (a1, "https://a/cb"), (other, "https://a/cb"),
                       (shop2, "https://a/cb"), (a2, "https://b/cb")], max_batch=10)
    got = [(b.producer, b.biz_key, b.url, [cid for cid, _ in b.changes]) for b in batches]
    assert got == [
        ("shop", "order:1", "https://a/cb", ["n_1.sms.PENDING.0", "n_1.sms.ACCEPTED.1"]),  # the repeat kept once
        ("shop", "order:2", "https://a/cb", ["n_1.sms.PENDING.0"]),
        ("shop2", "order:1", "https://a/cb", ["n_1.sms.PENDING.0"]),
        ("shop", "order:1", "https://b/cb", ["n_1.sms.ACCEPTED.1"]),
    ]
    many = [(_outcome("PENDING", i, at=float(i)), "https://a/cb") for i in range(25)]
    assert [len(b.changes) for b in R.group(many, max_batch=10)] == [10, 10, 5]
    with pytest.raises(ValueError):
        R.group(many, 0)


def test_the_body_is_the_same_bytes_for_the_same_changes_and_the_message_id_follows_them():
    changes = [orjson.dumps(R.change(_outcome(s, n, at=t))) for s, n, t in
               (("DELIVERED", 1, 3.0), ("PENDING", 0, 1.0), ("ACCEPTED", 1, 2.0))]
    body, ids = R.body("shop", "order:1", changes)
    body2, ids2 = R.body("shop", "order:1", list(reversed(changes)))
    assert body == body2 and ids == ids2
    doc = orjson.loads(body)
    assert doc["type"] == "notification.status" and doc["producer"] == "shop" and doc["biz_key"] == "order:1"
    assert [c["state"] for c in doc["changes"]] == ["PENDING", "ACCEPTED", "DELIVERED"]  # as they happened
    assert R.message_id(ids) == R.message_id(reversed(ids)) and R.message_id(ids).startswith("msg_")
    assert R.message_id(ids[:2]) != R.message_id(ids)


# ---------------------------------------------------------------- backoff


def test_delay_doubles_up_to_the_cap_with_half_of_it_random():
    for n in range(1, 30):
        d = min(3600.0, 5.0 * 2 ** (n - 1))
        assert R.delay(n, 5.0, 3600.0, 0.0) == pytest.approx(d / 2)
        assert R.delay(n, 5.0, 3600.0, 0.999999) == pytest.approx(d, rel=1e-5)
    assert R.delay(1, 5.0, 3600.0, 0.5) == pytest.approx(3.75)
    assert R.delay(10_000, 5.0, 3600.0, 1.0) == 3600.0  # no overflow


def test_after_failure_retries_until_the_horizon_and_gives_up_permanent_failures_at_once():
    kw = dict(base_s=5.0, max_s=3600.0, retry_for_s=86400.0, rand=0.5)
    r = R.after_failure(1, 1000.0, 1000.0, **kw)
    assert not r.give_up and r.at == pytest.approx(1000.0 + 3.75)
    assert not R.after_failure(40, 1000.0, 1000.0 + 86399.0, **kw).give_up
    gone = R.after_failure(40, 1000.0, 1000.0 + 86400.0, error="503 Service Unavailable", **kw)
    assert gone.give_up and gone.reason == "retries_exhausted: 503 Service Unavailable"
    refused = R.after_failure(1, 1000.0, 1000.0, permanent=True, error="target_refused: loopback", **kw)
    assert refused.give_up and refused.reason.startswith("target_refused")
    # a Retry-After longer than the step is honoured, never past the cap
    assert R.after_failure(1, 0.0, 0.0, retry_after=60.0, **kw).at == 60.0
    assert R.after_failure(1, 0.0, 0.0, retry_after=1e9, **kw).at == 3600.0
    assert R.after_failure(3, 0.0, 0.0, retry_after=1.0, **kw).at == pytest.approx(15.0)


@pytest.mark.parametrize("rand", [0.0, 0.5, 0.999])
def test_the_default_schedule_tries_for_at_least_24_hours_and_reaches_an_endpoint_back_after_10_minutes(rand):
    c = DEFAULTS.callbacks
    times = R.schedule(c.base_delay_s, c.max_delay_s, c.retry_for_s, rand)
    assert times[-1] >= 86400.0  # the last try is at least 24 h after the first failure
    gaps = [b - a for a, b in zip([0.0] + times, times)]
    assert max(gaps) <= c.max_delay_s and min(gaps) >= c.base_delay_s / 2
    assert len(times) < 60  # about one try an hour once the steps reach the cap
    # an endpoint down for 10 minutes gets its callbacks at the first try after it is back
    after = next(t for t in times if t >= 600.0)
    assert after <= 600.0 + 640.0
    # the same schedule, compressed (the tests' knob): a hundredth of the steps
    fast = R.schedule(c.base_delay_s / 100, c.max_delay_s / 100, c.retry_for_s / 100, rand)
    assert [round(t * 100, 6) for t in fast] == [round(t, 6) for t in times]


# ---------------------------------------------------------------- the signature, as a producer verifies it


def test_a_producer_verifies_the_signature_with_standardwebhooks_under_any_of_its_secrets():
    old, new = new_secret(), new_secret()
    body = b'{"type":"notification.status","changes":[]}'
    ts = int(__import__("time").time())
    headers = signature_headers([new, old], "msg_1", ts, body)
    assert headers["webhook-signature"].count("v1,") == 2
    for secret in (old, new):
        assert Webhook(secret).verify(body, headers) == orjson.loads(body)
    with pytest.raises(WebhookVerificationError):
        Webhook(new_secret()).verify(body, headers)
    with pytest.raises(WebhookVerificationError):  # the id is signed
        Webhook(new).verify(body, dict(headers, **{"webhook-id": "msg_2"}))
    with pytest.raises(WebhookVerificationError):
        Webhook(new).verify(body + b" ", headers)
    with pytest.raises(ValueError):
        signature_headers([], "msg_1", ts, body)


def test_the_sender_refuses_private_targets_unless_allowed_without_any_call():
    async def run():
        calls = []

        class Never:
            async def post(self, *a, **kw):
                calls.append(a)
                raise AssertionError("no call")

            async def aclose(self):
                pass

        s = CallbackSender(client=Never())
        secret = [new_secret()]
        for url in ("http://127.0.0.1:9/cb", "http://10.0.0.1/cb", "http://[::1]/cb", "http://169.254.169.254/x",
                    "http://[::ffff:127.0.0.1]/cb", "http://2130706433/cb"):
            res = await s.post(url, "msg_1", b"{}", secret)
            assert not res.ok and res.permanent and res.error.startswith(("target_refused", "bad_address")), (url, res)
        res = await s.post("ftp://example.com/cb", "msg_1", b"{}", secret)
        assert res.permanent and "target_refused" in res.error
        res = await s.post("http://exa mple.com/cb", "msg_1", b"{}", secret)
        assert res.permanent and res.error.startswith("bad_address")
        assert calls == []
        allowed = CallbackSender(allow=("127.0.0.1:9",), timeout=0.5)
        res = await allowed.post("http://127.0.0.1:9/cb", "msg_1", b"{}", secret)  # nothing listens on 9
        assert not res.ok and not res.permanent
        await allowed.close()
        await s.close()

    asyncio.run(run())


# ---------------------------------------------------------------- the door


class _Templates:
    def has_template(self, code, version):
        return True


@pytest.mark.parametrize("url", ["https://shop.example/hooks/notify", "http://shop.example:8443/cb?x=1",
                                 "https://[2001:db8::1]/cb", "https://b\u00fccher.example/cb"])
def test_a_callback_url_is_an_http_url(url):
    assert callback_url(url) == url


@pytest.mark.parametrize("url", ["ftp://shop.example/cb", "https://", "shop.example/cb", "https://shop.example/cb\n",
                                 "https://shop.example/c b", "https://shop.example/\u202ecb", "https://shop.example/\x00",
                                 "https://user:pw@shop.example/cb", "https://shop.example:99999/cb",
                                 "https://shop.example/" + "x" * 2100, " https://shop.example/cb"])
def test_a_bad_callback_url_is_refused(url):
    with pytest.raises(InvalidEvent) as err:
        callback_url(url)
    assert err.value.field == "callback_url" and err.value.reason == "bad_value"
    assert "\n" not in str(err.value) and "\u202e" not in str(err.value)


def test_parse_event_takes_the_callback_url():
    ev = {"biz_key": "b1", "category": "transaction", "template": "t", "recipients": ["u1"]}
    assert parse_event(orjson.dumps(ev), DEFAULTS, _Templates()).callback_url is None
    assert parse_event(orjson.dumps(dict(ev, callback_url="")), DEFAULTS, _Templates()).callback_url is None
    got = parse_event(orjson.dumps(dict(ev, callback_url="https://shop.example/cb")), DEFAULTS, _Templates())
    assert got.callback_url == "https://shop.example/cb"
    for bad in (5, ["https://x"], "javascript:alert(1)"):
        with pytest.raises(InvalidEvent) as err:
            parse_event(orjson.dumps(dict(ev, callback_url=bad)), DEFAULTS, _Templates())
        assert err.value.field == "callback_url"


# ---------------------------------------------------------------- keys and config


def test_each_key_has_a_callback_secret_and_its_producer_signs_with_all_of_them(tmp_path):
    path = tmp_path / "api_keys.json"
    k1, _ = add_key(path, "shop", ["events:write"], callback_url="https://shop.example/cb")
    k2, _ = add_key(path, "shop", ["events:write"])
    k3, _ = add_key(path, "other", ["events:write"])
    s1, s2 = key_callback(path, k1)["callback_secret"], key_callback(path, k2)["callback_secret"]
    assert s1.startswith("whsec_") and len(base64.b64decode(s1[6:])) == 32 and s1 != s2
    assert key_callback(path, k1)["callback_url"] == "https://shop.example/cb"
    assert key_callback(path, k2)["callback_url"] is None
    assert [k.get("callback_url") for k in list_keys(path)] == ["https://shop.example/cb", None, None]
    assert all("callback_secret" not in k for k in list_keys(path))  # shown once, never listed
    pc = ProducerCallbacks(path, operator_secret=None)
    assert pc.default_url("shop") == "https://shop.example/cb" and pc.default_url("other") is None
    assert pc.secrets("shop") == [s2, s1]  # newest first
    assert pc.secrets("nobody") == [] and pc.secrets("") == []
    assert ProducerCallbacks(path, operator_secret="whsec_b3A=").secrets("") == ["whsec_b3A="]
    revoke_key(path, k2)
    pc2 = ProducerCallbacks(path)
    assert pc2.secrets("shop") == [s1]
    with pytest.raises(KeyFileError, match="callback"):
        add_key(path, "shop", ["events:write"], callback_url="http://user:pw@shop.example/")


def test_the_callbacks_config_section(tmp_path):
    c = DEFAULTS.callbacks
    assert c.enabled and c.base_delay_s == 5 and c.max_delay_s == 3600 and c.retry_for_s >= 86400 and c.allow == ()
    f = tmp_path / "n.toml"
    f.write_text('[callbacks]\nbase_delay_s = 0.05\nmax_delay_s = 0.5\nallow = ["127.0.0.1:8123"]\n')
    got = load_settings(f, env={"NOTIFY_CALLBACK_ALLOW": "[::1]:9000, hooks.internal"}).callbacks
    assert got.base_delay_s == 0.05 and got.max_delay_s == 0.5
    assert got.allow == ("127.0.0.1:8123", "[::1]:9000", "hooks.internal")
    for bad in ("base_delay_s = 0", "max_delay_s = 1\nbase_delay_s = 2", "concurrency = 0", "enabled = 1",
                "allow = 5", "retry_for = 5"):
        f.write_text(f"[callbacks]\n{bad}\n")
        with pytest.raises(ConfigError, match="callbacks"):
            load_settings(f, env={})
