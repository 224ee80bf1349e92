"""adapters/_http.py ``form_body``: the body httpx itself writes for ``data=``, for
any names and values (pure logic: no server)."""

from urllib.parse import quote_plus as urllib_quote_plus

import pytest
from hypothesis import given, settings, strategies as st
from httpx._content import encode_urlencoded_data

from adapters._http import form_body, quote_plus

values = st.one_of(st.text(), st.integers(), st.booleans(), st.none(), st.lists(st.text(max_size=8), max_size=3))


def _httpx(data):
    """The body httpx itself encodes for ``data=``."""
    _headers, stream = encode_urlencoded_data(data)
    return b"".join(stream)


def _same_as(ours, theirs, arg):
    """``ours(arg)`` is ``theirs(arg)``, or both refuse it with UnicodeEncodeError (a
    lone surrogate)."""
    try:
        want = theirs(arg)
    except UnicodeEncodeError:
        with pytest.raises(UnicodeEncodeError):
            ours(arg)
        return
    assert ours(arg) == want


@settings(max_examples=400)
@given(st.text())
def test_quote_plus_is_urllibs(text):
    _same_as(quote_plus, urllib_quote_plus, text)


@settings(max_examples=300)
@given(st.dictionaries(st.text(max_size=8), values, max_size=5))
def test_form_body_is_the_body_httpx_writes(data):
    _same_as(form_body, _httpx, data)
