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


@settings(max_examples=400)
@given(st.text())
def test_quote_plus_is_urllibs(text):
    try:
        want = urllib_quote_plus(text)
    except UnicodeEncodeError:
        with pytest.raises(UnicodeEncodeError):
            quote_plus(text)
        return
    assert quote_plus(text) == want


@settings(max_examples=300)
@given(st.dictionaries(st.text(max_size=8), values, max_size=5))
def test_form_body_is_the_body_httpx_writes(data):
    try:
        want = _httpx(data)
    except UnicodeEncodeError:
        with pytest.raises(UnicodeEncodeError):
            form_body(data)
        return
    assert form_body(data) == want
