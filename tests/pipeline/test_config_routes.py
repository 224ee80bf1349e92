"""Going live is a config change (issue 22, item 1), end to end: a worker started
with a config file whose ``[providers.*]`` and ``[routes]`` point at the provider
simulators by URL (as a deployment's point at Twilio, APNs, FCM and an SMTP relay)
delivers through those providers, under the names the config gives them, fails
over in the config's order, and refuses to start without a credential."""

import sqlite3
from pathlib import Path

from tests.faults.drill import Sims
from tests.pipeline.harness import Pipeline
from tests.transport.helpers import wait_until

from tests.adapters.test_provider_config import sim_config

NAMES = {"apns": "ios", "fcm": "android", "twilio": "sms_main", "smsvendor": "sms_backup", "smtp": "mail",
         "webhook": "hooks"}
APNS_TOKEN = "a1" * 32


def device_providers(pipe: Pipeline) -> list[tuple[str, str]]:
    con = sqlite3.connect(f"file:{pipe.db}?mode=ro", uri=True, timeout=5)
    try:
        return con.execute("SELECT provider, status FROM device_deliveries").fetchall()
    finally:
        con.close()


def test_a_worker_delivers_through_the_providers_of_its_config(redis_url, tmp_path):
    sims = Sims(tmp_path / "sims").start()
    path, secrets = sim_config(sims.info, tmp_path, names=NAMES)
    config = "receipt_poll_s = 0\n" + Path(path).read_text()
    pipe = Pipeline(redis_url, tmp_path, config=config)  # no NOTIFY_PROVIDERS: the config's routes
    try:
        # without one of its credentials the worker does not start, and says which one is missing
        proc = pipe.start("nocreds", **{k: v for k, v in secrets.items() if k != "TEST_TWILIO_AUTH_TOKEN"})
        assert proc.wait(60) == 1
        assert "providers.sms_main.auth_token_env: environment variable TEST_TWILIO_AUTH_TOKEN is not set" \
            in pipe.log("nocreds")

        pipe.preferences([
            {"user_id": "cr1", "version": 1, "phone": "+15550001234", "email": "cr1@example.com"},
            # a number of a region Twilio's account may not send to (21408): the next provider takes it
            {"user_id": "cr2", "version": 1, "phone": "+15550000010"},
        ])
        pipe.devices([{"user_id": "cr1", "platform": "apns", "token": APNS_TOKEN, "op": "add", "at": 1000.0}])
        proc = pipe.start(**secrets)
        wait_until(lambda: "Worker ready" in pipe.log() or proc.poll() is not None, 60, 0.1, "the worker ready")
        assert proc.poll() is None, pipe.log()[-3000:]
        otp = {"category": "otp", "template": "otp", "channels": ["sms"], "params": {"code": "123456"}}
        ship = {"category": "transaction", "template": "order_shipped", "channels": ["email", "push"],
                "params": {"order_no": "1", "carrier": "UPS", "tracking_no": "1Z",
                           "tracking_url": "https://t.example/x"}}
        pipe.events([{**otp, "biz_key": "cr:otp1", "recipients": ["cr1"]},
                     {**otp, "biz_key": "cr:otp2", "recipients": ["cr2"]},
                     {**ship, "biz_key": "cr:ship1", "recipients": ["cr1"]}])
        keys = [("cr:otp1", "cr1", "sms"), ("cr:otp2", "cr2", "sms"), ("cr:ship1", "cr1", "email"),
                ("cr:ship1", "cr1", "push")]
        rows = pipe.wait_decided(keys, 90)

        assert {k: (rows[k]["status"], rows[k]["provider"]) for k in keys[:3]} == {
            ("cr:otp1", "cr1", "sms"): ("ACCEPTED", "sms_main"),
            ("cr:otp2", "cr2", "sms"): ("ACCEPTED", "sms_backup"),  # failed over, in the config's order
            ("cr:ship1", "cr1", "email"): ("ACCEPTED", "mail"),
        }
        assert rows[keys[3]]["status"] == "ACCEPTED"
        assert device_providers(pipe) == [("ios", "ACCEPTED")]  # an APNs token: the provider of kind apns

        # the simulators were called by the adapters the config built
        sends = sorted((r["sim"], r.get("status")) for r in sims.ledger() if r.get("op") == "send")
        assert sends == sorted([("twilio", 201), ("twilio", 400), ("smsvendor", 200), ("smtp", 250), ("apns", 200)])
        log = pipe.log()
        assert "providers (config): " in log and f"sms: sms_main (twilio, {sims.info['twilio']['base_url']})" \
            " → sms_backup (smsvendor," in log
        for secret in secrets.values():
            if secret:
                assert secret not in log
    finally:
        pipe.stop()
        sims.stop()
