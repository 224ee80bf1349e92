"""Push reaches every device (issue 24, item 1), on real servers: a worker, the
provider simulators in a process of their own (their call ledger says what each
provider was asked), the record store. A user with an APNs token and an FCM
token gets one call on each; a token answering Unregistered is removed and the
other stays; the record says what the deliveries add up to and the outcome
stream shows each delivery."""

import orjson

from pipeline.ids import delivery_id, device_delivery_id
from pipeline.reader import outcome_values
from tests.faults.drill import Sims
from tests.pipeline.harness import Pipeline, push_event
from tests.transport.helpers import wait_until

APNS_OK = "a1" * 32
FCM_OK = "fcm-ok-" + "f" * 40
FCM_GONE = "gone-" + "e" * 40  # the FCM simulator answers 404 UNREGISTERED
APNS_GONE = "gone" + "b" * 60  # the APNs simulator answers 410 Unregistered


def outcomes(pipe: Pipeline, r) -> list[dict]:
    out = []
    for p in range(pipe.partitions):
        out += [orjson.loads(o) for _id, f in r.xrange(f"nfs:{{notify.outcomes|{p}}}:s") for o in outcome_values(f[b"v"])]
    return out


def test_a_push_reaches_every_device_and_a_dead_token_goes_alone(redis_url, redis_sync, tmp_path):
    sims = Sims(tmp_path / "sims").start()
    pipe = Pipeline(redis_url, tmp_path, NOTIFY_PROVIDERS="simulators", NOTIFY_SIMULATORS=str(sims.info_path))
    try:
        pipe.devices([
            {"user_id": "pd1", "platform": "apns", "token": APNS_OK, "op": "add", "at": 1000.0},
            {"user_id": "pd1", "platform": "fcm", "token": FCM_OK, "op": "add", "at": 1001.0},
            {"user_id": "pd2", "platform": "apns", "token": APNS_OK, "op": "add", "at": 1000.0},
            {"user_id": "pd2", "platform": "fcm", "token": FCM_GONE, "op": "add", "at": 1001.0},
            {"user_id": "pd3", "platform": "apns", "token": APNS_GONE, "op": "add", "at": 1000.0},
            {"user_id": "pd3", "platform": "fcm", "token": FCM_GONE, "op": "add", "at": 1001.0},
            # twelve devices: the user keeps the ten most recently registered, and a push goes to those
            *({"user_id": "pd6", "platform": "fcm", "token": f"fcm-many-{j:02d}", "op": "add", "at": 2000.0 + j}
              for j in (3, 0, 7, 11, 1, 5, 9, 2, 10, 4, 8, 6)),
        ])
        proc = pipe.start()
        wait_until(lambda: "Worker ready" in pipe.log() or proc.poll() is not None, 60, 0.1, "the worker ready")
        pipe.events([push_event(f"pd:{u[-1]}", u) for u in ("pd1", "pd2", "pd3", "pd6")])
        keys = [("pd:1", "pd1", "push"), ("pd:2", "pd2", "push"), ("pd:3", "pd3", "push"), ("pd:6", "pd6", "push")]
        rows = pipe.wait_decided(keys)

        # one provider call on each device, each with its own idempotency key
        rec = {u: delivery_id(f"pd:{u[-1]}", u, "push") for u in ("pd1", "pd2", "pd3")}
        dev = {(u, p): device_delivery_id(rec[u], p, t) for u, p, t in (
            ("pd1", "apns", APNS_OK), ("pd1", "fcm", FCM_OK), ("pd2", "apns", APNS_OK), ("pd2", "fcm", FCM_GONE),
            ("pd3", "apns", APNS_GONE), ("pd3", "fcm", FCM_GONE))}
        r6 = delivery_id("pd:6", "pd6", "push")
        sends = [r for r in sims.ledger() if r.get("op") == "send"]
        many = sorted(r["to"] for r in sends if r["key"].startswith(r6 + "."))
        assert many == [f"fcm-many-{j:02d}" for j in range(2, 12)]  # the ten newest, once each
        assert rows[keys[3]]["status"] == "ACCEPTED"
        sends = [r for r in sends if not r["key"].startswith(r6 + ".")]
        calls = {(r["sim"], r["key"]): 0 for r in sends}
        for r in sends:
            calls[(r["sim"], r["key"])] += 1
        assert calls == {(p, dev[(u, p)]): 1 for (u, p) in dev}

        # the record: ACCEPTED when a provider took it for one device; FAILED only when every device failed
        assert (rows[keys[0]]["status"], rows[keys[0]]["reason"]) == ("ACCEPTED", None)
        assert (rows[keys[1]]["status"], rows[keys[1]]["reason"]) == ("ACCEPTED", None)
        assert (rows[keys[2]]["status"], rows[keys[2]]["reason"]) == ("FAILED", "bad_token")
        assert all(rows[k]["delivery_id"] == rec[k[1]] for k in keys[:3])
        # ... with each device's delivery beside it
        devs = {d: v for d, v in pipe.device_rows().items() if v["record_id"] != r6}
        assert {d: (v["record_id"], v["status"], v["reason"], v["provider"], v["devices"]) for d, v in devs.items()} == {
            dev[("pd1", "apns")]: (rec["pd1"], "ACCEPTED", None, "apns", 2),
            dev[("pd1", "fcm")]: (rec["pd1"], "ACCEPTED", None, "fcm", 2),
            dev[("pd2", "apns")]: (rec["pd2"], "ACCEPTED", None, "apns", 2),
            dev[("pd2", "fcm")]: (rec["pd2"], "FAILED", "bad_token", "fcm", 2),
            dev[("pd3", "apns")]: (rec["pd3"], "FAILED", "bad_token", "apns", 2),
            dev[("pd3", "fcm")]: (rec["pd3"], "FAILED", "bad_token", "fcm", 2),
        }
        # the outcome stream: every state change of each device's delivery, under its own id
        seen = [(o["delivery_id"], o["state"], o.get("reason"), o.get("devices")) for o in outcomes(pipe, redis_sync)
                if o["user_id"] == "pd2"]
        assert sorted(seen) == sorted([
            (dev[("pd2", "apns")], "PENDING", None, 2), (dev[("pd2", "fcm")], "PENDING", None, 2),
            (dev[("pd2", "apns")], "ACCEPTED", None, 2), (dev[("pd2", "fcm")], "FAILED", "bad_token", 2)])

        # the dead FCM token was removed, the APNs one of the same user stays: the next
        # push goes to the phone only (pd3 has no device left: unreachable)
        wait_until(lambda: pipe.committed("notify.devices") >= 18 + 3, 30, 0.2, "the removals applied")
        pipe.events([push_event("pd:4", "pd2"), push_event("pd:5", "pd3")], after_users=False)
        rows = pipe.wait_decided([("pd:4", "pd2", "push"), ("pd:5", "pd3", "push")], 60, "decided")
        assert rows[("pd:4", "pd2", "push")]["status"] == "ACCEPTED"
        assert (rows[("pd:5", "pd3", "push")]["status"], rows[("pd:5", "pd3", "push")]["reason"]) == \
            ("FILTERED", "unreachable")
        r4 = delivery_id("pd:4", "pd2", "push")
        later = [(r["sim"], r["key"]) for r in sims.ledger() if r.get("op") == "send" and r["key"].startswith(r4)]
        assert later == [("apns", device_delivery_id(r4, "apns", APNS_OK))]
    finally:
        pipe.stop()
        sims.stop()
