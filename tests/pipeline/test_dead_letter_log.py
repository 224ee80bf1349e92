"""What a dead letter's log line says: where, why, which key (masked as the letter
is), and the detail only when there is one (a lane's letter read "dead letter
from lane: invalid_number: " with nothing after it, and no delivery to look up)."""

import logging

from pipeline.entries import send_dead_letter


async def test_the_log_line_names_the_key_and_leaves_out_an_empty_detail(caplog):
    caplog.set_level(logging.WARNING, logger="notify.entries")
    await send_dead_letter(None, "lane", "invalid_number", b"{}", key="n_abc.sms")
    await send_dead_letter(None, "expand", "bad_json", b"{", detail="line 1", partition=3, offset=9,
                           key="+15550001234")
    lines = [r.getMessage() for r in caplog.records if r.name == "notify.entries"]
    assert lines[0] == "dead letter from lane: invalid_number (key n_abc.sms)"
    assert lines[1].startswith("dead letter from expand[3]@9: bad_json (key ") and lines[1].endswith(": line 1")
    assert "+15550001234" not in lines[1]  # a phone number as a key is masked, as in the letter
