"""E-mail through Amazon SES v2 (issue 27, item 2): the SendEmail adapter (SigV4 by
botocore) against its simulator on 127.0.0.1 (accepted, permanent, rate limited,
transient, timeout → UNKNOWN, configuration faults), SES's bounce / complaint /
delivery notifications through an SNS HTTPS subscription verified and refused
when tampered, the provider kind from config and its credentials check.

Judges: botocore's own sesv2 client talks to the simulator (so the simulator
answers as SES's service model says, and its SigV4 check, written from the
specification, agrees with botocore's signer), botocore's parameter validator
takes our SendEmail body, and the SNS signatures are checked by an independent
validator (``sns_message_validator``, SignatureVersion 1)."""

from __future__ import annotations

import asyncio
import re

import orjson
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from botocore.session import get_session
from botocore.validate import validate_parameters
from sns_message_validator import SNSMessageValidator
from sns_message_validator.exceptions import SignatureVerificationFailureException

from adapters.base import Fault, PermanentKind, QueryStatus
from adapters.receipts import MemoryReplayGuard, ReceiptRejected, ReceiptVerifier
from adapters.receipts_email import SnsCertCache, parse_ses_event, sns_string_to_sign, sns_url_allowed
from adapters.registry import build_spec, check_all
from adapters.ses import SesConfig, SesProvider
from adapters.simulators.ses_sim import SesSim
from config.settings import ConfigError, load_settings
from pipeline.models import AttemptResult
from tests.adapters.helpers import notify_toml

FROM = "notify@example.com"
CONTENT = {"subject": "Your order shipped", "text": "It is on its way.", "html": "<p>It is on its way.</p>"}


async def _ses(profile, email_collector, **kw) -> SesSim:
    sim = SesSim(profile, receipts_url=email_collector.base_url + "/ses", verified_identities=("example.com",), **kw)
    email_collector.configure(sns_topic_arns=(sim.topic_arn,), sns_certs=SnsCertCache())
    await sim.start()  # its SubscriptionConfirmation is posted once this returns
    email_collector.verifier.sns_cert_urls = (sim.base_url + "/",)  # the port it got
    return sim


@pytest.fixture
async def ses(profile, email_collector):
    sim = await _ses(profile, email_collector)
    await email_collector.wait_until(lambda: sim.confirmed)  # the SubscriptionConfirmation, verified and confirmed
    yield sim
    await sim.stop()


def provider_for(sim: SesSim, **kw) -> SesProvider:
    cfg = dict(region=sim.region, access_key_id=sim.access_key_id, secret_access_key=sim.secret_access_key,
               from_addr=FROM, from_name="Notify", base_url=sim.base_url, timeout=2.0)
    cfg.update(kw)
    return SesProvider(SesConfig(**cfg))


def boto_client(sim: SesSim, service: str = "sesv2", secret: str | None = None):
    return get_session().create_client(
        service, region_name=sim.region, endpoint_url=sim.base_url, aws_access_key_id=sim.access_key_id,
        aws_secret_access_key=secret or sim.secret_access_key,
        config=Config(retries={"total_max_attempts": 1}, connect_timeout=2, read_timeout=2))


# ---------------------------------------------------------------- sending


async def test_accepted_and_the_body_is_a_sendemail_of_the_service_model(ses, email_collector, make_delivery):
    p = provider_for(ses, configuration_set="notify-events")
    try:
        d = make_delivery("email", "ann@example.com", CONTENT)
        r = await p.send(d)
        assert r.result == AttemptResult.ACCEPTED, r
        assert r.provider == "ses" and r.provider_msg_id in ses.core.messages
        body = ses.core.messages[r.provider_msg_id]["body"]
        # the judge: botocore's validator with SES v2's own model of SendEmail
        model = get_session().get_service_model("sesv2").operation_model("SendEmail")
        validate_parameters(body, model.input_shape)
        assert body["FromEmailAddress"] == f"Notify <{FROM}>"
        assert body["Destination"] == {"ToAddresses": ["ann@example.com"]}
        assert body["Content"]["Simple"]["Headers"] == [{"Name": "X-Notify-Id", "Value": d.delivery_id},
                                                        {"Name": "Auto-Submitted", "Value": "auto-generated"}]
        assert body["ConfigurationSetName"] == "notify-events"
        assert {"Name": "notify_id", "Value": d.delivery_id} in body["EmailTags"]
        # with its one-click unsubscribe link: RFC 8058's headers, still a valid SendEmail
        url = "https://notify.example/u/AbC-d_e"
        body = p.build_body(make_delivery("email", "ann@example.com", {**CONTENT, "unsubscribe_url": url}))
        validate_parameters(body, model.input_shape)
        assert body["Content"]["Simple"]["Headers"][-2:] == [
            {"Name": "List-Unsubscribe", "Value": f"<{url}>"},
            {"Name": "List-Unsubscribe-Post", "Value": "List-Unsubscribe=One-Click"}]
        receipt = await email_collector.receipt_for(r)
        assert (receipt.status, receipt.provider, receipt.error) == ("DELIVERED", "ses", None)
        q = await p.query(d.delivery_id, r.provider_msg_id)
        assert (q.supported, q.status) == (False, QueryStatus.NOT_FOUND)
    finally:
        await p.close()


