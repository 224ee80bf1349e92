"""What the CLI prints: stream entries as lines that cannot drive a terminal, and
error messages as one line without a URL's credentials."""

from __future__ import annotations

import re
from typing import Optional

__all__ = ["printable", "one_line"]

#: what must not reach a terminal from a stream entry: C0/C1 controls (ESC starts
#: the sequences that retitle, clear or rewrite a terminal; a JSON text never holds
#: one unescaped), line and paragraph separators, bidirectional overrides
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")

_CREDENTIALS = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)[^/@\s]*@")


def printable(value: Optional[bytes]) -> str:
    """A stream entry's value as one line that cannot drive the terminal: bytes that
    are not UTF-8 as ``\\xNN``, control characters as ``\\uNNNN`` (valid JSON
    lines print unchanged)."""
    if value is None:
        return "null"
    text = bytes(value).decode("utf-8", "backslashreplace")
    return _CONTROL.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def one_line(msg: str, limit: int = 600) -> str:
    """An error message as one line: no credentials of a URL, no control characters."""
    msg = _CREDENTIALS.sub(r"\1***@", " ".join(str(msg).split()))
    msg = printable(msg.encode("utf-8", "backslashreplace"))
    return msg if len(msg) <= limit else msg[:limit] + "…"
