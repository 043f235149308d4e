"""The data model shared by collectors, the rule engine, sinks and the HTTP surface.

Everything here is plain data: no I/O and no trio import, so the pure core can be tested with tables. That includes a
tier's cycle as a value (``TierSnapshot``, with each collector's ``Interpreted`` result and ``CollectorStatus``):
``nvdaemon.tiers`` runs the loops that make them, and the surfaces, the server, history and the sinks read them
without importing the loops.
"""

from __future__ import annotations

import enum
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeVar

import msgspec

from nvdaemon.gotime import rfc3339  # one format for every time we write, as Go's time.Time

Labels = tuple[tuple[str, str], ...]
"""Extra labels of a series, sorted by name; a tuple so that series keys are hashable."""


class Kind(enum.Enum):
    GAUGE = "gauge"
    COUNTER = "counter"


class Severity(enum.IntEnum):
    """Ordered so that a minimum-severity filter is a comparison."""

    INFO = 0
    WARNING = 1
    CRITICAL = 2

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, text: str) -> Severity:
        return cls[text.upper()]


class Phase(enum.Enum):
    ENTER = "ENTER"
    EXIT = "EXIT"


def make_labels(mapping: dict[str, str] | None = None) -> Labels:
    """Normalise a label mapping into the sorted tuple form used in series keys."""
    if not mapping:
        return ()
    return tuple(sorted((str(k), str(v)) for k, v in mapping.items()))


class Sample(msgspec.Struct, frozen=True):
    """One observation. ``metric`` is the internal name (no ``nodevitals_hw_`` prefix).

    ``timestamp`` is seconds since the epoch (wall clock) of the collection.
    """

    metric: str
    device: str
    value: float
    kind: Kind = Kind.GAUGE
    labels: Labels = ()
    tier: str = "core"
    timestamp: float = 0.0

    @property
    def series(self) -> tuple[str, str, Labels]:
        """The key a rule's state is tracked under: the full series, labels included."""
        return (self.metric, self.device, self.labels)


COUNT_LABELS = ("node", "tier", "device", "condition", "severity", "phase", "xid")
"""Label keys of ``nodevitals_events_total``, as the Go agent has them (nodevitals-contract.md §2)."""


class Event(msgspec.Struct, frozen=True):
    """A state transition of one condition on one device.

    ``id`` is unique across restarts and stays the same across delivery retries; ``seq`` increases by one per
    event emitted by this node and survives restarts. ``detail`` holds ``{value, threshold, metric, labels}`` for
    rule events and ``{xid, description, gpu_uuid, pci_bus_id}`` for XIDs.

    Times are float seconds since the epoch here and in the spool (``msgspec`` encoding of this struct); what
    leaves the agent (webhook, stream, ``/v1/events``) is ``wire()``.
    """

    id: str
    node: str
    tier: str
    device: str
    condition: str
    phase: Phase
    severity: str
    seq: int
    started_at: float
    ended_at: float | None = None
    detail: dict[str, object] = msgspec.field(default_factory=dict)

    def wire(self) -> dict[str, Any]:
        """The event as the Go agent sends it under CloudEvent ``data`` (nodevitals-contract.md §3).

        ``started_at`` and ``ended_at`` are RFC 3339 (``rfc3339``); ``ended_at`` is there only on an EXIT, never
        as ``null``. An EXIT carries its ENTER's ``started_at``.
        """
        out: dict[str, Any] = {
            "id": self.id,
            "node": self.node,
            "tier": self.tier,
            "device": self.device,
            "condition": self.condition,
            "phase": self.phase.value,
            "severity": self.severity,
            "seq": self.seq,
            "started_at": rfc3339(self.started_at),
        }
        if self.phase is Phase.EXIT and self.ended_at is not None:
            out["ended_at"] = rfc3339(self.ended_at)
        out["detail"] = dict(self.detail)
        return out

    def count_key(self) -> tuple[str, str, str, str, str, str, str]:
        """The labels of ``nodevitals_events_total`` in ``COUNT_LABELS`` order; ``xid`` is empty but for XIDs."""
        xid = self.detail.get("xid")
        return (
            self.node,
            self.tier,
            self.device,
            self.condition,
            self.severity,
            self.phase.value,
            "" if xid is None else str(xid),
        )


