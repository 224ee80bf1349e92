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
