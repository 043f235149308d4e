"""What the HTTP server may read of the running agent: a read-only ``Protocol``, never the agent itself.

The server (``nvdaemon/server``) renders ``/metrics``, ``/healthz``, ``/readyz`` and ``/v1/*`` from these values and
writes nothing back; ``nvdaemon/app.py``'s ``Agent`` satisfies ``AgentView`` structurally (mypy checks it where the
agent hands itself to ``serve_http``), and tests pass a small fake instead. Every member is a read-only property or
a query method: the view has no setters, and the mappings it gives are typed as ``Mapping`` (not to be changed).
Nothing here reads a file but ``query_history`` (the history store, through the sink); times are Unix seconds (wall
clock) unless a member says otherwise.

The server imports nothing of ``nvdaemon.sinks`` or ``nvdaemon.history`` (an import-linter contract in
pyproject.toml): what a route needs of a sink or of history, this module gives as plain values or through the small
protocols below (``webhook_targets``, ``query_history``, ``event_stream``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Protocol

if TYPE_CHECKING:
    import trio

    from nvdaemon.engine import ActiveCondition, SeriesKey
    from nvdaemon.exposition import Metric
    from nvdaemon.gpu import GpuRuntime
    from nvdaemon.history.service import HistorySink
    from nvdaemon.kmsg.source import KmsgSource
    from nvdaemon.model import Event, TierSnapshot
    from nvdaemon.sinks.stream.hub import Client, Cursor, Filters, Replay, StreamHub

EventKey = tuple[str, str, str, str, str, str, str]  # nodevitals_events_total's labels (model.Event.count_key)


class Surfaces(NamedTuple):
    """Which drop-in surfaces ``/metrics`` appends (``dcgmCompat``, ``smartctlCompat``, ``nodeExporter`` enabled)."""

    dcgm: bool
    smartctl: bool
    node_exporter: bool


class EngineView(Protocol):
    """The rule engine's state as the server shows it: the active conditions and the last event seq."""

    @property
    def active(self) -> Mapping[SeriesKey, ActiveCondition]: ...
    @property
    def seq(self) -> int: ...
    @property
    def reserved(self) -> int | None: ...  # the seq up to which stateDir holds a reservation (nvdaemon/seqmark.py)
    @property
    def unreserved(self) -> int: ...  # seqs issued past the saved reservation since the start


class BusView(Protocol):
    """The event bus's counters: events published, the most recent ones, and what each subscriber lost."""

    @property
    def published(self) -> int: ...
    @property
    def recent(self) -> Sequence[Event]: ...
    @property
    def drop_totals(self) -> Mapping[str, int]: ...


class TaskView(Protocol):
    """One supervised task (``nvdaemon/supervise.py``'s ``TaskState``), read only."""

    @property
    def state(self) -> str: ...  # starting | running | backoff | stopped
    @property
    def restarts(self) -> int: ...
    def as_json(self) -> dict[str, Any]: ...


class SinkView(Protocol):
    """What the server reads of a sink (the public members every sink keeps)."""

    @property
    def name(self) -> str: ...
    def metrics(self) -> Iterable[Metric]: ...
    def state(self) -> dict[str, Any]: ...
    def dropped_counts(self) -> Mapping[str, int]: ...
    def degraded(self) -> str | None: ...
    def state_writable(self) -> bool | None: ...


class Flag(Protocol):
    """A flag the server may test but not set (``trio.Event`` has this shape)."""

    def is_set(self) -> bool: ...


