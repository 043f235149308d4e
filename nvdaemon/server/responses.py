"""What every route module answers with: JSON bodies, query parameters as lists (``?device=a&device=b``), and the
one strict reading of a numeric query parameter."""

from __future__ import annotations

import re
from typing import Any

import msgspec
from quart import Response

_COUNT = re.compile(r"[0-9]{1,9}")  # ASCII digits only: str.isdigit() also takes "³" and "٣", which int() refuses


def json_response(body: dict[str, Any] | list[Any], status: int) -> Response:
    return Response(msgspec.json.encode(body), status=status, content_type="application/json")


def query_lists(args: Any) -> dict[str, list[str]]:
    """A request's query parameters, each with every value it was given."""
    return {key: args.getlist(key) for key in args}


def parse_count(text: str) -> int | None:
    """A non-negative count written in 1-9 ASCII digits, or None for anything else (Unicode digits, signs, spaces,
    exponents, longer numbers): the caller answers 400 naming its parameter."""
    return int(text) if _COUNT.fullmatch(text) else None
