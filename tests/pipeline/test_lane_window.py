"""A lane is a window of calls in flight, not a batch (docs/adr/0001): one webhook
call hanging holds one slot, and the lane's other deliveries, taken with it and
after it, finish while it still hangs. Against a real worker process and a real
HTTP receiver on 127.0.0.1 (the webhook adapter's own wire format)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from aiohttp import web

from tests.pipeline.harness import Pipeline
from tests.pipeline.http_thread import serve
from tests.transport.helpers import wait_until

HANG_S = 4.0  # under the adapter's 5 s timeout: the call answers, late
USERS = [f"lw-{i}" for i in range(200)]
HUNG = USERS[0]


class Receiver:
    """A webhook receiver that answers at once, except for one user's call."""

    def __init__(self) -> None:
        self.hang_open = False
        self.hang_started = threading.Event()
        self.calls = 0
        self.port = serve(web.post("/hook/{user}", self.hook))

    async def hook(self, request: web.Request) -> web.Response:
        await request.read()
        self.calls += 1
        if request.match_info["user"] == HUNG:
            self.hang_open = True
            self.hang_started.set()
            try:
                await asyncio.sleep(HANG_S)
            finally:
                self.hang_open = False
        return web.json_response({"ok": True})

    def url(self, user: str) -> str:
        return f"http://127.0.0.1:{self.port}/hook/{user}"


@pytest.fixture
def pipe(redis_url, tmp_path):
    p = Pipeline(redis_url, tmp_path, NOTIFY_PROVIDERS="simulators")
    yield p
    p.stop()


def test_a_hanging_call_holds_one_slot_not_the_lane(pipe):
    rx = Receiver()
    pipe.preferences([{"user_id": u, "version": 1, "webhook_url": rx.url(u)} for u in USERS])
    # a receiver on this machine: allowed explicitly (only the simulators' own is by default)
    proc = pipe.start(NOTIFY_WEBHOOK_ALLOW=f"127.0.0.1:{rx.port}")
    wait_until(lambda: "Worker ready" in pipe.log() or proc.poll() is not None, 60, 0.1, "the worker ready")
    params = {"order_no": "1", "carrier": "UPS", "tracking_no": "1Z", "tracking_url": "https://t.example/x"}

    def events(users):
        return [{"biz_key": f"lw:{u}", "category": "transaction", "template": "order_shipped", "recipients": [u],
                 "channels": ["webhook"], "params": params} for u in users]

    pipe.events(events([HUNG]))
    assert rx.hang_started.wait(60), pipe.log()[-3000:]
    pipe.events(events(USERS[1:]))  # the hung call holds its slot from here on

    others = {(f"lw:{u}", u, "webhook") for u in USERS[1:]}

    def others_done():
        rows = pipe.rows()
        return all(rows.get(k, {}).get("status") == "ACCEPTED" for k in others)

    wait_until(others_done, 60, 0.05, "the other deliveries accepted")
    assert rx.hang_open, "the others finished only after the hanging call ended: the lane waited for it"
    rows = pipe.wait_rows(lambda r: r.get((f"lw:{HUNG}", HUNG, "webhook"), {}).get("status") == "ACCEPTED", 30,
                          "the hung call accepted once it answered")
    assert len([k for k in rows if k[0].startswith("lw:")]) == len(USERS)
    # each receiver call made once: nothing resent while the hung call was out
    time.sleep(0.5)
    assert rx.calls == len(USERS)
