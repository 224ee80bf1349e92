"""Huawei Push Kit in the pipeline (issue 20, item 6: vendor push channels), on real
servers: a worker with the default simulator routes (push = apns, fcm, hms), the
provider simulators in a process of their own (their ledger says which provider was
called). A user with an HMS device gets the push through the hms provider; a user
with an APNs phone and an HMS token Push Kit calls invalid (80300007) gets it on the
phone, the HMS token is removed and the next push goes to the phone alone."""

from pipeline.ids import delivery_id, device_delivery_id
from tests.faults.drill import Sims
from tests.pipeline.harness import Pipeline, push_event
from tests.transport.helpers import wait_until

HMS_OK = "IQAAAACy0kYkAAAuVRy1Bq-" + "h" * 40
HMS_BAD = "bad-" + "d" * 40  # the simulator answers 80300007 (every token invalid)
APNS_OK = "c3" * 32


def test_an_hms_device_gets_its_push_through_push_kit(redis_url, tmp_path):
    sims = Sims(tmp_path / "sims").start()
    pipe = Pipeline(redis_url, tmp_path, NOTIFY_PROVIDERS="simulators", NOTIFY_SIMULATORS=str(sims.info_path))
    try:
        pipe.devices([
            {"user_id": "hm1", "platform": "hms", "token": HMS_OK, "op": "add", "at": 1000.0},
            {"user_id": "hm2", "platform": "apns", "token": APNS_OK, "op": "add", "at": 1000.0},
            {"user_id": "hm2", "platform": "hms", "token": HMS_BAD, "op": "add", "at": 1001.0},
        ])
        proc = pipe.start()
        wait_until(lambda: "Worker ready" in pipe.log() or proc.poll() is not None, 60, 0.1, "the worker ready")
        pipe.events([push_event("hm:1", "hm1"), push_event("hm:2", "hm2")])
        keys = [("hm:1", "hm1", "push"), ("hm:2", "hm2", "push")]
        rows = pipe.wait_decided(keys)

        rec = {u: delivery_id(f"hm:{u[-1]}", u, "push") for u in ("hm1", "hm2")}
        dev = {(u, p): device_delivery_id(rec[u], p, t) for u, p, t in (
            ("hm1", "hms", HMS_OK), ("hm2", "apns", APNS_OK), ("hm2", "hms", HMS_BAD))}
        # each device's token went to the provider of its platform, once
        sends = [(r["sim"], r["key"]) for r in sims.ledger() if r.get("op") == "send"]
        assert sorted(sends) == sorted([("hms", dev[("hm1", "hms")]), ("apns", dev[("hm2", "apns")]),
                                        ("hms", dev[("hm2", "hms")])]), sends
        assert {r["to"] for r in sims.ledger() if r.get("op") == "send" and r["sim"] == "hms"} == {HMS_OK, HMS_BAD}
        assert (rows[keys[0]]["status"], rows[keys[0]]["provider"]) == ("ACCEPTED", "hms")
        assert rows[keys[1]]["status"] == "ACCEPTED"
        devs = pipe.device_rows()
        assert {d: (v["status"], v["reason"], v["provider"]) for d, v in devs.items()} == {
            dev[("hm1", "hms")]: ("ACCEPTED", None, "hms"),
            dev[("hm2", "apns")]: ("ACCEPTED", None, "apns"),
            dev[("hm2", "hms")]: ("FAILED", "bad_token", "hms"),
        }

        # Push Kit said the token is invalid: it is removed, the phone stays
        wait_until(lambda: pipe.committed("notify.devices") >= 3 + 1, 30, 0.2, "the removal applied")
        pipe.events([push_event("hm:3", "hm2")], after_users=False)
        rows = pipe.wait_decided([("hm:3", "hm2", "push")], 60, "decided")
        assert rows[("hm:3", "hm2", "push")]["status"] == "ACCEPTED"
        r3 = delivery_id("hm:3", "hm2", "push")
        later = [(r["sim"], r["key"]) for r in sims.ledger() if r.get("op") == "send" and r["key"].startswith(r3)]
        assert later == [("apns", device_delivery_id(r3, "apns", APNS_OK))]
    finally:
        pipe.stop()
        sims.stop()
