"""One-click unsubscribe (RFC 8058; README "Tracking"):

``GET /u/{token}``   open: a small page naming what the link turns off, with a
                     form that POSTs ``List-Unsubscribe=One-Click`` to itself.
``POST /u/{token}``  open: the body ``List-Unsubscribe=One-Click`` (form-urlencoded
                     or multipart, as mail clients send it) turns the token's
                     ``<category>.<channel>`` switch off; 200.

The token (pipeline/rules/tracking.py ``sign_unsubscribe``: user, category,
channel, producer, HMAC with the tracking key) is the only authority: RFC 8058
forbids asking the user for anything more, and a mail client POSTs without
cookies. A token this deployment did not sign is a 404 that echoes nothing (as
``/t/c/``). A category without ``one_click_unsubscribe`` (OTP, security,
transactional mail: config/defaults.toml) answers 403 with a page saying so.

The switch goes off through the same path as the preferences PUT
(routes/preferences.py ``publish_preferences``): the read model, when the user
has one, gets the switch off at the next version, and a merge update (only that
switch, over whatever the user's table holds: pipeline/rules/preferences.py)
goes to notify.preferences with ``source`` ``one_click`` and the producer of the
delivery that carried the link; the users agent applies it and records the
opt-out (agents/users.py). Clicking twice records one opt-out.
"""

from __future__ import annotations

import html
import logging
from email.parser import BytesParser
from email.policy import HTTP
from urllib.parse import parse_qs

from aiohttp import web

from pipeline.models import Preferences as Prefs
from pipeline.rules import tracking as T

from ..auth import OPEN, requires
from ..errors import api_error
from . import Routes
from .preferences import message, publish_preferences

__all__ = ["Unsubscribe", "SOURCE"]

log = logging.getLogger("notify.api")

#: the unsubscribes' ``source`` of an opt-out by the link
SOURCE = "one_click"
_HEADERS = {
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",  # the token is in the URL
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; "
                               "frame-ancestors 'none'",
}
_FIELD, _VALUE = T.ONE_CLICK_BODY.split("=", 1)
_MAX_FORM = 4096


def _page(title: str, text: str, form: bool = False, status: int = 200) -> web.Response:
    button = (f'<form method="post"><input type="hidden" name="{_FIELD}" value="{_VALUE}">'
              '<button type="submit">Unsubscribe</button></form>') if form else ""
    body = ("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{html.escape(title)}</title>"
            "<style>body{font-family:system-ui,sans-serif;max-width:32rem;margin:3rem auto;padding:0 1rem}"
            "button{font-size:1rem;padding:.5rem 1rem}</style></head>"
            f"<body><h1>{html.escape(title)}</h1><p>{text}</p>{button}</body></html>")
    return web.Response(text=body, status=status, content_type="text/html", charset="utf-8", headers=_HEADERS)


def _what(u: T.Unsubscribe) -> str:
    return f"<strong>{html.escape(u.category)}</strong> messages by <strong>{html.escape(u.channel)}</strong>"


def one_click_body(content_type: str, body: bytes) -> bool:
    """Whether a POST's body says ``List-Unsubscribe=One-Click`` (RFC 8058), as
    ``application/x-www-form-urlencoded`` or ``multipart/form-data``."""
    if len(body) > _MAX_FORM:
        return False
    ctype = content_type.split(";", 1)[0].strip().lower()
    if ctype == "multipart/form-data":
        try:
            msg = BytesParser(policy=HTTP).parsebytes(b"Content-Type: " + content_type.encode("latin-1")
                                                      + b"\r\n\r\n" + body)
            for part in msg.iter_parts():
                if part.get_param("name", header="content-disposition") == _FIELD \
                        and str(part.get_content()).strip() == _VALUE:
                    return True
        except Exception:  # noqa: BLE001 - a malformed form is no one-click
            return False
        return False
    try:
        form = parse_qs(body.decode("utf-8"), strict_parsing=False)
    except (UnicodeDecodeError, ValueError):
        return False
    return _VALUE in [v.strip() for v in form.get(_FIELD, [])]


class Unsubscribe(Routes):
    def add_to(self, router: web.UrlDispatcher) -> None:
        router.add_get("/u/{token}", self.page, allow_head=False)
        router.add_post("/u/{token}", self.one_click)

    def _token(self, request: web.Request) -> T.Unsubscribe:
        key = getattr(self.api, "tracking_key", None)
        got = T.verify_unsubscribe(key, request.match_info["token"]) if key else None
        if got is None:
            raise api_error(404, "not_found", "no such link")
        return got

    def _refusable(self, u: T.Unsubscribe) -> bool:
        cat = self.api.settings.categories.get(u.category)
        return cat is not None and cat.one_click_unsubscribe

    def _cannot(self, u: T.Unsubscribe) -> web.Response:
        return _page("These messages cannot be unsubscribed",
                     f"{_what(u)} are about your account (such as security codes and alerts, or what you "
                     "ordered) and are always sent. You can change your other messages in your settings.",
                     status=403)

    @requires(OPEN)
    async def page(self, request: web.Request) -> web.Response:
        u = self._token(request)
        if not self._refusable(u):
            return self._cannot(u)
        return _page("Unsubscribe", f"Stop receiving {_what(u)}?", form=True)

    @requires(OPEN)
    async def one_click(self, request: web.Request) -> web.Response:
        u = self._token(request)
        if not self._refusable(u):
            return self._cannot(u)
        body = await self.read(request)
        if not one_click_body(request.headers.get("Content-Type", ""), body):
            raise api_error(400, "bad_value", f"the body is {T.ONE_CLICK_BODY} (RFC 8058)", field=_FIELD)
        switch = f"{u.category}.{u.channel}"

        def build(cur: dict | None, cur_v: int) -> Prefs | None:
            if cur is None:
                return None  # no document of the API's: the merge alone says it
            switches = cur.get("switches") if isinstance(cur.get("switches"), dict) else {}
            if switches.get(switch) is False:
                return None  # off already
            doc = {**cur, "switches": {**switches, switch: False}, "version": cur_v + 1}
            try:
                return Prefs(**{k: v for k, v in doc.items() if k in Prefs._options.fields})
            except TypeError:
                return None

        def message_of(prefs: Prefs | None) -> Prefs:
            # only this switch, over whatever the user's table holds (pipeline/rules/preferences.py)
            return message(Prefs(user_id=u.user_id, version=prefs.version if prefs is not None else 0,
                                 switches={switch: False}), source=SOURCE, producer=u.producer, merge=True)

        await publish_preferences(self.api, u.user_id, build, message_of)
        return _page("You are unsubscribed", f"You will no longer receive {_what(u)}.")
