"""pipeline/rules/tracking.py: signed link tokens, the rewrite of rendered
content, the opt-outs of a preferences update — pure functions."""

import html

from hypothesis import given, settings as hsettings, strategies as st

from pipeline.ids import delivery_id
from pipeline.rules import tracking as T

KEY = b"k" * 32
DID = delivery_id("order:1", "u1", "email")
TR = T.Tracker(key=KEY, base_url="https://n.example", limits={"push": {"body": 178}})

dids = st.one_of(st.sampled_from([DID, delivery_id("b", "u", "push"), delivery_id("x", "y", "inbox", "p1")]),
                 st.text(min_size=1, max_size=60))
urls = st.builds(lambda s, p: f"{s}://{p}", st.sampled_from(["http", "https"]),
                 st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=80))


@hsettings(max_examples=150, deadline=None)
@given(did=dids, index=st.integers(0, T.MAX_LINKS - 1), url=urls, data=st.data())
def test_a_click_token_verifies_and_any_bit_flip_fails(did, index, url, data):
    tok = T.sign_click(KEY, did, index, url)
    assert T.verify_click(KEY, tok) == T.Link(did, index, url)
    assert T.verify_click(b"other key", tok) is None
    assert T.verify_open(KEY, tok) is None  # a click token is not an open token
    raw = bytearray(T._unb64(tok))
    bit = data.draw(st.integers(0, len(raw) * 8 - 1))
    raw[bit // 8] ^= 1 << (bit % 8)
    assert T.verify_click(KEY, T._b64(bytes(raw))) is None


@given(did=dids)
def test_an_open_token_verifies(did):
    tok = T.sign_open(KEY, did)
    assert T.verify_open(KEY, tok) == did and T.verify_click(KEY, tok) is None


def test_garbage_tokens_are_refused():
    for tok in ("", "x", "%%%", "A" * 9000, "AAAA", T.sign_click(KEY, DID, 0, "https://a") + "A"):
        assert T.verify_click(KEY, tok) is None and T.verify_open(KEY, tok) is None


def test_email_links_are_rewritten_with_one_index_per_url():
    content = {"subject": "Hi https://not.rewritten", "text": "Track: https://t.example/x?a=1&b=2.",
               "html": '<a href="https://t.example/x?a=1&amp;b=2">go</a> <a href="mailto:a@b">m</a>'}
    out, links = T.rewrite(TR, "email", DID, content)
    assert out["subject"] == content["subject"]
    assert links == [T.Link(DID, 0, "https://t.example/x?a=1&b=2")]
    assert out["text"].startswith("Track: https://n.example/t/c/") and out["text"].endswith(".")
    tok_text = out["text"][len("Track: https://n.example/t/c/"):-1]
    tok_html = out["html"].split('href="https://n.example/t/c/')[1].split('"')[0]
    assert tok_text == tok_html and T.verify_click(KEY, tok_html).url == "https://t.example/x?a=1&b=2"
    assert "mailto:a@b" in out["html"]
    # never twice
    again, links2 = T.rewrite(TR, "email", DID, out)
    assert again == out and links2 == []


def test_push_and_inbox_bodies_and_not_other_channels():
    body = {"title": "t", "body": "see https://x.example/p (now)"}
    out, links = T.rewrite(TR, "inbox", DID, body)
    assert "https://n.example/t/c/" in out["body"] and out["body"].endswith(" (now)") and len(links) == 1
    for ch in ("sms", "webhook"):
        assert T.rewrite(TR, ch, DID, {"body": "https://x.example"}) == ({"body": "https://x.example"}, [])


def test_a_part_over_its_limit_keeps_its_links():
    body = {"title": "t", "body": "x" * 150 + " https://x.example/p"}
    out, links = T.rewrite(TR, "push", DID, body)
    assert out == body and links == []


def test_the_open_pixel_goes_before_the_end_of_the_body():
    tr = T.Tracker(key=KEY, base_url="https://n.example/", open_pixel=True)
    out, _ = T.rewrite(tr, "email", DID, {"subject": "s", "text": "t", "html": "<html><body>hi</body></html>"})
    img = out["html"].split('src="https://n.example/t/o/')[1].split('.gif"')[0]
    assert T.verify_open(KEY, img) == DID and out["html"].endswith("</body></html>")


def test_switched_off():
    assert T.switched_off(None, {"marketing.email": False, "otp.sms": True}) == [("marketing", "email")]
    assert T.switched_off({"marketing.email": False}, {"marketing.email": False, "*.push": False}) == [("*", "push")]
    assert T.switched_off({"a.b": True}, {"a.b": False, "all": False}) == [("a", "b"), ("all", "*")]


def test_html_unescape_is_only_for_html():
    assert html.unescape("&amp;") == "&"
    out, links = T.rewrite(TR, "inbox", DID, {"title": "t", "body": "https://x.example/?a=1&amp;b"})
    assert links[0].url == "https://x.example/?a=1&amp;b"


# ---------------------------------------------------------------- one-click unsubscribe (RFC 8058)

names = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=40)


@hsettings(max_examples=150, deadline=None)
@given(user=names, category=names, channel=st.sampled_from(["email", "push", "inbox", "sms", "webhook"]),
       producer=st.one_of(st.just(""), names), data=st.data())
