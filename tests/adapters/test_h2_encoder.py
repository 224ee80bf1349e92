"""The push adapters' HPACK encoder (adapters/_h2.py ``_Encoder``: no Huffman
coding, no dynamic table) judged by hpack's own decoder, the one h2 servers use:
any header list, block after block on one connection, decodes to what was
encoded, sensitive fields still marked never-indexed, table size changes signalled
first."""

from __future__ import annotations

import hpack
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters._h2 import _Encoder

_STATIC = [(n, v) for n, v in hpack.table.HeaderTable.STATIC_TABLE]
_STATIC_SET = set(_STATIC)
_names = st.one_of(st.sampled_from([n for n, _ in _STATIC]), st.binary(min_size=1, max_size=40).map(bytes.lower))
_values = st.one_of(st.sampled_from([v for _, v in _STATIC]), st.binary(max_size=300), st.binary(min_size=16000, max_size=17000))
_field = st.one_of(
    st.sampled_from(_STATIC).map(lambda nv: (nv, False)),
    st.tuples(st.tuples(_names, _values), st.booleans()),
)
_block = st.lists(_field, max_size=12)


@settings(max_examples=200, deadline=None)
@given(blocks=st.lists(st.tuples(_block, st.one_of(st.none(), st.integers(0, 8192))), min_size=1, max_size=6))
def test_every_block_decodes_to_what_was_encoded(blocks):
    encoder, decoder = _Encoder(), hpack.Decoder()
    decoder.max_allowed_table_size = 8192
    for fields, table_size in blocks:
        if table_size is not None:  # the server's SETTINGS_HEADER_TABLE_SIZE, as h2 passes it on
            encoder.header_table_size = table_size
        headers = [hpack.NeverIndexedHeaderTuple(n, v) if never else hpack.HeaderTuple(n, v) for (n, v), never in fields]
        decoded = decoder.decode(encoder.encode(headers), raw=True)
        assert [(n, v) for n, v in decoded] == [(h[0], h[1]) for h in headers]
        # sensitive: never indexed, unless the static table holds the very field (its
        # index tells nothing a compression attack could learn; hpack's encoder does the same)
        assert [not d.indexable for d in decoded] == [not h.indexable and (h[0], h[1]) not in _STATIC_SET
                                                      for h in headers]
        # nothing was ever added to the decoder's table: every later block stands alone
        assert len(decoder.header_table.dynamic_entries) == 0


def test_plain_tuples_and_text_are_taken_as_h2_may_pass_them():
    encoder, decoder = _Encoder(), hpack.Decoder()
    block = encoder.encode([(":method", "POST"), (b":path", b"/3/device/ab"), ("x-key", "v", True)])
    decoded = decoder.decode(block, raw=True)
    assert [(n, v) for n, v in decoded] == [(b":method", b"POST"), (b":path", b"/3/device/ab"), (b"x-key", b"v")]
    assert [d.indexable for d in decoded] == [True, True, False]
    assert block[:1] == b"\x83"  # :method POST: the static table's index 3, one byte
