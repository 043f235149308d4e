"""What every route module answers with: JSON bodies and query parameters as lists (``?device=a&device=b``); the
strict reading of a numeric query parameter is ``nvdaemon.queryparams.parse_count``."""

from __future__ import annotations

from typing import Any

import msgspec
from quart import Response


def json_response(body: dict[str, Any] | list[Any], status: int) -> Response:
    return Response(msgspec.json.encode(body), status=status, content_type="application/json")


def query_lists(args: Any) -> dict[str, list[str]]:
    """A request's query parameters, each with every value it was given."""
    return {key: args.getlist(key) for key in args}
