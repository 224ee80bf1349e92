"""Parsers: bytes from outside (or read back from a stream) → typed records, or
:class:`~pipeline.parsers.events.InvalidEvent` with a reason. Pure, no I/O.

    events.py    what producers send: events, preferences, device updates, receipts,
                 ids and addresses (the API and expand check with the same functions)
    messages.py  the pipeline's own messages read back from its streams (Intent,
                 Delivery, Outcome, Timer): nothing read from a stream is trusted
"""
