"""What the HTTP server may read of the running agent: a read-only ``Protocol``, never the agent itself.

The server (``nvdaemon/server``) renders ``/metrics``, ``/healthz``, ``/readyz`` and ``/v1/*`` from these values and
writes nothing back; ``nvdaemon/app.py``'s ``Agent`` satisfies ``AgentView`` structurally (mypy checks it where the
agent hands itself to ``serve_http``), and tests pass a small fake instead. Every member is a read-only property or
a query method: the view has no setters, and the mappings it gives are typed as ``Mapping`` (not to be changed).
Nothing here reads a file; times are Unix seconds (wall clock) unless a member says otherwise.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

if TYPE_CHECKING:
    from nvdaemon.engine import ActiveCondition, SeriesKey
    from nvdaemon.exposition import Metric
    from nvdaemon.gpu import GpuRuntime
    from nvdaemon.history.service import HistorySink
    from nvdaemon.model import Event
    from nvdaemon.sinks.stream import StreamHub
    from nvdaemon.tiers import TierSnapshot

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
    def surfaces(self) -> Surfaces: ...  # the drop-in surfaces the running config enables

    def active_tiers(self) -> list[str]: ...
    def interval(self, tier: str) -> float: ...  # the tier's collection interval, seconds
    def health_problems(self) -> list[str]: ...  # why /healthz fails; empty when healthy