_last_ms = 0
_counter = 0


def new_event_id(now: float | None = None) -> str:
    """A time-ordered id in UUIDv7 layout: 48 bits of milliseconds, then randomness.

    Unique across restarts without any state (74 random bits per id), and sortable by creation time, which lets a
    ``?since=<id>`` replay compare ids. Within one millisecond a counter keeps ids of this process increasing.
    """
    global _last_ms, _counter
    ms = int((time.time() if now is None else now) * 1000)
    if ms <= _last_ms:
        ms = _last_ms
        _counter += 1
    else:
        _last_ms, _counter = ms, 0
    rand = int.from_bytes(os.urandom(8), "big")
    # 12 bits after the version nibble carry the in-millisecond counter; the rest is random.
    rand_a = _counter & 0xFFF
    rand_b = rand & ((1 << 62) - 1)
    value = (ms << 80) | (0x7 << 76) | (rand_a << 64) | (0b10 << 62) | rand_b
    h = f"{value:032x}"
    return f"{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


# ---- a tier's cycle, as a value ---------------------------------------------------------------------------------
T = TypeVar("T")


def _frozen_map(value: Mapping[str, T]) -> Mapping[str, T]:
    """A read-only copy (a ``MappingProxyType`` over a dict of its own, so the caller's dict can change freely)."""
    return MappingProxyType(dict(value))


@dataclass(frozen=True)
class Interpreted:
    """What one ``interpret`` produced: this cycle's samples. A collector whose data a compat surface renders
    returns a subclass that adds it (the smart tier's disk reports, the node_exporter families, the GPU identities)."""

    samples: tuple[Sample, ...]

    def detail(self) -> dict[str, Any]:
        """Plain data about this result for ``/v1/status`` (joined with ``Collector.detail()``)."""
        return {}


@dataclass(frozen=True)
class ReadCounts:
    """A cycle's shared reads as a value: files read, reads answered from the cache, the paths in first-asked order."""

    reads: int = 0
    shared: int = 0
    paths: tuple[str, ...] = ()  # as strings: turning each back into a Path every cycle would cost more than a read


@dataclass(frozen=True)
class CollectorStatus:
    """The outcome of one run of a collector, and its totals since start: a value, one per cycle."""

    name: str
    success: bool = False  # no error this run (an absent source is not an error)
    present: bool = True  # the source exists on this node
    duration: float = 0.0
    errors: Sequence[str] = ()  # a tuple
    error_total: int = 0
    samples: int = 0
    detail: Mapping[str, Any] = field(default_factory=dict)  # Collector.detail() of this run, when it has one

    def __post_init__(self) -> None:
        object.__setattr__(self, "errors", tuple(self.errors))
        object.__setattr__(self, "detail", _frozen_map(self.detail))

    def as_json(self) -> dict[str, Any]:
        return {
            "success": self.success,
            "present": self.present,
            "durationSeconds": round(self.duration, 6),
            "errors": list(self.errors),
            "errorTotal": self.error_total,
            "samples": self.samples,
            **({"detail": dict(self.detail)} if self.detail else {}),
        }


@dataclass(frozen=True)
class TierSnapshot:
    """One cycle of a tier, as a value: nothing in it changes after it is made, and it holds no collector.

    ``results`` has an entry for each collector that produced one *in this cycle* (one that timed out, was skipped
    or failed to interpret has none), so a surface reading it knows the data is this cycle's without comparing
    timestamps. ``collectors`` has every collector's status of this cycle.
    """

    tier: str
    samples: Sequence[Sample]  # a tuple
    collectors: Mapping[str, CollectorStatus]  # read-only
    collected_at: float
    duration: float
    results: Mapping[str, Interpreted] = field(default_factory=dict)  # read-only; this cycle's only
    reads: ReadCounts | None = None  # the cycle's shared file reads (how many were shared between collectors)

    def __post_init__(self) -> None:
        object.__setattr__(self, "samples", tuple(self.samples))
        object.__setattr__(self, "collectors", _frozen_map(self.collectors))
        object.__setattr__(self, "results", _frozen_map(self.results))
