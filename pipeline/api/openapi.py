"""The OpenAPI 3 document of the API, written by hand (served at ``/v1/openapi.json``).

:func:`build_openapi` fills in the configured categories and limits, so the
schema says what this deployment accepts; the tests check the running server
against it with schemathesis.
"""

from __future__ import annotations

import copy
import zoneinfo
from typing import Any

from config.settings import CHANNELS, PRIORITIES
from pipeline.models import State
from pipeline.parsers.events import MAX_BIZ_KEY, MAX_ID, forbidden_id_ranges

__all__ = ["build_openapi"]

def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    if isinstance(schema.get("type"), str):
        out = {**schema, "type": [schema["type"], "null"]}
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
        return out
    return {"anyOf": [schema, {"type": "null"}]}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _err(description: str) -> dict[str, Any]:
    return _json(_ref("Error"), description)


#: "has a character that Python's str.strip() keeps" (the validators strip first);
#: spelled out because \\s differs between Python and ECMA regexes
_NONBLANK = "[^\t\n\x0b\x0c\r \x1c-\x1f\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]"
#: the characters no id may hold (controls, format characters, line/paragraph separators)
_BAD = "".join(chr(a) if a == b else f"{chr(a)}-{chr(b)}" for a, b in forbidden_id_ranges())
#: an id: none of those anywhere, and something strip() keeps
_ID_PATTERN = f"^[^{_BAD}]*{_NONBLANK[:-1]}{_BAD}][^{_BAD}]*$"
_ID = {"type": "string", "minLength": 1, "maxLength": MAX_ID, "pattern": _ID_PATTERN}
_USER_PATH = {"name": "id", "in": "path", "required": True, "description": "user id", "schema": _ID}
_AUTH_ERRORS = {
    "401": _err("no API key, or a wrong one"),
    "403": _err("the key lacks the scope this operation needs"),
}
_NUM = {"type": "number"}
#: unix seconds, or an ISO 8601 date / date-time
_TIME = (r"^([0-9]{1,10}(\.[0-9]+)?|[0-9]{4}-[0-9]{2}-[0-9]{2}"
         r"([T ][0-9]{2}:[0-9]{2}(:[0-9]{2}(\.[0-9]{1,6})?)?(Z|[+-][0-9]{2}:[0-9]{2})?)?)$")
_NNUM = _nullable(_NUM)
_NSTR = _nullable({"type": "string"})


def _templates(renderer: Any) -> tuple[list[str], list[int]]:
    """Template codes and versions the renderer knows (from its index)."""
    index = getattr(renderer, "_index", None) or {}
    codes = sorted({k[0] for k in index})
    versions = sorted({k[1] for k in index})
    return codes, versions


