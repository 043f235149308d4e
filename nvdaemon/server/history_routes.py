"""``GET /v1/history/{metric}``: the node's long-term history of one metric (``nvdaemon/history``), in the Go agent's
shape (nodevitals-contract.md section 4).

Query parameters: ``range`` (``Nd`` or any Go duration: ``90d``, ``90m``, ``1h30m``, ``2h45m30s``, ``1.5h``; empty =
everything kept), ``node`` (this agent's node, or nothing matches), ``device`` (exact name), and ours, ``step``
(re-downsample to buckets this long, same syntax, at least ``1m``, whole seconds).

Answers a JSON array of series ``{metric, node, tier, device, labels, points}`` (``labels`` left out when empty),
each point ``{timestamp, value, min, max}``: the window's (or bucket's) average as ``value``, beside it the minimum
and maximum, stamped at the window's end as Go's ``time.Time`` writes it (RFC 3339, UTC). Series and points oldest
first; a series without a point in the range is left out; an unknown metric is ``[]``. 400 names the bad parameter;
413 when the answer would exceed 200,000 points; 404 ``history not enabled`` (Go's words) when history is off; 503
while the store is not open. Every error is a JSON object with ``error``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import msgspec
from quart import Response, request
from quart_trio import QuartTrio

from nvdaemon.gotime import rfc3339
from nvdaemon.server.responses import json_response, query_lists
from nvdaemon.view import HistoryRefusal, HistoryResult, history_tier, query_history

if TYPE_CHECKING:
    from nvdaemon.view import AgentView


class GoPoint(msgspec.Struct):
    timestamp: str
    value: float
    min: float
    max: float


class GoSeries(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One element of the answer, fields in the Go agent's order; empty labels are left out, as Go does."""

    metric: str
    node: str
    tier: str
    device: str
    labels: dict[str, str] = {}
    points: list[GoPoint]


CHUNK = 4096  # points made into objects and bytes at a time


def series_json(metric: str, node: str, result: HistoryResult) -> Iterator[bytes]:
    """The answer's JSON in pieces, so that the points read are never held a second time as 200,000 objects (the Go
    chart's memory limit is 64 MiB; 200,000 points are about 14 MB of JSON). Each series is encoded without its
    points, which then go in place of its empty array (``points`` is the last field: the bytes end in ``[]}``)."""
    tier = history_tier(metric)
    enc = msgspec.json.Encoder()
    yield b"["
    for i, s in enumerate(result.series):
        head = enc.encode(GoSeries(metric=metric, node=node, tier=tier, device=s.device, labels=s.labels, points=[]))
        assert head.endswith(b"[]}")
        yield (b"," if i else b"") + head[:-2]
        for j in range(0, len(s.points), CHUNK):
            part = enc.encode([GoPoint(rfc3339(t), avg, lo, hi) for t, avg, lo, hi in s.points[j : j + CHUNK]])
            yield (b"," if j else b"") + part[1:-1]
        yield b"]}"
    yield b"]"


def register(app: QuartTrio, view: AgentView) -> None:
    @app.get("/v1/history/<metric>")
    async def history(metric: str) -> Response:
        result = await query_history(view, metric, query_lists(request.args), now=time.time())
        if result is None:
            return json_response({"error": "history not enabled"}, 404)
        if isinstance(result, HistoryRefusal):
            if result.reason == "parameter":
                detail = {"error": "bad request", "parameter": result.param, "detail": result.detail}
                return json_response(detail, 400)
            if result.reason == "unavailable":
                return json_response({"error": "history store not open yet"}, 503)
            hint = "narrow range=, pick one device=, or re-downsample with a larger step= (e.g. step=1h or step=1d)"
            body = {"error": "too many points", "points": result.points, "limit": result.limit, "hint": hint}
            return json_response(body, 413)
        # One body rather than a streamed one: quart-trio's test client reads a streamed body only once the route
        # has returned, through a channel of 10 chunks, so a longer stream would hang every in-process test.
        return Response(b"".join(series_json(metric, view.node, result)), content_type="application/json")
