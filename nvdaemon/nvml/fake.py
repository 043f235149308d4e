"""A fake NVML that replays a recorded scenario (``fixtures/nvml/*.json``; the format is in the README there).

For fixtures, tests and local runs only (``gpu.backend: fake``). It implements the same narrow interface as the real
backend, including the blocking XID wait, so the GPU tier and the XID source run unchanged on top of it.

Replay: each ``device_count()`` call (one per gpu tier tick) advances one step; step ``k`` applies on tick ``k`` and
the state of the last step holds afterwards. A step can change readings (``null`` = NOT_SUPPORTED), raise XIDs,
mark GPUs lost and recover them, and make the whole library stop answering (``nvmlError``) or answer again. XIDs
are held until a wait takes them (a real event set would drop those raised before registration; replays must not
depend on the timing of the agent's start).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from nvdaemon.nvml import READINGS, GpuIdentity, GpuLost, GpuSnapshot, NvmlFailure, NvmlUnavailable, XidNotice

CALLS_KEPT = 1024  # the fake's call log: the latest calls only (an agent on it waits for XIDs every second)


class ScenarioError(ValueError):
    """The scenario file is not what the fake backend expects; the message names the file and the problem."""


def _readings(where: str, raw: Any) -> dict[str, float | None]:
    if not isinstance(raw, dict):
        raise ScenarioError(f"{where}: expected a mapping of readings")
    out: dict[str, float | None] = {}
    for key, value in raw.items():
        if key not in READINGS:
            raise ScenarioError(f"{where}: unknown reading {key!r}")
        if value is not None and not isinstance(value, int | float):
            raise ScenarioError(f"{where}.{key}: expected a number or null")
        out[key] = None if value is None else float(value)
    return out


class FakeNvml:
    def __init__(self, scenario: dict[str, Any] | str | Path) -> None:
        if isinstance(scenario, dict):
            self.source, doc = "<inline>", scenario
        else:
            self.source = str(scenario)
            try:
                doc = json.loads(Path(scenario).read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise ScenarioError(f"{scenario}: {exc}") from exc
        self.doc = doc
        self._init_error = str(doc.get("initError") or "")
        defaults = _readings(f"{self.source}: defaults", doc.get("defaults", {}))
        self.identities: list[GpuIdentity] = []
        self.current: list[dict[str, float | None]] = []
        self.xid_capable: list[bool] = []
        for i, dev in enumerate(doc.get("devices", [])):
            mig = dev.get("mig", [])
            if not isinstance(mig, list) or not all(isinstance(u, str) for u in mig):
                raise ScenarioError(f"{self.source}: devices[{i}].mig: expected a list of MIG device UUIDs")
            self.identities.append(
                GpuIdentity(
                    i,
                    str(dev.get("uuid", "")),
                    str(dev.get("name", "")),
                    str(dev.get("pciBusId", "")),
                    tuple(mig),
                )
            )
            self.current.append({**defaults, **_readings(f"{self.source}: devices[{i}]", dev.get("readings", {}))})
            self.xid_capable.append(bool(dev.get("xidEvents", True)))
        self.per_tick = _readings(f"{self.source}: perTick", doc.get("perTick", {}))
        self.steps: list[dict[str, Any]] = list(doc.get("steps", []))
        self.tick = -1
        self.lost: set[int] = set()
        self.nvml_error = ""  # while set, device_count fails: the library stopped answering
        self.calls: list[str] = []  # what was called, in order (tests check the shutdown sequence); the latest only
        self._cond = threading.Condition()
        self._pending: list[XidNotice] = []
        self._registered: set[int] | None = None

    def _record(self, what: str) -> None:
        with self._cond:
            self._append(what)

    def _append(self, what: str) -> None:
        """Under ``_cond``. An agent on the fake waits for XIDs every second for as long as it runs: the log keeps
        the latest ``CALLS_KEPT`` calls, not all of them."""
        self.calls.append(what)
        if len(self.calls) > 2 * CALLS_KEPT:
            del self.calls[:-CALLS_KEPT]

    # ---- lifecycle ----------------------------------------------------------------------------------------------
    def open(self) -> list[GpuIdentity]:
        self._record("open")
        if self._init_error:
            raise NvmlUnavailable(f"nvmlInit: {self._init_error}")
        return list(self.identities)

    def driver_version(self) -> str:
        return str(self.doc.get("driverVersion", ""))

    def close(self) -> None:
        self._record("close")

    # ---- replay -------------------------------------------------------------------------------------------------
    def device_count(self) -> int:
        with self._cond:
            self.tick += 1
            if self.tick < len(self.steps):
                self._apply(self.steps[self.tick], f"{self.source}: steps[{self.tick}]")
            if self.nvml_error:
                raise NvmlFailure(f"nvmlDeviceGetCount: {self.nvml_error}")
        return len(self.identities)

    def _apply(self, step: dict[str, Any], where: str) -> None:
        for key, raw in step.get("readings", {}).items():
            self.current[int(key)].update(_readings(f"{where}.readings.{key}", raw))
        self.lost |= {int(i) for i in step.get("lost", [])}
        self.lost -= {int(i) for i in step.get("recovered", [])}
        if "nvmlError" in step:
            self.nvml_error = str(step["nvmlError"] or "")
        for x in step.get("xids", []):
            self._queue(XidNotice(int(x["gpu"]), int(x["xid"])))

    def _queue(self, notice: XidNotice) -> None:
        if notice.index is not None and not self.xid_capable[notice.index]:
            return
        self._pending.append(notice)
        self._cond.notify_all()

    def set_reading(self, index: int, key: str, value: float | None) -> None:
        """Change a reading now (tests; ``None`` = NOT_SUPPORTED)."""
        with self._cond:
            self.current[index].update(_readings(f"set_reading({index})", {key: value}))

    def set_lost(self, index: int, lost: bool) -> None:
        """A GPU falls off the bus or answers again, now (tests)."""
        with self._cond:
            if lost:
                self.lost.add(index)
            else:
                self.lost.discard(index)

    def fail(self, error: str) -> None:
        """The whole library stops answering with ``error``, or answers again with "" (tests)."""
        with self._cond:
            self.nvml_error = error

    def inject_xid(self, index: int, xid: int) -> None:
        """Raise an XID now (tests)."""
        with self._cond:
            self._queue(XidNotice(index, xid))

    def snapshot(self, index: int) -> GpuSnapshot:
        with self._cond:
            if index in self.lost:
                raise GpuLost(f"gpu{index}: GPU is lost")
            readings = {k: v for k, v in self.current[index].items() if v is not None}
            ticks = max(self.tick, 0)
        for key, inc in self.per_tick.items():
            if key in readings and inc is not None:
                readings[key] += inc * ticks
        return GpuSnapshot(self.identities[index], readings)

    # ---- XID events ---------------------------------------------------------------------------------------------
    def xid_open(self) -> list[str]:
        self._record("xid_open")
        problems = []
        registered = set()
        for ident, capable in zip(self.identities, self.xid_capable, strict=True):
            if not capable:
                problems.append(f"gpu{ident.index}: supports no XID events")
            elif ident.index in self.lost:
                problems.append(f"gpu{ident.index}: XID events not registered: GPU is lost")
            else:
                registered.add(ident.index)
        with self._cond:
            self._registered = registered
        return problems

    def xid_registered(self) -> int:
        return len(self._registered or ())

    def xid_wait(self, timeout_ms: int) -> list[XidNotice]:
        with self._cond:
            if self._registered is None:
                raise NvmlFailure("XID wait without an event set")
            self._append("xid_wait")
            self._cond.wait_for(lambda: bool(self._pending), timeout_ms / 1000)
            out, self._pending = self._pending, []
            self._append("xid_wait_returned")
            return out

    def xid_close(self) -> None:
        with self._cond:
            self._append("xid_close")
            self._registered = None
