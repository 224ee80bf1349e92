"""Phone numbers, e-mail addresses, push tokens and API keys are masked in logs:
the filter on a handler (caplog), and the process-wide record factory that
workers, the API and the CLI install, in a fresh interpreter (tracebacks,
aiohttp's access-log format and mode/Faust's loggers included). The worker's own
log is checked in test_stream_fuzz.py."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

from pipeline.redact import RedactingFilter, mask_address

ROOT = Path(__file__).resolve().parents[2]
PHONE = "+14155550123"
BARE_PHONE = "4155550199"
EMAIL = "jane.doe@example.org"
APNS = "f0" * 32
FCM = "fcm:" + "dGVzdC10b2tlbi" * 10
KEY = "nfk_0123456789ab_c2VjcmV0LXNlY3JldC1zZWNyZXQ"
SECRETS = [PHONE, BARE_PHONE, EMAIL, APNS, FCM[4:], KEY[17:]]


def test_filter_masks_messages_args_and_tracebacks(caplog):
    log = logging.getLogger("notify.test.masking")
    caplog.handler.addFilter(RedactingFilter())
    with caplog.at_level(logging.INFO, logger="notify.test.masking"):
        log.info("sms to %s, mail to %s", PHONE, EMAIL)
        log.info("push %s and %s", "apns:" + APNS, FCM)
        log.info("auth: Bearer %s; bare %s; at %s", KEY, BARE_PHONE, 1_700_000_000.25)
        try:
            raise ValueError(f"provider refused {PHONE} / {EMAIL}")
        except ValueError:
            log.exception("send failed for %s", "apns:" + APNS)
    text = caplog.text
    for secret in SECRETS:
        assert secret not in text, secret
    assert "+14*******23" in text and "j***@example.org" in text and "apns:f0f0…(64)" in text
    assert "1700000000.25" in text  # unix times stay readable
    assert "ValueError: provider refused +14*******23 / j***@example.org" in text


def test_mask_address_by_channel():
    assert mask_address("sms", PHONE) == "+14*******23"
    assert mask_address("email", EMAIL) == "j***@example.org"
    assert mask_address("push", "apns:" + APNS) == "apns:f0f0…(64)"
    # the path and the query of a webhook URL may be its secret (/services/T0/B0/XyZ, ?token=)
    assert mask_address("webhook", "https://hooks.example/x?token=s3cret") == "https://hooks.example/…"
    assert mask_address("inbox", "") == ""


def test_installed_factory_covers_every_logger_in_the_process():
    code = f"""
import logging, sys
from pipeline import redact
redact.install(); redact.install()
logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(name)s %(message)s")
logging.getLogger("faust.x").warning("to %s", {PHONE!r})
logging.getLogger("aiohttp.access").info('PUT /v1/users/u1/devices/%s 202 "Bearer %s"', {APNS!r}, {KEY!r})
logging.getLogger("aiohttp.access").info("%s 100%% of %s", {FCM!r}, {EMAIL!r})
try:
    raise RuntimeError("bad address " + {EMAIL!r})
except RuntimeError:
    logging.getLogger("x").exception("failed %s", {BARE_PHONE!r})
from mode.utils.logging import CompositeLogger
CompositeLogger(logging.getLogger("mode.x"), formatter=lambda *a, **k: a[1]).info("crash %r", {PHONE!r})
print("done", flush=True)
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.endswith("done\n"), out.stderr
    text = out.stdout + out.stderr
    for secret in SECRETS:
        assert secret not in text, (secret, text)
    assert "Logging error" not in text and "100% of" in text and "RuntimeError: bad address j***@example.org" in text
