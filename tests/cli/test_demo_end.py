"""When `notify demo` has seen the end of its run (pipeline/cli/demo.py ``finished``)."""

from pipeline.cli.demo import finished


def test_all_records_terminal_is_not_the_end_while_events_have_none():
    # the OTPs' records all terminal, the campaign's events not expanded yet
    assert not finished((300, 300, 0, 300), events=1000, still=10)


def test_the_end_once_every_event_has_a_record_and_all_are_settled_for_two_seconds():
    assert not finished((2500, 2400, 90, 1000), events=1000, still=10)
    assert not finished((2500, 2400, 100, 1000), events=1000, still=3)
    assert finished((2500, 2400, 100, 1000), events=1000, still=4)


def test_thirty_seconds_without_progress_ends_it_whatever_is_missing():
    assert finished((300, 300, 0, 300), events=1000, still=60)
    assert not finished((0, 0, 0, 0), events=10, still=59)


def test_first_try_leaves_out_a_hung_call_its_receipt_made_delivered(tmp_path):
    """A call that hung to its deadline (TIMEOUT_UNKNOWN) and whose record turned
    DELIVERED by the provider's receipt has no retry and no reconciliation; it is
    still not a first try. Nor is a push one of whose devices was answered 429."""
    import re
    import sqlite3

    from pipeline.cli.demo import _summary
    from pipeline.store.schema import _SCHEMA

    db = tmp_path / "records.db"
    con = sqlite3.connect(db)
    con.executescript(_SCHEMA)

    def record(i, delivery_id, channel, latency_ms, status="DELIVERED"):
        con.execute("INSERT INTO notify_record (biz_key, user_id, channel, template_code, status, state_key, retry_count,"
                    " created_at, updated_at, delivery_id, notification_id, category, priority, accepted_at,"
                    " latency_ms) VALUES (?, 'u', ?, 'otp', ?, 0, 1, 0, 0, ?, ?, 'otp', 'high', 0, ?)",
                    (f"demo:r:{i}", channel, status, delivery_id, f"n{i}", latency_ms))

    def attempt(delivery_id, result):
        con.execute("INSERT INTO attempts (notification_id, seq, channel, provider, started_at, result,"
                    " delivery_id) VALUES ('n', 1, 'sms', 'p', 0, ?, ?)", (result, delivery_id))

    for i in range(50):  # answered at once: 100-149 ms
        record(i, f"d{i}", "sms", 100 + i, status="ACCEPTED")
        attempt(f"d{i}", "ACCEPTED")
    record(50, "hung", "sms", 1200)  # hung, then DELIVERED by its receipt
    attempt("hung", "TIMEOUT_UNKNOWN")
    record(51, "push1", "push", 1300)  # one device answered 429, the other ACCEPTED
    attempt("push1.dev-a", "ACCEPTED")
    attempt("push1.dev-b", "RATE_LIMITED")
    con.commit()
    con.close()
    line = next(ln for ln in _summary(db, "demo:r:").splitlines() if ln.startswith("high"))
    n, p50, p99, first = re.split(r"\s+", line.strip())[1:5]
    assert (n, p99, first) == ("52", "1300.0", "149.0"), line


def test_what_a_straggler_waits_for_is_said_in_words():
    from pipeline.cli.demo import describe_in_flight

    assert describe_in_flight([], 100.0) == ""
    text = describe_in_flight([("UNKNOWN", "reconcile_retry", 1, None), ("PENDING", "rate_limited", 2, 118.4),
                               ("PENDING", "", 1, None)], 100.0)
    assert text.startswith("4 in flight (")
    assert "1 UNKNOWN reconcile_retry: the provider is asked again" in text
    assert "2 PENDING rate_limited: answered 429: backing off to retry, the last due in 18 s;" in text
    assert text.endswith("; 1 PENDING)")
    # a due time past (the retry is on its way) is not said
    assert "due" not in describe_in_flight([("PENDING", "rate_limited", 1, 99.0)], 100.0)


def test_the_records_in_flight_of_this_run_only(tmp_path):
    import sqlite3

    from pipeline.cli.demo import _in_flight
    from pipeline.store.schema import _SCHEMA

    db = tmp_path / "records.db"
    con = sqlite3.connect(db)
    con.executescript(_SCHEMA)
    for i, (key, status, reason) in enumerate([("demo:r:1", "UNKNOWN", "timeout"), ("demo:r:2", "ACCEPTED", None),
                                               ("demo:r:3", "SCHEDULED", "deferred"), ("demo:q:4", "PENDING", None),
                                               ("demo:r:5", "UNKNOWN", "timeout"), ("demo:r:6", "PENDING", "rate_limited"),
                                               ("demo:r:7", "PENDING", "rate_limited")]):
        con.execute("INSERT INTO notify_record (biz_key, user_id, channel, template_code, status, reason, state_key,"
                    " retry_count, created_at, updated_at, delivery_id, notification_id, category, priority,"
                    " accepted_at) VALUES (?, 'u', 'sms', 'otp', ?, ?, 0, 1, 0, 0, ?, ?, 'otp', 'high', 0)",
                    (key, status, reason, f"d{i}", f"n{i}"))
    # d5's first call answered 429 (its next try at 150), then again (at 170); d6's, at 160;
    # a push's device delivery counts for its record
    for did, seq, next_at in (("d5", 1, 150.0), ("d5", 2, 170.0), ("d6.dev-a", 1, 160.0)):
        con.execute("INSERT INTO attempts (notification_id, seq, channel, provider, started_at, result, delivery_id,"
                    " next_at) VALUES ('n', ?, 'sms', 'p', 0, 'RATE_LIMITED', ?, ?)", (seq, did, next_at))
    con.commit()
    con.close()
    assert sorted(_in_flight(db, "demo:r:")) == [("PENDING", "rate_limited", 2, 170.0), ("UNKNOWN", "timeout", 2, None)]
