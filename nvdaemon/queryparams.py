"""The one strict reading of a numeric query parameter, shared by the HTTP routes and the stream sink's filters
(``?replay=``, ``?count=``): the sink parses what a client asked for without depending on the server."""

from __future__ import annotations

import re

_COUNT = re.compile(r"[0-9]{1,9}")  # ASCII digits only: str.isdigit() also takes "³" and "٣", which int() refuses


def parse_count(text: str) -> int | None:
    """A non-negative count written in 1-9 ASCII digits, or None for anything else (Unicode digits, signs, spaces,
    exponents, longer numbers): the caller answers 400 naming its parameter."""
    return int(text) if _COUNT.fullmatch(text) else None