async def test_botocores_own_sesv2_client_against_the_simulator(ses):
    """The simulator answers as SES's service model says: botocore signs, sends and
    parses; its error codes are SES's."""
    client = boto_client(ses)
    params = {"FromEmailAddress": FROM, "Destination": {"ToAddresses": ["ann@example.com"]},
              "Content": {"Simple": {"Subject": {"Data": "Hi"}, "Body": {"Text": {"Data": "Hello"}}}}}
    out = await asyncio.to_thread(client.send_email, **params)
    assert out["MessageId"] in ses.core.messages
    account = await asyncio.to_thread(client.get_account)
    assert account["SendingEnabled"] is True and account["SendQuota"]["MaxSendRate"] == 14.0
    for to, code in (("reject@example.com", "MessageRejected"), ("throttle@example.com", "TooManyRequestsException")):
        with pytest.raises(ClientError) as exc:
            await asyncio.to_thread(client.send_email, **{**params, "Destination": {"ToAddresses": [to]}})
        assert exc.value.response["Error"]["Code"] == code
    with pytest.raises(ClientError) as exc:
        await asyncio.to_thread(boto_client(ses, secret="x" * 40).send_email, **params)
    assert exc.value.response["Error"]["Code"] == "SignatureDoesNotMatch"


async def test_rejected_is_permanent_and_throttling_is_rate_limited(ses, make_delivery):
    p = provider_for(ses)
    try:
        r = await p.send(make_delivery("email", "reject@example.com", CONTENT))
        assert (r.result, r.permanent_kind) == (AttemptResult.PERMANENT_ERROR, PermanentKind.REJECTED)
        assert "MessageRejected" in r.error
        d = make_delivery("email", "throttle@example.com", CONTENT)
        r = await p.send(d)
        assert r.result == AttemptResult.RATE_LIMITED and "TooManyRequestsException" in r.error
        assert (await p.send(d)).result == AttemptResult.ACCEPTED
    finally:
        await p.close()


async def test_5xx_is_transient_and_a_timeout_is_unknown(ses, make_delivery, free_port):
    p = provider_for(ses, timeout=0.5)
    try:
        ses.core.set_mode({"mode": "down", "status": 503, "count": 1})
        r = await p.send(make_delivery("email", "ann@example.com", CONTENT))
        assert r.result == AttemptResult.TRANSIENT_ERROR and "ServiceUnavailable" in r.error
        r = await p.send(make_delivery("email", "error@example.com", CONTENT))
        assert r.result == AttemptResult.TRANSIENT_ERROR and "InternalFailure" in r.error
        r = await p.send(make_delivery("email", "hang@example.com", CONTENT))
        assert r.result == AttemptResult.TIMEOUT_UNKNOWN, r
    finally:
        await p.close()
    refused = provider_for(ses, base_url=f"http://127.0.0.1:{free_port}")
    try:
        assert (await refused.send(make_delivery("email", "ann@example.com", CONTENT))).result == \
            AttemptResult.TRANSIENT_ERROR
    finally:
        await refused.close()


