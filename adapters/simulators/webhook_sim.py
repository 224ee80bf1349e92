"""A webhook receiver: the customer's endpoint that our webhook adapter calls.

* ``POST /hook/<scenario>`` (or ``/hook`` for ok): verifies the Standard
  Webhooks signature (``webhook-id``, ``webhook-timestamp``,
  ``webhook-signature: v1,<base64>``, the id signed; secret ``whsec_<base64>``)
  as a receiver using the ``standardwebhooks`` library does, with
  :func:`adapters.webhook.verify` (401 when it does not verify, or the
  timestamp is more than 5 minutes away), de-duplicates on ``webhook-id`` (a
  repeat is acknowledged and flagged ``duplicate``), keeps the body parsed as
  JSON (``body_type`` in the ledger: ``object``, ``string``, …), then answers
  by scenario: ``ok`` 200, ``error`` 500, ``flaky`` 503 on the first call,
  ``throttle`` 429 + Retry-After on the first call, ``slow``, ``hang``
  (received, then no answer), ``gone`` 410, ``reject`` 400.
* ``/_sim/mode`` and ``/_sim/ledger`` like the provider simulators.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any, Optional

import orjson
from aiohttp import web

from ..webhook import new_secret, verify
from .common import SCENARIOS, HttpSim, SimProfile

__all__ = ["WebhookSim"]

_JSON_TYPES = {dict: "object", list: "array", str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}


class WebhookSim(HttpSim):
    name = "webhook"

    def __init__(self, profile: Optional[SimProfile] = None, *, secret: Optional[str] = None, **kw: Any) -> None:
        super().__init__(profile, **kw)
        self.secret = secret or new_secret()

    def credentials(self) -> dict[str, Any]:
        return {"secret": self.secret}

    def url(self, scenario: str = "ok") -> str:
        return f"{self.base_url}/hook/{scenario}"

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/hook", self._hook)
        app.router.add_post("/hook/{scenario}", self._hook)

    async def _hook(self, request: web.Request) -> web.StreamResponse:
        core = self.core
        raw = await request.read()
        key = request.headers.get("webhook-id", "")
        sig_ok = verify(self.secret, raw, request.headers, time.time())
        entry: dict[str, Any] = {"op": "send", "method": "POST", "path": request.path, "key": key, "host": request.headers.get("Host"), "signature_ok": sig_ok}
        if not sig_ok:
            core.record(**entry, status=401, outcome="bad_signature", accepted=False)
            return web.json_response({"error": "bad signature"}, status=401)
        scenario = request.match_info.get("scenario", "ok")
        d = core.decide(key, scenario if scenario in SCENARIOS else None)
        if d.delay:
            await asyncio.sleep(d.delay)
        if d.action == "error":
            core.record(**entry, status=d.status, outcome="error", cause=d.cause, accepted=False)
            return web.json_response({"error": "oops"}, status=d.status)
        if d.action == "ratelimit":
            ra = str(max(1, math.ceil(d.retry_after or 1)))
            core.record(**entry, status=429, outcome="rate_limited", cause=d.cause, accepted=False)
            return web.json_response({"error": "slow down"}, status=429, headers={"Retry-After": ra})
        if d.action == "permanent":
            status = 410 if d.scenario == "gone" else 400
            core.record(**entry, status=status, outcome=d.scenario, cause=d.cause, accepted=False)
            return web.json_response({"error": d.scenario}, status=status)
        duplicate = key in core.by_key
        try:
            body: Any = orjson.loads(raw)
            entry["body_type"] = _JSON_TYPES.get(type(body), "invalid")
        except orjson.JSONDecodeError:
            body = raw.decode("utf-8", "replace")
            entry["body_type"] = "invalid"
        if not duplicate:
            core.messages[key] = {"key": key, "body": body, "headers": dict(request.headers), "at": time.time()}
            core.by_key[key] = key
        if d.action == "hang":
            core.record(**entry, status="hang", outcome="received_no_answer", cause=d.cause, accepted=True, duplicate=duplicate)
            await self.hang()
        else:
            core.record(**entry, status=200, outcome="received", cause=d.cause, accepted=True, duplicate=duplicate)
        return web.json_response({"received": True, "duplicate": duplicate})
