"""The providers users already have plug in by config (issue 27, items 2 and 3): a
worker whose config routes e-mail to SendGrid then Amazon SES (``[routes] email =
["sendgrid", "ses"]``), at their simulators by URL as a deployment's would be at
api.sendgrid.com and email.<region>.amazonaws.com, delivers through SendGrid; while
SendGrid answers 503 the mail fails over to SES; once SendGrid is back it takes the
mail again. Nothing is sent twice."""

import asyncio
import threading
from pathlib import Path

from adapters.simulators import SimProfile
from adapters.simulators.cloud import CloudSims, start_cloud
from tests.pipeline.harness import Pipeline
from tests.transport.helpers import wait_until

SHIP = {"category": "transaction", "template": "order_shipped", "channels": ["email"],
        "params": {"order_no": "1", "carrier": "UPS", "tracking_no": "1Z", "tracking_url": "https://t.example/x"}}


class ThreadSims:
    """The SendGrid / SES / SNS simulators on an event loop of their own thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        self.sims: CloudSims

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            self.sims = self.loop.run_until_complete(start_cloud(profile=SimProfile.clean()))
            ready.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert ready.wait(30), "the simulators did not start"

    def call(self, fn, *args):
        done = threading.Event()
        out = {}

        def run() -> None:
            out["v"] = fn(*args)
            done.set()

        self.loop.call_soon_threadsafe(run)
        assert done.wait(10)
        return out["v"]

    def sends(self, name: str) -> list[tuple[str, object]]:
        rows = self.call(lambda: list(self.sims.all[name].core.ledger))
        return [(r["to"], r["status"]) for r in rows if r.get("op") == "send"]

    def stop(self) -> None:
        fut = asyncio.run_coroutine_threadsafe(self.sims.stop(), self.loop)
        fut.result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def config(sims: CloudSims, tmp: Path) -> tuple[str, dict]:
    info = sims.as_dict()
    sg, ses = info["sendgrid"], info["ses"]
    text = f"""receipt_poll_s = 0

[providers.sendgrid]
kind = "sendgrid"
base_url = "{sg['base_url']}"
api_key_env = "TEST_SENDGRID_API_KEY"
from_addr = "notify@example.com"
from_name = "Notify"
timeout = 5

[providers.ses]
kind = "ses"
base_url = "{ses['base_url']}"
region = "{ses['region']}"
access_key_id = "{ses['access_key_id']}"
secret_access_key_file = "aws_secret_access_key"
from_addr = "notify@example.com"
timeout = 5

[routes]
email = ["sendgrid", "ses"]
push = []
sms = []
webhook = []
"""
    (tmp / "aws_secret_access_key").write_text(ses["secret_access_key"] + "\n")
    return text, {"TEST_SENDGRID_API_KEY": sg["api_key"]}


def test_email_fails_over_from_sendgrid_to_ses_and_back(redis_url, tmp_path):
    sims = ThreadSims()
    text, env = config(sims.sims, tmp_path)
    pipe = Pipeline(redis_url, tmp_path, config=text)
    try:
        users = [f"em{i}" for i in range(1, 6)]
        pipe.preferences([{"user_id": u, "version": 1, "email": f"{u}@example.com"} for u in users])
        proc = pipe.start(**env)
        wait_until(lambda: "Worker ready" in pipe.log() or proc.poll() is not None, 60, 0.1, "the worker ready")
        assert proc.poll() is None, pipe.log()[-3000:]

        # SendGrid answers 503 for a while: SES takes the mail
        sims.call(sims.sims.sendgrid.core.set_mode, {"mode": "down", "status": 503})
        pipe.events([{**SHIP, "biz_key": f"fo:{u}", "recipients": [u]} for u in users[:3]])
        keys = [(f"fo:{u}", u, "email") for u in users]
        rows = pipe.wait_decided(keys[:3], 90, "the first three decided")
        assert {k: (rows[k]["status"], rows[k]["provider"]) for k in keys[:3]} == {
            k: ("ACCEPTED", "ses") for k in keys[:3]}

        # SendGrid is back: it takes the mail again (its breaker never opened: 3 failures < 5)
        sims.call(sims.sims.sendgrid.core.set_mode, {"mode": "ok"})
        pipe.events([{**SHIP, "biz_key": f"fo:{u}", "recipients": [u]} for u in users[3:]])
        rows = pipe.wait_decided(keys, 90)
        assert {k: (rows[k]["status"], rows[k]["provider"]) for k in keys[3:]} == {
            k: ("ACCEPTED", "sendgrid") for k in keys[3:]}

        # what each provider saw: SendGrid refused three and took two; SES took three; nothing twice
        assert sorted(sims.sends("sendgrid")) == sorted(
            [(f"{u}@example.com", 503) for u in users[:3]] + [(f"{u}@example.com", 202) for u in users[3:]])
        assert sorted(sims.sends("ses")) == sorted((f"{u}@example.com", 200) for u in users[:3])
        # the rendered mail went out whole: subject, text and html, through either provider
        msgs = sims.call(lambda: [m["body"] for m in sims.sims.ses.core.messages.values()])
        assert all(m["Content"]["Simple"]["Subject"]["Data"] and m["Content"]["Simple"]["Body"] for m in msgs)
        log = pipe.log()
        assert "email: sendgrid (sendgrid, " in log and " → ses (ses, " in log, log[-3000:]
        assert env["TEST_SENDGRID_API_KEY"] not in log
    finally:
        pipe.stop()
        sims.stop()