async def test_credentials_and_identity_faults_are_configuration_faults(ses, make_delivery):
    cases = {
        "wrong secret": provider_for(ses, secret_access_key="x" * 40),
        "unknown key": provider_for(ses, access_key_id="AKIAUNKNOWNUNKNOWN00"),
        "other region": provider_for(ses, region="eu-west-1"),
        "unverified sender": provider_for(ses, from_addr="someone@elsewhere.example"),
    }
    try:
        got = {}
        for what, p in cases.items():
            r = await p.send(make_delivery("email", "ann@example.com", CONTENT))
            got[what] = (r.result, r.fault, r.error.split(" ")[0:2])
        assert got == {
            "wrong secret": (AttemptResult.TRANSIENT_ERROR, Fault.CONFIG, ["auth:", "403"]),
            "unknown key": (AttemptResult.TRANSIENT_ERROR, Fault.CONFIG, ["auth:", "403"]),
            "other region": (AttemptResult.TRANSIENT_ERROR, Fault.CONFIG, ["auth:", "403"]),
            "unverified sender": (AttemptResult.TRANSIENT_ERROR, Fault.CONFIG, ["config:", "400"]),
        }
        assert not [row for row in ses.core.ledger if row.get("accepted")]
    finally:
        for p in cases.values():
            await p.close()


# ---------------------------------------------------------------- notifications through SNS


async def test_bounce_and_complaint_notifications(ses, email_collector, make_delivery):
    p = provider_for(ses)
    try:
        r = await p.send(make_delivery("email", "bounce@example.com", CONTENT))
        receipt = await email_collector.receipt_for(r)
        assert receipt.status == "UNDELIVERED" and receipt.error == "bounce Permanent/General: smtp; 550 5.1.1 user unknown"
        r = await p.send(make_delivery("email", "complaint@example.com", CONTENT))
        await email_collector.wait_until(lambda: sum(x.provider_msg_id == r.provider_msg_id for x in email_collector.receipts) == 2)
        assert [(x.status, x.error, x.opt_out) for x in email_collector.receipts
                if x.provider_msg_id == r.provider_msg_id] == [
            ("DELIVERED", None, False), ("DELIVERED", "complaint abuse", True)]  # a complaint is an opt-out
        assert email_collector.rejected == []
    finally:
        await p.close()


async def test_an_independent_validator_accepts_what_we_accept(ses, email_collector, make_delivery):
    """Every message the simulator posted (the SubscriptionConfirmation, the
    notifications; SignatureVersion 1) verifies with sns_message_validator; a changed
    Message fails it and us."""
    await email_collector.send_one(provider_for(ses), make_delivery("email", "ann@example.com", CONTENT))
    judge = SNSMessageValidator(cert_url_regex="^" + re.escape(ses.base_url + "/"))
    posted = [orjson.loads(body) for scheme, body, _ in email_collector.raw if scheme == "ses"]
    assert {m["Type"] for m in posted} == {"SubscriptionConfirmation", "Notification"}
    for msg in posted:
        await asyncio.to_thread(judge.validate_message, msg)
        tampered = {**msg, "Message": msg["Message"].replace("Delivery", "Bounce").replace("subscribe", "unsubscribe")}
        with pytest.raises(SignatureVerificationFailureException):
            await asyncio.to_thread(judge.validate_message, tampered)
        v = ReceiptVerifier(sns_topic_arns=(ses.topic_arn,), sns_cert_urls=(ses.base_url + "/",),
                            guard=MemoryReplayGuard())
        with pytest.raises(ReceiptRejected) as exc:
            await v.sns(orjson.dumps(tampered))
        assert exc.value.reason == "bad_signature"


async def test_signature_version_2_and_a_subject(profile, email_collector, make_delivery):
    sim = await _ses(profile, email_collector, signature_version="2")
    try:
        await email_collector.wait_until(lambda: sim.confirmed)
        p = provider_for(sim)
        try:
            r = await p.send(make_delivery("email", "bounce@example.com", CONTENT))
            receipt = await email_collector.receipt_for(r)
            assert receipt.status == "UNDELIVERED"
        finally:
            await p.close()
        assert {orjson.loads(b)["SignatureVersion"] for s, b, _ in email_collector.raw if s == "ses"} == {"2"}
        # a Subject is in the canonical string when present (and a line break in a value is kept)
        note = sim.signer.message(sim.base_url, "Notification", orjson.dumps(sim.ses_event(
            r.provider_msg_id, "delivery")).decode(), subject="Amazon SES Email Event\nNotification")
        assert b"Subject\nAmazon SES Email Event\nNotification\n" in sns_string_to_sign(note)
        got = await email_collector.verifier.sns(orjson.dumps(note))
        assert [x.status for x in got] == ["DELIVERED"]
        with pytest.raises(ReceiptRejected):
            await email_collector.verifier.sns(orjson.dumps({**note, "Subject": "other"}))
        with pytest.raises(ReceiptRejected):
            await email_collector.verifier.sns(orjson.dumps({k: v for k, v in note.items() if k != "Subject"}))
    finally:
        await sim.stop()