class AgentView(Protocol):
    """The running agent, read only (see the module docstring)."""

    @property
    def node(self) -> str: ...
    @property
    def config_source(self) -> str: ...  # where the running config was read from (``/v1/status``'s ``config``)
    @property
    def started_at(self) -> float: ...
    @property
    def ready(self) -> bool: ...  # the start sequence has finished
    @property
    def stopping(self) -> Flag: ...  # set at SIGTERM/SIGINT
    @property
    def snapshots(self) -> Mapping[str, TierSnapshot]: ...  # tier -> its latest snapshot
    @property
    def ticks(self) -> Mapping[str, int]: ...  # tier -> ticks completed since the start
    @property
    def snapshot_version(self) -> int: ...  # bumped by every new snapshot
    async def next_snapshot(self, seen: int) -> int: ...  # waits for snapshot_version > seen, returns it
    @property
    def changes(self) -> int: ...  # bumped by anything else /metrics shows that is not a snapshot or an event
    @property
    def engine(self) -> EngineView: ...
    @property
    def bus(self) -> BusView: ...
    @property
    def event_counts(self) -> Mapping[EventKey, int]: ...
    @property
    def reloads(self) -> int: ...  # config reloads applied
    @property
    def reload_failures(self) -> int: ...  # config reloads rejected
    @property
    def last_reload_ok(self) -> bool: ...
    @property
    def tasks(self) -> Mapping[str, TaskView]: ...  # the supervised tasks by name; empty before the start
    @property
    def sinks(self) -> Mapping[str, SinkView]: ...
    @property
    def history(self) -> HistorySink | None: ...  # the history sink, when history is enabled
    @property
    def stream(self) -> StreamHub | None: ...  # the websocket hub, when the stream sink is enabled
    @property
    def gpu(self) -> GpuRuntime | None: ...  # opened NVML, for the GPU pod-attribution metrics
    @property
    def kmsg(self) -> KmsgSource | None: ...  # the kernel-log source while it runs
    @property
    def surfaces(self) -> Surfaces: ...  # the drop-in surfaces the running config enables

    def active_tiers(self) -> list[str]: ...
    def interval(self, tier: str) -> float: ...  # the tier's collection interval, seconds
    def health_problems(self) -> list[str]: ...  # why /healthz fails; empty when healthy


# ---- what the routes need of the sinks and of history -----------------------------------------------------------
def webhook_targets(view: AgentView) -> dict[str, str]:
    """Sink name -> the URL each webhook endpoint posts to (``sinks.webhook[].url`` as configured, userinfo and all:
    the caller cuts what it shows)."""
    if not any(name.startswith("webhook:") for name in view.sinks):
        return {}  # the webhook modules stay unloaded without an endpoint
    from nvdaemon.sinks.webhook.endpoint import WebhookEndpoint  # already loaded: the endpoints were built from it

    return {name: sink.hook.url for name, sink in view.sinks.items() if isinstance(sink, WebhookEndpoint)}


class HistorySeries(Protocol):
    """One series of a history answer: its device, labels and points (window end in Unix seconds, avg, min, max),
    oldest first."""

    @property
    def device(self) -> str: ...
    @property
    def labels(self) -> dict[str, str]: ...
    @property
    def points(self) -> Sequence[tuple[int, float, float, float]]: ...


class HistoryResult(Protocol):
    """A history answer: its series, each with at least one point."""

    @property
    def series(self) -> Sequence[HistorySeries]: ...


@dataclass(frozen=True)
class HistoryRefusal:
    """Why a history query has no answer: ``parameter`` (``param`` names it, ``detail`` says why), ``unavailable``
    (the store is not open yet: the task is starting or restarting) or ``too_many`` (``points`` over ``limit``)."""

    reason: Literal["parameter", "unavailable", "too_many"]
    detail: str = ""
    param: str = ""
    points: int = 0
    limit: int = 0


def history_tier(metric: str) -> str:
    """The tier that collects ``metric`` (``gpu``, ``smart`` or ``core``, by its name), as history's answers say."""
    from nvdaemon.history.core import tier_of

    return tier_of(metric)


async def query_history(
    view: AgentView, metric: str, args: Mapping[str, Sequence[str]], now: float
) -> HistoryResult | HistoryRefusal | None:
    """``metric``'s series for the query string ``args`` (``nvdaemon/history/core.py``'s ``parse_query``: ``range``,
    ``node``, ``device``, ``step``) at ``now`` (Unix seconds), at most ``MAX_POINTS`` points; None when history is
    off. Reads the history store (sqlite) in a worker thread."""
    sink = view.history
    if sink is None:
        return None
    from nvdaemon.history.core import MAX_POINTS, ParamError, TooManyPoints, check_metric, parse_query
    from nvdaemon.history.service import Unavailable

    try:
        check_metric(metric)
        q = parse_query(args, now=now)
    except ParamError as exc:
        return HistoryRefusal("parameter", detail=str(exc), param=exc.param)
    try:
        result = await sink.query(metric, q, MAX_POINTS)
    except Unavailable:
        return HistoryRefusal("unavailable")
    except TooManyPoints as exc:
        return HistoryRefusal("too_many", points=exc.points, limit=exc.limit)
    return result


