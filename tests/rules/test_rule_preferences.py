"""pipeline/rules/preferences.py: a preferences update applied to the table's
current value (a whole document or a merge), and the opt-outs it makes — pure."""

from pipeline.models import Preferences
from pipeline.rules.preferences import apply_update, opt_outs


def P(**kw):
    return Preferences(user_id="u1", **kw)


def test_a_whole_document_replaces_unless_it_is_older():
    cur = P(version=3, switches={"marketing.email": False}, email="a@example.com")
    assert apply_update(cur, P(version=2)) is None  # stale
    same = P(version=3, switches={}, source="api")
    assert apply_update(cur, same) is same  # an equal version is taken (producers without versions)
    assert apply_update(None, P(version=0)) == P(version=0)


def test_a_merge_sets_its_switches_over_the_current_document():
    cur = P(version=5, switches={"social.push": False}, email="a@example.com", tz="Asia/Tokyo")
    upd = P(version=0, switches={"marketing.email": False}, merge=True, source="one_click", producer="shop")
    new = apply_update(cur, upd)
    assert new.switches == {"social.push": False, "marketing.email": False}
    assert (new.email, new.tz, new.version, new.source, new.producer, new.merge) == (
        "a@example.com", "Asia/Tokyo", 5, "one_click", "shop", False)
    assert cur.switches == {"social.push": False}  # the current value is not changed in place
    # a newer version than the table's is kept (the API's read model counted it)
    assert apply_update(cur, P(version=6, switches={"marketing.email": False}, merge=True)).version == 6
    # nothing to change: None (nothing written, nothing recorded)
    assert apply_update(new, upd) is None
    # no document yet: the switches alone
    first = apply_update(None, upd)
    assert first.switches == {"marketing.email": False} and first.version == 0 and not first.merge


def test_opt_outs_are_the_switches_turned_off_against_the_table():
    cur = P(version=1, switches={"marketing.email": False, "social.push": True})
    new = P(version=2, switches={"marketing.email": False, "social.push": False, "*.sms": False,
                                 "transaction.inbox": True})
    assert opt_outs(cur, new) == [("*", "sms"), ("social", "push")]
    assert opt_outs(None, new) == [("*", "sms"), ("marketing", "email"), ("social", "push")]
    # replayed: the table holds it already, nothing is turned off
    assert opt_outs(new, new) == []
    # turning a switch back on is no opt-out
    assert opt_outs(new, P(version=3)) == []


def test_the_update_says_where_it_comes_from():
    import pytest

    from pipeline.parsers.events import InvalidEvent, parse_preferences, parse_receipt

    p = parse_preferences({"user_id": "u1", "switches": {"marketing.email": False}})
    assert (p.source, p.producer, p.merge) == ("stream", "", False)  # a producer writing the topic
    p = parse_preferences({"user_id": "u1", "source": "provider:mail_a", "producer": "shop", "merge": True})
    assert (p.source, p.producer, p.merge) == ("provider:mail_a", "shop", True)
    for bad, field in (({"source": "API\n"}, "source"), ({"source": 1}, "source"), ({"merge": "yes"}, "merge"),
                       ({"producer": "a b"}, "producer")):
        with pytest.raises(InvalidEvent) as exc:
            parse_preferences({"user_id": "u1", **bad})
        assert exc.value.field == field
    r = {"provider": "sendgrid", "provider_msg_id": "m1", "status": "DELIVERED", "at": 1.0}
    assert parse_receipt(r).opt_out is False and parse_receipt({**r, "opt_out": True}).opt_out is True
    with pytest.raises(InvalidEvent):
        parse_receipt({**r, "opt_out": "yes"})