async def test_the_verifier_refuses_what_sns_did_not_sign_for_us(ses, email_collector, make_delivery):
    r = await email_collector.send_one(provider_for(ses), make_delivery("email", "ann@example.com", CONTENT))
    note = ses.notification(r.provider_msg_id, "bounce")
    v = email_collector.verifier
    assert [x.status for x in await v.sns(orjson.dumps(note))] == ["UNDELIVERED"]
    assert await v.sns(orjson.dumps(note)) == []  # SNS retried it: taken once
    fetches = v.sns_certs.fetches
    other_topic = ses.signer.sign({**note, "TopicArn": "arn:aws:sns:us-east-1:999999999999:theirs",
                                   "MessageId": "m-2"})
    cases = {
        "another topic": (other_topic, "bad_signature"),
        "a certificate elsewhere": ({**note, "SigningCertURL": "https://evil.example/cert.pem"}, "bad_signature"),
        "version 3": ({**note, "SignatureVersion": "3"}, "bad_signature"),
        "not base64": ({**note, "Signature": "%%%"}, "bad_signature"),
        "another MessageId": ({**note, "MessageId": "m-3"}, "bad_signature"),
        "no Type": ({k: x for k, x in note.items() if k != "Type"}, "malformed"),
    }
    for what, (msg, reason) in cases.items():
        with pytest.raises(ReceiptRejected) as exc:
            await v.sns(orjson.dumps(msg))
        assert exc.value.reason == reason, what
    assert v.sns_certs.fetches == fetches  # one certificate, fetched once, never from elsewhere
    with pytest.raises(ReceiptRejected) as exc:
        await ReceiptVerifier().sns(orjson.dumps(note))
    assert "no SNS topic configured" in exc.value.detail
    # an old message, validly signed: too old to be a receipt
    old = ses.signer.sign({**note, "MessageId": "m-old", "Timestamp": "2020-01-01T00:00:00.000Z"})
    with pytest.raises(ReceiptRejected) as exc:
        await v.sns(orjson.dumps(old))
    assert exc.value.reason == "stale"


def test_certificate_and_subscribe_urls():
    ok = ["https://sns.us-east-1.amazonaws.com/SimpleNotificationService-abc.pem",
          "https://sns.cn-north-1.amazonaws.com.cn/SimpleNotificationService-abc.pem"]
    bad = ["http://sns.us-east-1.amazonaws.com/SimpleNotificationService-abc.pem",
           "https://sns.us-east-1.amazonaws.com.evil.example/x.pem",
           "https://evil.example/sns.us-east-1.amazonaws.com/x.pem",
           "https://sns.us-east-1.amazonaws.com:8443/x.pem",
           "https://user@sns.us-east-1.amazonaws.com/x.pem",
           "https://sns.us-east-1.amazonaws.com/x.txt", "", None, 42]
    assert all(sns_url_allowed(u) for u in ok)
    assert not any(sns_url_allowed(u) for u in bad)
    assert sns_url_allowed("https://sns.us-east-1.amazonaws.com/?Action=ConfirmSubscription", pem=False)
    assert sns_url_allowed("http://127.0.0.1:9/x", ["http://127.0.0.1:9/"], pem=False)


def test_ses_event_parsing():
    now = 1_700_000_000.0
    mail = {"messageId": "0100-abc-000000", "timestamp": "2023-11-14T22:13:15.000Z"}
    cases = [
        ({"notificationType": "Delivery", "mail": mail, "delivery": {"timestamp": "2023-11-14T22:13:19.000Z"}},
         [("0100-abc-000000", "DELIVERED", None, now - 1)]),
        ({"eventType": "Bounce", "mail": mail, "bounce": {"bounceType": "Transient", "bounceSubType": "MailboxFull"}},
         [("0100-abc-000000", "UNDELIVERED", "bounce Transient/MailboxFull", now - 5)]),
        ({"eventType": "Reject", "mail": mail, "reject": {"reason": "Bad content"}},
         [("0100-abc-000000", "UNDELIVERED", "reject: Bad content", now - 5)]),
        ({"eventType": "Send", "mail": mail}, []),
        ({"eventType": "DeliveryDelay", "mail": mail}, []),
    ]
    for event, want in cases:
        got = [(r.provider_msg_id, r.status, r.error, r.at) for r in parse_ses_event(orjson.dumps(event), now=now)]
        assert got == want, event
    for bad in ({"notificationType": "Bounce"}, {"mail": mail}, {"notificationType": "Delivery", "mail": {}}, "x"):
        with pytest.raises(ReceiptRejected) as exc:
            parse_ses_event(orjson.dumps(bad) if not isinstance(bad, str) else bad, now=now)
        assert exc.value.reason == "malformed"