class StreamFrame(Protocol):
    """One websocket message as the hub built it: ``wire`` the complete text frame, ``payload`` its UTF-8 body."""

    @property
    def wire(self) -> bytes: ...
    @property
    def payload(self) -> bytes: ...
    @property
    def text(self) -> str: ...


class StreamReplay(Protocol):
    """The buffered events a client asked for (``since``/``replay``), and whether its cursor was found."""

    @property
    def messages(self) -> Sequence[StreamFrame]: ...
    @property
    def unknown_cursor(self) -> bool: ...
    @property
    def oldest(self) -> str | None: ...
    def control(self, since: str | None) -> str | None: ...  # the unknown-cursor control message, as JSON text


class StreamClient(Protocol):
    """One live client: the route drains ``receive``, and closes with ``close_code`` once ``kicked`` is set."""

    @property
    def receive(self) -> trio.MemoryReceiveChannel[StreamFrame]: ...
    @property
    def kicked(self) -> trio.Event: ...
    @property
    def close_code(self) -> int | None: ...
    @property
    def close_reason(self) -> str: ...


class StreamCursor(Protocol):
    """Where a client's replay starts: after the event ``since``, when it gave one."""

    @property
    def since(self) -> str | None: ...


# The close code the hub kicks its clients with when the agent shuts down (RFC 6455 "going away"; the hub's
# CLOSE_GOING_AWAY, checked equal by the server's tests).
STREAM_GOING_AWAY = 1001


class EventStream:
    """The websocket hub (``nvdaemon/sinks/stream/hub.py``'s ``StreamHub``) as ``/v1/events`` uses it: a query string
    parsed into filters and a cursor (opaque to the route), the buffered events they select, and live clients
    connected and disconnected."""

    def __init__(self, hub: StreamHub) -> None:
        self._hub = hub

    @property
    def buffer_size(self) -> int:  # events the hub keeps for replay (``sinks.stream.bufferSize``)
        return self._hub.config.buffer_size

    @property
    def ping_seconds(self) -> float:  # the application-level keepalive (``sinks.stream.pingSeconds``)
        return self._hub.config.ping_seconds

    def request(self, args: Mapping[str, list[str]]) -> tuple[Filters, Cursor] | str:
        """The filters and cursor of a query string, or why it is refused (a message for the 400 answer)."""
        from nvdaemon.sinks.stream.hub import Cursor, FilterError, Filters

        try:
            return Filters.from_query(args), Cursor.from_query(args, self.buffer_size)
        except FilterError as exc:
            return str(exc)

    def recent(self, filters: Filters, cursor: Cursor) -> Replay:
        """The buffered events ``cursor`` selects; without ``since`` or ``replay``, every buffered one."""
        from nvdaemon.sinks.stream.hub import Cursor

        if cursor.since is None and not cursor.replay:
            cursor = Cursor(replay=self.buffer_size)
        return self._hub.snapshot(filters, cursor)

    def connect(self, filters: Filters, cursor: Cursor) -> tuple[Client, Replay] | None:
        """A new live client and its replay; None when the hub takes no more now (``maxClients``, or stopping)."""
        from nvdaemon.sinks.stream.hub import Refused

        try:
            return self._hub.connect(filters, cursor)
        except Refused:
            return None

    def disconnect(self, client: Client) -> None:
        """The client's connection ended, whoever ended it."""
        self._hub.disconnect(client)


def event_stream(view: AgentView) -> EventStream | None:
    """The websocket hub while it runs; None when the stream sink is off or not running."""
    hub = view.stream
    return EventStream(hub) if hub is not None and hub.running else None


def stream_frame(payload: bytes) -> StreamFrame:
    """``payload`` (UTF-8 text) as a websocket frame, built as the hub builds its events' (a control message)."""
    from nvdaemon.sinks.stream.hub import Frame

    return Frame.of(payload)