def test_an_unsubscribe_token_verifies_and_any_bit_flip_fails(user, category, channel, producer, data):
    tok = T.sign_unsubscribe(KEY, user, category, channel, producer)
    assert T.verify_unsubscribe(KEY, tok) == T.Unsubscribe(user, category, channel, producer)
    assert T.verify_unsubscribe(b"other key", tok) is None
    # not a click or open token, and they are not unsubscribe tokens
    assert T.verify_click(KEY, tok) is None and T.verify_open(KEY, tok) is None
    assert T.verify_unsubscribe(KEY, T.sign_open(KEY, DID)) is None
    raw = bytearray(T._unb64(tok))
    bit = data.draw(st.integers(0, len(raw) * 8 - 1))
    raw[bit // 8] ^= 1 << (bit % 8)
    assert T.verify_unsubscribe(KEY, T._b64(bytes(raw))) is None
    # cut short or lengthened
    assert T.verify_unsubscribe(KEY, tok[:-1]) is None and T.verify_unsubscribe(KEY, tok + "A") is None


def test_garbage_unsubscribe_tokens_are_refused():
    for tok in ("", "x", "%%%", "A" * 9000, "AAAA", "tok1"):
        assert T.verify_unsubscribe(KEY, tok) is None
    for bad in (("", "marketing", "email"), ("u1", "", "email"), ("u1", "marketing", "fax")):
        try:
            T.sign_unsubscribe(KEY, *bad)
        except ValueError:
            continue
        raise AssertionError(f"signed {bad}")


def test_the_unsubscribe_url_and_its_headers():
    url = T.unsubscribe_url(TR, "u1", "marketing", "email", "shop")
    assert url.startswith("https://n.example/u/")
    assert T.verify_unsubscribe(KEY, url.rsplit("/", 1)[1]) == T.Unsubscribe("u1", "marketing", "email", "shop")
    assert T.list_unsubscribe_headers(url) == {"List-Unsubscribe": f"<{url}>",
                                               "List-Unsubscribe-Post": "List-Unsubscribe=One-Click"}
    for bad in ("", "mailto:x@y", "https://a/\r\nBcc: x@y", "https://a/<b>", "https://a b"):
        try:
            T.list_unsubscribe_headers(bad)
        except ValueError:
            continue
        raise AssertionError(f"a header of {bad!r}")


def test_the_unsubscribe_link_is_never_rewritten_to_the_click_redirect():
    url = T.unsubscribe_url(TR, "u1", "marketing", "email")
    content = {"subject": "s", "text": f"Shop https://shop.example/x\nUnsubscribe: {url}",
               "html": f'<a href="https://shop.example/x">shop</a> <a href="{url}">unsubscribe</a>'}
    out, links = T.rewrite(TR, "email", DID, content)
    assert [link.url for link in links] == ["https://shop.example/x"]
    assert out["text"].endswith(f"Unsubscribe: {url}") and f'href="{url}"' in out["html"]


def test_the_plan_gives_a_refusable_category_its_unsubscribe_link():
    from config.settings import load_settings
    from pipeline.models import Intent, Preferences
    from pipeline.rules.plan import plan_intent
    from pipeline.templates import Renderer

    s = load_settings(env={})
    r = Renderer.from_settings(s)
    prefs = Preferences(user_id="u1", email="u1@example.com")

    def plan(**kw):
        base = dict(notification_id="n_1", biz_key="b1", user_id="u1", category="marketing", template="promo",
                    template_version=1, priority="low", channels=["email", "inbox"], producer="shop",
                    params={"headline": "Sale", "discount": "10%", "url": "https://shop.example/sale"})
        base.update(kw)
        return plan_intent(Intent(**base), settings=s, renderer=r, prefs=prefs, devices=None, now=1_800_000_000.0,
                           dedup_seen=lambda k: None, count_today=lambda k: 0, recent_sends=lambda k: [],
                           tracker=TR)

    assert s.categories["marketing"].one_click_unsubscribe and not s.categories["otp"].one_click_unsubscribe
    # only the templates that use it get it (the others' renders stay shared by an event's recipients)
    assert r.mentions("promo", 1, "email", "en", "unsubscribe_url")
    assert not r.mentions("promo", 1, "push", "en", "unsubscribe_url")
    email, inbox = plan().deliveries
    url = email.content["unsubscribe_url"]
    assert T.verify_unsubscribe(KEY, url.split("/u/", 1)[1]) == T.Unsubscribe("u1", "marketing", "email", "shop")
    # in the template (promo's footer), not rewritten to the click redirect; the shop link is
    assert f"Unsubscribe: {url}" in email.content["text"] and f'href="{url}"' in email.content["html"]
    assert "https://shop.example/sale" not in email.content["text"]
    assert "unsubscribe_url" not in inbox.content  # only e-mail carries it for a header
    # an event's own unsubscribe_url wins in the template; the header link stays ours
    own = plan(params={"headline": "Sale", "discount": "10%", "url": "https://shop.example/sale",
                       "unsubscribe_url": "https://shop.example/prefs"}).deliveries[0]
    assert own.content["unsubscribe_url"] == url and "/u/" not in own.content["text"]
    # a transactional e-mail gets none; nor does anything without a tracker
    ship = plan(category="transaction", template="order_shipped", priority="normal", channels=["email"],
                params={"order_no": "1", "carrier": "UPS", "tracking_no": "1Z", "tracking_url": "https://t.example"})
    assert "unsubscribe_url" not in ship.deliveries[0].content