# ---------------------------------------------------------------- config and the credentials check


def _config(tmp_path, sim: SesSim, extra: str = "") -> str:
    return notify_toml(tmp_path, f"""
[providers.ses]
kind = "ses"
base_url = "{sim.base_url}"
region = "{sim.region}"
access_key_id = "{sim.access_key_id}"
secret_access_key_env = "TEST_AWS_SECRET"
from_addr = "{FROM}"
sns_topic_arns = ["{sim.topic_arn}"]
sns_cert_urls = ["{sim.base_url}/"]
timeout = 5
{extra}
""")


async def test_from_config_and_notify_providers_check(ses, tmp_path, make_delivery):
    s = load_settings(_config(tmp_path, ses), env={})
    spec = s.providers["ses"]
    assert (spec.kind, spec.channel) == ("ses", "email")
    env = {"TEST_AWS_SECRET": ses.secret_access_key}
    p = build_spec(spec, env)
    try:
        assert p.config.sns_topic_arns == (ses.topic_arn,)
        assert (await p.send(make_delivery("email", "ann@example.com", CONTENT))).result == AttemptResult.ACCEPTED
    finally:
        await p.close()
    [line] = await check_all(s.providers, {}, env, timeout=5)
    assert line.ok and "GetAccount: sending enabled, 14/s" in line.message, line
    [line] = await check_all(s.providers, {}, {"TEST_AWS_SECRET": "y" * 40}, timeout=5)
    assert not line.ok and line.message.startswith("auth: GetAccount: 403 SignatureDoesNotMatch")
    ses.sending_enabled = False
    [line] = await check_all(s.providers, {}, env, timeout=5)
    assert not line.ok and "sending is disabled" in line.message
    # the access key id from a variable too
    (tmp_path / "env.toml").write_text((tmp_path / "notify.toml").read_text().replace(
        f'access_key_id = "{ses.access_key_id}"', 'access_key_id_env = "TEST_AWS_KEY"'))
    s = load_settings(str(tmp_path / "env.toml"), env={})
    p = build_spec(s.providers["ses"], {**env, "TEST_AWS_KEY": ses.access_key_id})
    try:
        assert p.config.access_key_id == ses.access_key_id
    finally:
        await p.close()


def test_config_refuses_an_inline_secret(tmp_path):
    sim = SesSim()
    with pytest.raises(ConfigError) as exc:
        load_settings(_config(tmp_path, sim, 'secret_access_key = "abc"'), env={})
    assert exc.value.key == "providers.ses.secret_access_key"
    (tmp_path / "noregion.toml").write_text(
        (tmp_path / "notify.toml").read_text().replace('secret_access_key = "abc"', "").replace(
            f'region = "{sim.region}"', ""))
    with pytest.raises(ConfigError) as exc:
        load_settings(str(tmp_path / "noregion.toml"), env={})
    assert exc.value.key == "providers.ses.region"


def test_the_default_endpoint_is_the_regions():
    assert SesConfig(region="eu-west-1", access_key_id="A", secret_access_key="s", from_addr=FROM).endpoint == \
        "https://email.eu-west-1.amazonaws.com"


async def test_signed_with_a_session_token(ses, make_delivery):
    p = provider_for(ses, session_token="FwoGZXIvYXdzEJr//////////token")
    try:
        req = p._request("POST", "/v2/email/outbound-emails", b"{}")
        assert req.headers["x-amz-security-token"] == "FwoGZXIvYXdzEJr//////////token"
        assert "x-amz-security-token" in req.headers["authorization"]
        assert (await p.send(make_delivery("email", "ann@example.com", CONTENT))).result == AttemptResult.ACCEPTED
    finally:
        await p.close()
