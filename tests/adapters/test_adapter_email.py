"""SMTP adapter against the aiosmtpd simulator."""

from __future__ import annotations

from email import message_from_bytes, policy

import pytest

from adapters.base import QueryStatus
from adapters.email_smtp import SmtpConfig, SmtpProvider
from adapters.simulators.smtp_sim import SmtpSim
from pipeline.models import AttemptResult

CONTENT = {"subject": "Your order shipped", "text": "Plain text", "html": "<p>HTML</p>"}


def provider_for(sim, **kw) -> SmtpProvider:
    cfg = dict(host=sim.host, port=sim.port, start_tls=False, timeout=2.0, from_addr="notify@example.com", msgid_domain="notify.example.com")
    cfg.update(kw)
    return SmtpProvider(SmtpConfig(**cfg))


async def test_success_multipart_with_message_id(smtp_sim, make_delivery):
    p = provider_for(smtp_sim, from_name="Notify")
    d = make_delivery("email", "alice@example.org", CONTENT)
    r = await p.send(d)
    assert r.result == AttemptResult.ACCEPTED, r
    assert r.provider_msg_id == f"<{d.delivery_id}@notify.example.com>"
    [stored] = smtp_sim.core.messages.values()
    assert stored["rcpt_tos"] == ["alice@example.org"] and stored["mail_from"] == "notify@example.com"
    msg = message_from_bytes(stored["raw"], policy=policy.default)
    assert msg["Message-ID"] == r.provider_msg_id
    assert msg["X-Notify-Id"] == d.delivery_id
    assert msg["Subject"] == "Your order shipped"
    assert msg["From"] == "Notify <notify@example.com>"
    assert msg.get_content_type() == "multipart/alternative"
    assert msg.get_body(("plain",)).get_content().strip() == "Plain text"
    assert msg.get_body(("html",)).get_content().strip() == "<p>HTML</p>"


@pytest.mark.parametrize(
    "rcpt,result,kind",
    [
        ("bounce@example.org", AttemptResult.PERMANENT_ERROR, "invalid_address"),
        ("reject@example.org", AttemptResult.PERMANENT_ERROR, "rejected"),
        ("tempfail@example.org", AttemptResult.TRANSIENT_ERROR, None),
        ("error@example.org", AttemptResult.TRANSIENT_ERROR, None),
    ],
)
async def test_smtp_errors(smtp_sim, make_delivery, rcpt, result, kind):
    r = await provider_for(smtp_sim).send(make_delivery("email", rcpt, CONTENT))
    assert (r.result, r.permanent_kind) == (result, kind), r


async def test_timeout_during_data_is_unknown(smtp_sim, make_delivery):
    p = provider_for(smtp_sim, timeout=0.3)
    d = make_delivery("email", "hang@example.org", CONTENT)
    r = await p.send(d)
    assert r.result == AttemptResult.TIMEOUT_UNKNOWN, r
    assert r.provider_msg_id == f"<{d.delivery_id}@notify.example.com>"
    assert smtp_sim.core.by_key[d.delivery_id]  # the server did queue it
    q = await p.query(d.delivery_id, r.provider_msg_id)
    assert (q.found, q.status, q.supported) == (False, QueryStatus.NOT_FOUND, False)


async def test_starttls_and_auth(profile, make_delivery):
    sim = SmtpSim(profile, tls=True, username="notify", password="s3cret")
    await sim.start()
    try:
        base = dict(start_tls=True, tls_context=sim.client_tls_context(), username="notify")
        r = await provider_for(sim, password="s3cret", **base).send(make_delivery("email", "bob@example.org", CONTENT))
        assert r.result == AttemptResult.ACCEPTED, r
        [stored] = sim.core.messages.values()
        assert stored["tls"] is True
        r = await provider_for(sim, password="wrong", **base).send(make_delivery("email", "bob@example.org", CONTENT))
        assert r.result == AttemptResult.TRANSIENT_ERROR and r.error.startswith("auth: 535")
        # a client that skips STARTTLS is refused before anything is submitted
        r = await provider_for(sim, password="s3cret").send(make_delivery("email", "bob@example.org", CONTENT))
        assert r.result == AttemptResult.TRANSIENT_ERROR
        assert len(sim.core.messages) == 1
    finally:
        await sim.stop()


async def test_connection_refused_is_transient(make_delivery, free_port):
    p = SmtpProvider(SmtpConfig(host="127.0.0.1", port=free_port, timeout=1.0))
    r = await p.send(make_delivery("email", "a@example.org", CONTENT))
    assert r.result == AttemptResult.TRANSIENT_ERROR and r.error.startswith("connect:")


# ------------------------------------------------------------------ issue 28: as receiving MTAs expect


async def test_ehlo_name_is_the_message_id_domain_or_the_configured_one(smtp_sim, make_delivery):
    """Not the machine's "localhost": an MTA refusing non-FQDN HELO names (Postfix
    reject_non_fqdn_helo_hostname, as the simulator does) takes the message."""
    r = await provider_for(smtp_sim).send(make_delivery("email", "alice@example.org", CONTENT))
    assert r.result == AttemptResult.ACCEPTED, r
    r2 = await provider_for(smtp_sim, local_hostname="mx-out.example.com").send(make_delivery("email", "bob@example.org", CONTENT))
    assert r2.result == AttemptResult.ACCEPTED, r2
    assert [m["helo"] for m in smtp_sim.core.messages.values()] == ["notify.example.com", "mx-out.example.com"]
    r3 = await provider_for(smtp_sim, local_hostname="localhost").send(make_delivery("email", "carol@example.org", CONTENT))
    assert r3.result == AttemptResult.PERMANENT_ERROR and "504 5.5.2" in r3.error  # what the default used to get


@pytest.mark.parametrize("category,expected", [("account", "auto-generated"), ("otp", "auto-generated"),
                                               ("transaction", "auto-generated"), ("marketing", None)])
async def test_transactional_mail_is_auto_submitted(smtp_sim, make_delivery, category, expected):
    """RFC 3834: transactional mail says Auto-Submitted: auto-generated, so vacation
    responders do not answer it; bulk mail (marketing) does not claim it."""
    d = make_delivery("email", "alice@example.org", CONTENT).derive(category=category)
    r = await provider_for(smtp_sim).send(d)
    assert r.result == AttemptResult.ACCEPTED, r
    [stored] = smtp_sim.core.messages.values()
    msg = message_from_bytes(stored["raw"], policy=policy.strict)  # Python's strict parser, as the judge
    assert msg["Auto-Submitted"] == expected and stored["auto_submitted"] == expected
