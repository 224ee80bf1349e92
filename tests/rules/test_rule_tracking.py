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