def build_openapi(settings: Any, *, renderer: Any = None, batch_max_events: int = 500,
                  hms_simulator: bool = False) -> dict[str, Any]:
    #: providers of kind sendgrid / ses / hms take their events at /v1/receipts/<name>;
    #: "hms" too for the Push Kit simulator (``hms_simulator``: NOTIFY_HMS_RECEIPT_KEY set)
    providers = getattr(settings, "providers", None) or {}
    own_receipts = sorted(n for n, p in providers.items() if getattr(p, "kind", None) in ("sendgrid", "ses", "hms"))
    if hms_simulator and "hms" not in own_receipts and getattr(providers.get("hms"), "kind", None) is None:
        own_receipts.append("hms")
    categories = sorted(settings.categories)
    codes, versions = _templates(renderer)
    template = {"type": "string", "description": "a template under config/templates/<code>/v<version>/"}
    if codes:
        template["enum"] = codes
    template_version: dict[str, Any] = {"type": "integer", "minimum": 1}
    if versions:
        template_version["enum"] = versions
    event = {
        "type": "object",
        "description": "One business event (docs/SCHEMA.md). Unknown fields are ignored.",
        "required": ["biz_key", "category", "template", "recipients"],
        "properties": {
            "v": {"type": "integer", "minimum": 1, "maximum": 1},
            "biz_key": {"type": "string", "minLength": 1, "maxLength": MAX_BIZ_KEY, "pattern": _ID_PATTERN},
            "category": {"type": "string", "enum": categories},
            "template": template,
            "template_version": _nullable(template_version),
            "recipients": {
                "type": "array",
                "minItems": 1,
                "description": f"user ids; duplicates are dropped; at most {settings.max_recipients} distinct "
                               "(more: 400 too_many_recipients)",
                "items": {"anyOf": [{"type": "string", "minLength": 1, "maxLength": MAX_ID, "pattern": _ID_PATTERN},
                                    {"type": "integer", "minimum": -(2**63), "maximum": 2**63 - 1}]},
            },
            "channels": _nullable({"type": "array", "minItems": 1, "items": {"type": "string", "enum": list(CHANNELS)}}),
            "params": _nullable({"type": "object", "description": (
                f"template variables; nesting at most {settings.max_params_depth} (more: 400 params_too_deep), "
                f"at most {getattr(settings, 'max_params_bytes', 65536)} bytes as JSON (more: 400 params_too_large)")}),
            "locale": _nullable({"type": "string", "pattern": r"^[A-Za-z]{2,8}(?:[-_][A-Za-z0-9]{1,8})*$"}),
            "priority": _nullable({"type": "string", "enum": list(PRIORITIES)}),
            "send_at": _nullable({"type": "number", "minimum": 0, "description": (
                f"unix seconds; at most {getattr(settings, 'max_send_ahead_s', 2592000):.0f} s ahead and "
                f"{getattr(settings, 'max_send_past_s', 86400):.0f} s behind now (else 400 bad_value)")}),
        },
    }
    ids_item = {
        "type": "object",
        "required": ["user_id", "notification_id"],
        "properties": {
            "user_id": {"type": "string"},
            "notification_id": {"type": "string", "pattern": "^n_[0-9a-f]{20}$"},
            "state": {"type": "string", "enum": list(State.ALL)},
            "channels": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["channel", "delivery_id", "state"],
                    "properties": {
                        "channel": {"type": "string"},
                        "delivery_id": {"type": "string"},
                        "state": {"type": "string", "enum": list(State.ALL)},
                        "reason": _NSTR,
                    },
                },
            },
        },
    }
    event_result = {
        "type": "object",
        "description": "accepted: written now (202); duplicate: the biz_key was accepted before with the same "
                       "content — the original ids and their current states (200); conflict / in_progress: "
                       "nothing written (409).",
        "required": ["status", "biz_key"],
        "properties": {
            "status": {"type": "string", "enum": ["accepted", "duplicate", "conflict", "in_progress"]},
            "biz_key": {"type": "string"},
            "accepted_at": _NNUM,
            "notifications": {"type": "array", "items": ids_item},
            "priority": {"type": "string", "enum": list(PRIORITIES), "description": (
                "the priority the event runs at: its own, lowered to its category's max_priority unless the key "
                "has the priority:any scope; else the category's")},
            "error": _ref("ErrorBody"),
        },
    }
    attempt = {
        "type": "object",
        "required": ["seq", "provider", "result", "started_at"],
        "properties": {
            "notification_id": {"type": "string"},
            "delivery_id": {"type": "string"},
            "seq": {"type": "integer"},
            "channel": {"type": "string"},
            "provider": {"type": "string"},
            "started_at": _NUM,
            "result": {"type": "string"},
            "next_at": _NNUM,
            "latency_ms": _NNUM,
            "retry_after": _NNUM,
            "provider_msg_id": _NSTR,
            "error": _NSTR,
        },
    }
    record = {
        "type": "object",
        "description": "One delivery (notification × channel). DELIVERED is only ever shown after a receipt.",
        "required": ["delivery_id", "notification_id", "biz_key", "user_id", "channel", "state"],
        "properties": {
            "delivery_id": {"type": "string"},
            "notification_id": {"type": "string"},
            "biz_key": {"type": "string"},
            "user_id": {"type": "string"},
            "channel": {"type": "string", "enum": list(CHANNELS)},
            "category": _NSTR,
            "template": {"type": "string"},
            "priority": _NSTR,
            "state": {"type": "string", "enum": list(State.ALL)},
            "reason": _NSTR,
            "provider": _NSTR,
            "provider_msg_id": _NSTR,
            "retry_count": {"type": "integer"},
            "created_at": _NUM,
            "updated_at": _NUM,
            "sent_at": _NNUM,
            "delivered_at": _NNUM,
            "accepted_at": _NNUM,
            "latency_ms": _NNUM,
            "producer": {"type": "string", "description": "whose key space biz_key belongs to ('' = the operator's)"},
            "pref_version": {"type": ["integer", "null"],
                             "description": "the user's preferences version the decision was taken with"},
            "template_version": {"type": ["integer", "null"],
                                 "description": "the template version rendered (a gray release's, or the one asked)"},
            "attempts": {"type": "array", "items": _ref("Attempt")},
        },
    }
    preferences = {
        "type": "object",
        "description": "A user's settings. switches: '<category>.<channel>' ('*' for any) → on/off; anything "
                       "not listed is on. version: omitted = the current version + 1; a lower one is refused.",
        "properties": {
            "user_id": _ID,
            "version": {"type": "integer", "minimum": 0, "maximum": 2**63 - 1},
            "switches": {
                "type": "object",
                "additionalProperties": {"type": "boolean"},
                "propertyNames": {"pattern": "^(\\*|" + "|".join(categories) + ")\\.(\\*|" + "|".join(CHANNELS) + ")$"},
            },
            "quiet_hours": _nullable({"type": "string", "description": "HH:MM-HH:MM in tz (start ≠ end)",
                                      "pattern": "^ *([01][0-9]|2[0-3]):[0-5][0-9] *- *([01][0-9]|2[0-3]):[0-5][0-9] *$"}),
            "channel_quiet_hours": _nullable({
                "type": "object", "description": "a channel's own quiet windows ([]: never quiet); the other "
                                                 "channels use quiet_hours",
                "propertyNames": {"enum": list(CHANNELS)},
                "additionalProperties": {"type": "array", "maxItems": 8, "items": {
                    "type": "string",
                    "pattern": "^ *([01][0-9]|2[0-3]):[0-5][0-9] *- *([01][0-9]|2[0-3]):[0-5][0-9] *$"}}}),
            "tz": _nullable({"type": "string", "description": "IANA zone (default UTC)",
                             "enum": sorted(zoneinfo.available_timezones())}),
            "phone": _NSTR,
            "email": _NSTR,
            "webhook_url": _NSTR,
            "locale": _NSTR,
            "v": {"type": "integer", "minimum": 1, "maximum": 1},
        },
    }
    error_body = {
        "type": "object",
        "required": ["code", "message"],
        "properties": {
            "code": {"type": "string", "description": "machine reason (validation: see pipeline/parsers/events.py)"},
            "message": {"type": "string"},
            "field": {"type": "string", "description": "the offending field, dotted; [i] = batch index"},
        },
    }

    json_body = lambda schema, desc="": {  # noqa: E731
        "required": True, "description": desc, "content": {"application/json": {"schema": schema}}
    }
    bearer = [{"bearer": []}]

    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {
            "title": "notify-stream API",
            "version": "1.0.0",
            "description": "Producers write events; support reads records; apps manage users' preferences, "
                           "devices and inbox; providers post delivery receipts. Errors are "
                           '{"error": {"code", "message", "field"?}}.',
        },
        "servers": [{"url": "/"}],
        "components": {
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer",
                           "description": "API key: Authorization: Bearer nfk_<id>_<secret>"},
            },
            "schemas": {
                "Event": event,
                "EventResult": event_result,
                "Attempt": attempt,
                "Record": record,
                "Preferences": preferences,
                "PreferencesUpdate": {
                    **{k: v for k, v in preferences.items() if k != "properties"},
                    "description": "The preferences to set; the user is the one in the path (a user_id "
                                   "field, if sent, must match it).",
                    "properties": {k: v for k, v in preferences["properties"].items() if k != "user_id"},
                },
                "ErrorBody": error_body,
                "Error": {"type": "object", "required": ["error"], "properties": {"error": _ref("ErrorBody")}},
            },
        },
        "paths": {
            "/v1/events": {
                "post": {
                    "operationId": "postEvents",
                    "summary": "Accept one event or a batch (scope events:write)",
                    "description": "Validated, written to notify.events, answered with the deterministic "
                                   "notification ids. Idempotent on biz_key: a repeat answers 200 with the "
                                   "original ids and their states, and writes nothing. A batch answers 202 if "
                                   "any event was accepted, 200 if all were repeats, else 409; each result "
                                   "carries its own status.",
                    "security": [{"bearer": []}],
                    "x-scope": "events:write",
                    "requestBody": json_body({"oneOf": [
                        _ref("Event"),
                        {"type": "array", "minItems": 1, "maxItems": batch_max_events, "items": _ref("Event")},
                    ]}),
                    "responses": {
                        "202": _json({"oneOf": [_ref("EventResult"), {"type": "object", "required": ["results"],
                                     "properties": {"results": {"type": "array", "items": _ref("EventResult")}}}]},
                                     "accepted (persisted in the stream)"),
                        "200": _json({"oneOf": [_ref("EventResult"), {"type": "object", "required": ["results"],
                                     "properties": {"results": {"type": "array", "items": _ref("EventResult")}}}]},
                                     "a repeat: original ids and current states"),
                        "400": _err("invalid event: error.code is the reason, error.field the field"),
                        **_AUTH_ERRORS,
                        "409": _json({"type": "object"}, "biz_key taken by different content, or in flight"),
                        "413": _err("body, event (max_event_bytes) or batch too large"),
                        "422": _err("missing_params: a template of the event's channels needs variables its params "
                                    "lack (error.message names them, with the template, channel and locale)"),
                        "503": _err("broker unavailable"),
                    },
                }
            },
            "/v1/notifications": {
                "get": {
                    "operationId": "listNotifications",
                    "summary": "Records by biz_key and/or user_id, newest first (scope records:read)",
                    "security": bearer,
                    "x-scope": "records:read",
                    "parameters": [
                        {"name": "biz_key", "in": "query", "schema": {"type": "string", "maxLength": MAX_BIZ_KEY}},
                        {"name": "user_id", "in": "query", "schema": {"type": "string", "maxLength": MAX_ID}},
                        {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 1000,
                                                                     "default": 50}},
                        {"name": "cursor", "in": "query", "description": "next_cursor of the previous page",
                         "schema": {"type": "integer", "minimum": 1, "maximum": 2**62}},
                    ],
                    "responses": {
                        "200": _json({"type": "object", "required": ["items", "next_cursor"], "properties": {
                            "items": {"type": "array", "items": _ref("Record")},
                            "next_cursor": _nullable({"type": "integer"})}}, "a page of records"),
                        "400": _err("bad query parameter"),
                        **_AUTH_ERRORS,
                        "503": _err("record store unavailable"),
                    },
                }
            },
            "/v1/releases": {
                "get": {
                    "operationId": "listReleases", "summary": "Gray releases in force: config and API (scope admin)",
                    "security": bearer, "x-scope": "admin",
                    "responses": {"200": _json({"type": "object", "required": ["items"]}, "the releases"),
                                  **_AUTH_ERRORS},
                }
            },
            "/v1/releases/{name}": {
                "put": {
                    "operationId": "putRelease",
                    "summary": "Set a gray release: a template version or a channel, stage off/internal/percent/all "
                               "(scope admin)",
                    "security": bearer, "x-scope": "admin",
                    "parameters": [{"name": "name", "in": "path", "required": True,
                                    "schema": {"type": "string", "pattern": "^[a-z0-9][a-z0-9_-]{0,63}$"}}],
                    "requestBody": {"required": True, "content": {"application/json": {"schema": {
                        "type": "object",
                        "properties": {
                            "stage": {"type": "string", "enum": ["off", "internal", "percent", "all"]},
                            "template": {"type": "string"}, "version": {"type": "integer", "minimum": 2},
                            "channel": {"type": "string", "enum": list(CHANNELS)},
                            "internal_users": {"type": "array", "items": {"type": "string"}},
                            "percent": {"type": "number", "minimum": 0, "maximum": 100}}}}}},
                    "responses": {"200": _json({"type": "object"}, "the release as set"),
                                  "400": _err("bad release"), **_AUTH_ERRORS},
                },
                "delete": {
                    "operationId": "deleteRelease", "summary": "Remove a release set through the API (scope admin)",
                    "security": bearer, "x-scope": "admin",
                    "parameters": [{"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}],
                    "responses": {"200": _json({"type": "object"}, "deleted"), "404": _err("no such release"),
                                  **_AUTH_ERRORS},
                },
            },
            "/v1/slo": {
                "get": {
                    "operationId": "getSlo",
                    "summary": "Seed 001's service level: events terminal within 60 s of acceptance, overall, per "
                               "priority, deferred ones apart (scope records:read: the key's producer; admin: all)",
                    "security": bearer,
                    "x-scope": "records:read",
                    "parameters": [
                        {"name": "month", "in": "query", "description": "YYYY-MM (UTC); default this month",
                         "schema": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}$"}},
                        {"name": "since", "in": "query", "description": "unix seconds or ISO 8601",
                         "schema": {"type": "string", "pattern": _TIME}},
                        {"name": "until", "in": "query", "description": "unix seconds or ISO 8601; default now",
                         "schema": {"type": "string", "pattern": _TIME}},
                    ],
                    "responses": {
                        "200": _json({"type": "object", "required": ["since", "until", "met", "all", "priorities",
                                                                     "deferred"]}, "the report"),
                        "400": _err("bad query parameter"),
                        **_AUTH_ERRORS,
                        "503": _err("record store unavailable"),
                    },
                }
            },
            "/v1/stats": {
                "get": {
                    "operationId": "getStats",
                    "summary": "Delivery, click and read rates per template and channel (tracking; scope "
                               "records:read: the key's producer; admin: all)",
                    "security": bearer,
                    "x-scope": "records:read",
                    "parameters": [
                        {"name": "since", "in": "query", "description": "unix seconds or ISO 8601; default a day ago",
                         "schema": {"type": "string", "pattern": _TIME}},
                        {"name": "until", "in": "query", "description": "unix seconds or ISO 8601; default now",
                         "schema": {"type": "string", "pattern": _TIME}},
                    ],
                    "responses": {
                        "200": _json({"type": "object", "required": ["since", "until", "rows"]},
                                     "sent, delivered, clicked, read and their rates per template × channel"),
                        "400": _err("bad query parameter"),
                        **_AUTH_ERRORS,
                        "503": _err("record store unavailable"),
                    },
                }
            },
            "/v1/unsubscribes": {
                "get": {
                    "operationId": "listUnsubscribes",
                    "summary": "Opt-outs recorded (user, category, channel, source, time)",
                    "security": bearer,
                    "x-scope": "records:read",
                    "parameters": [
                        {"name": "user_id", "in": "query", "schema": {"type": "string"}},
                        {"name": "since", "in": "query", "schema": {"type": "string", "pattern": _TIME}},
                        {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1}},
                    ],
                    "responses": {"200": _json({"type": "object", "required": ["items"]}, "the records"),
                                  "400": _err("bad query parameter"), **_AUTH_ERRORS},
                }
            },
            "/v1/reads": {
                "post": {
                    "operationId": "postReads",
                    "summary": "Reads the app reports (push opens, inbox reads): delivery ids, kind, time",
                    "security": bearer,
                    "x-scope": "users:write",
                    "requestBody": {"required": True, "content": {"application/json": {"schema": {"type": "object"}}}},
                    "responses": {"200": _json({"type": "object", "required": ["received", "recorded"]}, "counted"),
                                  "400": _err("malformed body"), **_AUTH_ERRORS},
                }
            },
            "/t/c/{token}": {
                "get": {
                    "operationId": "trackedClick",
                    "summary": "A tracked link: the click recorded, then a redirect to its target (the signed "
                               "token is the authority: no key)",
                    "security": [],
                    "parameters": [{"name": "token", "in": "path", "required": True, "schema": {"type": "string"}}],
                    "responses": {"302": {"description": "to the link's target"},
                                  "404": _err("not a token this deployment signed")},
                }
            },
            "/u/{token}": {
                "parameters": [{"name": "token", "in": "path", "required": True, "schema": {"type": "string"},
                                "description": "signed: a user, a category and a channel (the link a delivery "
                                               "carries as unsubscribe_url / List-Unsubscribe)"}],
                "get": {
                    "operationId": "unsubscribePage",
                    "summary": "The one-click unsubscribe link's page: what it turns off, and a form that POSTs "
                               "List-Unsubscribe=One-Click (the signed token is the authority: no key)",
                    "security": [],
                    "responses": {"200": {"description": "the page", "content": {"text/html": {}}},
                                  "403": {"description": "a category that cannot be unsubscribed (a page saying so)",
                                          "content": {"text/html": {}}},
                                  "404": _err("not a token this deployment signed")},
                },
                "post": {
                    "operationId": "unsubscribeOneClick",
                    "summary": "RFC 8058 one-click unsubscribe: turns the token's category off on its channel "
                               "(a preferences update, source one_click; recorded in GET /v1/unsubscribes)",
                    "security": [],
                    "requestBody": {"required": True, "content": {
                        media: {"schema": {"type": "object", "required": ["List-Unsubscribe"],
                                           "properties": {"List-Unsubscribe": {"type": "string",
                                                                               "enum": ["One-Click"]}}}}
                        for media in ("application/x-www-form-urlencoded", "multipart/form-data")}},
                    "responses": {"200": {"description": "unsubscribed (a page saying so)",
                                          "content": {"text/html": {}}},
                                  "400": _err("the body is not List-Unsubscribe=One-Click"),
                                  "403": {"description": "a category that cannot be unsubscribed (a page saying so)",
                                          "content": {"text/html": {}}},
                                  "404": _err("not a token this deployment signed"),
                                  "503": _err("broker unavailable")},
                },
            },
            "/t/o/{token}.gif": {
                "get": {
                    "operationId": "openPixel",
                    "summary": "The optional e-mail open pixel ([tracking] open_pixel)",
                    "security": [],
                    "parameters": [{"name": "token", "in": "path", "required": True, "schema": {"type": "string"}}],
                    "responses": {"200": {"description": "a 1×1 GIF"}, "404": _err("unknown token or pixel off")},
                }
            },
            "/v1/notifications/{id}": {
                "get": {
                    "operationId": "getNotification",
                    "summary": "A notification (all channels) or one delivery, with attempts (scope records:read)",
                    "security": bearer,
                    "x-scope": "records:read",
                    "parameters": [{"name": "id", "in": "path", "required": True,
                                    "description": "notification id n_<20 hex> or delivery id n_<20 hex>.<channel>",
                                    "schema": {"type": "string"}}],
                    "responses": {
                        "200": _json({"type": "object", "required": ["notification_id", "state", "deliveries"],
                                      "properties": {
                                          "notification_id": {"type": "string"},
                                          "biz_key": {"type": "string"},
                                          "user_id": {"type": "string"},
                                          "state": {"type": "string", "enum": list(State.ALL)},
                                          "deliveries": {"type": "array", "items": _ref("Record")}}},
                                     "the records"),
                        **_AUTH_ERRORS,
                        "404": _err("no such id, or not recorded yet"),
                        "503": _err("record store unavailable"),
                    },
                }
            },
            "/v1/users/{id}/preferences": {
                "parameters": [_USER_PATH],
                "get": {
                    "operationId": "getPreferences",
                    "summary": "The last preferences set through the API (scope records:read)",
                    "security": bearer,
                    "x-scope": "records:read",
                    "responses": {
                        "200": _json(_ref("Preferences"), "the preferences"),
                        "400": _err("bad user id"),
                        **_AUTH_ERRORS,
                        "404": _err("none set through the API"),
                    },
                },
                "put": {
                    "operationId": "putPreferences",
                    "summary": "Replace the preferences; written to notify.preferences (scope users:write)",
                    "security": bearer,
                    "x-scope": "users:write",
                    "requestBody": json_body(_ref("PreferencesUpdate")),
                    "responses": {
                        "202": _json(_ref("Preferences"), "accepted (as written, with its version)"),
                        "400": _err("invalid preferences"),
                        **_AUTH_ERRORS,
                        "409": _err("stale version"),
                        "413": _err("body too large"),
                        "503": _err("broker unavailable"),
                    },
                },
            },
            "/v1/users/{id}/devices/{token}": {
                "parameters": [
                    _USER_PATH,
                    {"name": "token", "in": "path", "required": True, "description": "push token",
                     "schema": {"type": "string", "pattern": r"^[A-Za-z0-9:_.\-]{1,512}$"}},
                ],
                "put": {
                    "operationId": "putDevice",
                    "summary": "Register a push token (scope users:write)",
                    "security": bearer,
                    "x-scope": "users:write",
                    "requestBody": json_body({"type": "object", "required": ["platform"], "properties": {
                        "platform": {"type": "string", "enum": ["apns", "fcm", "hms"]}}}),
                    "responses": {
                        "202": _json(_ref("DeviceUpdate"), "written to notify.devices"),
                        "400": _err("bad token or platform"),
                        **_AUTH_ERRORS,
                        "413": _err("body too large"),
                        "503": _err("broker unavailable"),
                    },
                },
                "delete": {
                    "operationId": "deleteDevice",
                    "summary": "Remove a push token (scope users:write)",
                    "security": bearer,
                    "x-scope": "users:write",
                    "parameters": [{"name": "platform", "in": "query",
                                    "schema": {"type": "string", "enum": ["apns", "fcm", "hms"]}}],
                    "responses": {
                        "202": _json(_ref("DeviceUpdate"), "written to notify.devices"),
                        "400": _err("bad token"),
                        **_AUTH_ERRORS,
                        "503": _err("broker unavailable"),
                    },
                },
            },
            "/v1/users/{id}/inbox": {
                "get": {
                    "operationId": "getInbox",
                    "summary": "In-app messages, newest first, and the unread count (scope records:read)",
                    "security": bearer,
                    "x-scope": "records:read",
                    "parameters": [
                        _USER_PATH,
                        {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 200,
                                                                     "default": 50}},
                        {"name": "before", "in": "query", "description": "next_before of the previous page",
                         "schema": {"type": "integer", "minimum": 1, "maximum": 2**62}},
                    ],
                    "responses": {
                        "200": _json({"type": "object", "required": ["user_id", "unread", "items"], "properties": {
                            "user_id": {"type": "string"},
                            "unread": {"type": "integer", "minimum": 0},
                            "items": {"type": "array", "items": {"type": "object", "properties": {
                                "id": {"type": "integer"}, "delivery_id": {"type": "string"},
                                "title": {"type": "string"}, "body": {"type": "string"},
                                "created_at": _NUM, "read_at": _NNUM}}},
                            "next_before": _nullable({"type": "integer"})}}, "a page of the inbox"),
                        "400": _err("bad parameter"),
                        **_AUTH_ERRORS,
                        "503": _err("record store unavailable"),
                    },
                }
            },
            "/v1/users/{id}/inbox/read": {
                "post": {
                    "operationId": "markInboxRead",
                    "summary": "Mark messages read: given delivery ids, or all (scope users:write)",
                    "security": bearer,
                    "x-scope": "users:write",
                    "parameters": [_USER_PATH],
                    "requestBody": json_body({"type": "object", "properties": {
                        "delivery_ids": {"type": "array", "maxItems": 1000, "items": {"type": "string"}},
                        "all": {"type": "boolean"}},
                        "anyOf": [{"required": ["delivery_ids"]},
                                  {"required": ["all"], "properties": {"all": {"const": True}}}]},
                        '{"delivery_ids": [...]} marks those, {"all": true} every message'),
                    "responses": {
                        "200": _json({"type": "object", "required": ["marked", "unread"], "properties": {
                            "user_id": {"type": "string"},
                            "marked": {"type": "integer", "minimum": 0},
                            "unread": {"type": "integer", "minimum": 0}}}, "how many were marked; unread left"),
                        "400": _err("neither delivery_ids nor all: true"),
                        **_AUTH_ERRORS,
                        "413": _err("body too large"),
                        "503": _err("record store unavailable"),
                    },
                }
            },
            "/v1/receipts/{provider}": {
                "post": {
                    "operationId": "postReceipt",
                    "summary": "A provider's delivery receipt (signed by the provider, no API key)",
                    "description": "twilio: form-encoded status callback with X-Twilio-Signature (or the JSON "
                                   "variant with bodySHA256 in the query), verified as twilio's RequestValidator "
                                   "does: the full URL, any query string included; an identical retried callback "
                                   "is acknowledged (200, received 0). smsvendor: JSON with X-Vendor-Timestamp and "
                                   "X-Vendor-Signature (sha256=HMAC); a provider of kind sendgrid (signed Event Webhook) or ses "
                                   "(SNS notifications) at its own name; one of kind hms (Huawei Push Kit's "
                                   "receipts, {\"statuses\": [...]}) at its own name with X-HUAWEI-CALLBACK-ID "
                                   "(timestamp; nonce; value=base64 HMAC-SHA256 of timestamp + nonce + callback "
                                   "user name with the callback key), the same body again acknowledged (200, "
                                   "received 0). A bad, stale or replayed signature is 401 "
                                   "and counted in notify_receipts_rejected_total.",
                    "security": [],
                    "parameters": [
                        {"name": "provider", "in": "path", "required": True,
                         "schema": {"type": "string",
                                    "enum": list(dict.fromkeys(["twilio", "smsvendor", *own_receipts]))}},
                        {"name": "X-Twilio-Signature", "in": "header", "schema": {"type": "string"}},
                        {"name": "X-Vendor-Timestamp", "in": "header", "schema": {"type": "string"}},
                        {"name": "X-Vendor-Signature", "in": "header", "schema": {"type": "string"}},
                        {"name": "X-HUAWEI-CALLBACK-ID", "in": "header", "schema": {"type": "string"}},
                    ],
                    "requestBody": {"required": True, "content": {
                        "application/x-www-form-urlencoded": {"schema": {"type": "object", "properties": {
                            "MessageSid": {"type": "string"}, "MessageStatus": {"type": "string"},
                            "ErrorCode": {"type": "string"}}}},
                        "application/json": {"schema": {"type": "object", "properties": {
                            "message_id": {"type": "string"}, "status": {"type": "string"},
                            "error": _NSTR, "timestamp": _NUM,
                            # Huawei Push Kit (kind hms)
                            "statuses": {"type": "array", "items": {"type": "object", "properties": {
                                "requestId": {"type": "string"}, "biTag": {"type": "string"},
                                "appid": {"type": "string"}, "token": {"type": "string"},
                                "status": {"type": "integer"}, "timestamp": {"type": "integer"}}}}}}},
                    }},
                    "responses": {
                        "200": _json({"type": "object", "required": ["received"], "properties": {
                            "received": {"type": "integer", "minimum": 0}}},
                            "verified; final receipts written to notify.receipts"),
                        "400": _err("malformed receipt"),
                        "401": _err("bad, stale or replayed signature"),
                        "404": _err("unknown provider"),
                        "413": _err("body too large"),
                        "503": _err("broker unavailable, or the provider's receipt credentials unreadable"),
                    },
                }
            },
            "/healthz": {
                "get": {
                    "operationId": "healthz", "summary": "Broker and record store reachable (open)",
                    "security": [],
                    "responses": {
                        "200": _json({"type": "object", "required": ["status"], "properties": {
                            "status": {"type": "string"}, "broker": {"type": "boolean"},
                            "store": {"type": "boolean"}}}, "healthy"),
                        "503": _err("a dependency is down (error.broker / error.store say which)"),
                    },
                }
            },
            "/metrics": {
                "get": {
                    "operationId": "metrics", "summary": "Prometheus exposition, lag read at scrape (open)",
                    "security": [],
                    "responses": {"200": {"description": "text/plain; version=0.0.4",
                                          "content": {"text/plain": {"schema": {"type": "string"}}}}},
                }
            },
            "/v1/status.json": {
                "get": {
                    "operationId": "status", "summary": "Data of the status page (open; no message contents)",
                    "security": [],
                    "responses": {"200": _json({"type": "object", "required": ["at", "topics", "lanes"],
                                                "properties": {"at": _NUM, "topics": {"type": "array"},
                                                               "lanes": {"type": "array"},
                                                               "breakers": {"type": "object"},
                                                               "today": _nullable({"type": "object"}),
                                                               "dead_letters": {"type": "array"},
                                                               "dlq_depth": _nullable({"type": "integer"})}},
                                               "status")},
                }
            },
            "/v1/openapi.json": {
                "get": {"operationId": "openapi", "summary": "This document (open)", "security": [],
                        "responses": {"200": _json({"type": "object"}, "OpenAPI 3 document")}}
            },
            "/": {
                "get": {"operationId": "statusPage", "summary": "Status page (HTML, open)", "security": [],
                        "responses": {"200": {"description": "HTML",
                                              "content": {"text/html": {"schema": {"type": "string"}}}}}}
            },
        },
    }
    doc["components"]["schemas"]["DeviceUpdate"] = {
        "type": "object",
        "required": ["user_id", "token", "platform", "op"],
        "properties": {"user_id": {"type": "string"}, "token": {"type": "string"},
                       "platform": {"type": "string", "enum": ["apns", "fcm", "hms"]},
                       "op": {"type": "string", "enum": ["add", "remove"]}, "at": _NUM},
    }
    return copy.deepcopy(doc)
