"""``GET /v1/history/{metric}``: the node's long-term history of one metric (``nvdaemon/history``).

Query parameters: ``range`` (``90d``, ``6h``, ``30m``, ...; empty = everything kept), ``step`` (re-downsample to
buckets this long, at least ``1m``), ``device`` (exact name), ``node`` (this agent's node, or nothing matches).
Answers ``{"metric", "node", "intervalSeconds", "step", "since", "columns", "series": [{"device", "labels",
"points": [[time, avg, min, max], ...]}]}``, points oldest first, time in unix seconds at the end of the window (or
bucket). 400 names the bad parameter; 413 when the answer would exceed 200,000 points; 404 when history is disabled;
503 while the store is not open.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from quart import Response, request
from quart_trio import QuartTrio

from nvdaemon.history.core import MAX_POINTS, ParamError, TooManyPoints, check_metric, parse_query
from nvdaemon.history.service import HistorySink, Unavailable
from nvdaemon.server.responses import json_response, query_lists

if TYPE_CHECKING:
    from nvdaemon.app import Agent


def register(app: QuartTrio, agent: Agent) -> None:
    @app.get("/v1/history/<metric>")
    async def history(metric: str) -> Response:
        sink = agent.sinks.get("history")
        if not isinstance(sink, HistorySink):
            return json_response({"error": "history disabled"}, 404)
        try:
            check_metric(metric)
            q = parse_query(query_lists(request.args), now=time.time())
        except ParamError as exc:
            return json_response({"error": "bad request", "parameter": exc.param, "detail": str(exc)}, 400)
        try:
            result = await sink.query(metric, q, MAX_POINTS)
        except Unavailable:
            return json_response({"error": "history store not open yet"}, 503)
        except TooManyPoints as exc:
            hint = "narrow range=, pick one device=, or re-downsample with a larger step= (e.g. step=1h or step=1d)"
            body = {"error": "too many points", "points": exc.points, "limit": exc.limit, "hint": hint}
            return json_response(body, 413)
        return json_response(
            {
                "metric": metric,
                "node": agent.node,
                "intervalSeconds": sink.windows.interval,
                "step": q.step,
                "since": q.since,
                "columns": ["time", "avg", "min", "max"],
                "series": [{"device": s.device, "labels": s.labels, "points": s.points} for s in result.series],
            },
            200,
        )
