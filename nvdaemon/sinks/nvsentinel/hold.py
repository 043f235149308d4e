"""When NVSentinel's reconciler sends a difference again after a failed pass, so that a platform-connector that keeps
failing is not sent the same event on every tick (and the sink ticks on every bus event, not only every
``intervalSeconds``).

- A rejection (an answer ``classify`` does not retry, or an unusable token file) holds that one difference: the
  first is tried again at the next tick, as a token being rotated may need; from the second in a row on, after
  ``delay(n - 1)`` seconds for the n-th. Other differences are still sent: a rejection is about its event.
- Retries spent (``maxAttempts`` retryable failures of one call) hold every send: the n-th such pass in a row waits
  ``delay(maxAttempts + n - 1)``, the backoff of the attempts carried on across ticks.
- Any acknowledgement ends the hold of what it acknowledged, and the platform-connector's answering at all (OK or a
  rejection) ends the hold of every send. A skipped send (no socket) holds nothing: it is a stat, not a send.

``delay`` is the reconciler's own (``retryInitialSeconds`` x ``retryMultiplier``, +-``retryJitter``), capped at
``MAX_HOLD_SECONDS``. Times are ``trio.current_time()``; a hold is never persisted (a restart sends at once).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from nvdaemon.sinks.nvsentinel.map import Change, Key

MAX_HOLD_SECONDS = 60.0

HoldKey = tuple[str, Key]  # (kind, key): a clear of a held raise is a new difference, not held


class Holds:
    """The holds of one reconciler; touched only from the trio thread."""

    def __init__(self, delay: Callable[[int], float], max_attempts: int) -> None:
        self.delay = delay  # seconds to wait after the n-th failure in a row
        self.max_attempts = max_attempts
        self.rejected: dict[HoldKey, tuple[int, float]] = {}  # rejections in a row, held until
        self.down: tuple[int, float] = (0, 0.0)  # passes in a row whose retries were spent, every send held until

    @staticmethod
    def _key(change: Change) -> HoldKey:
        return (change.kind, change.key)

    def _wait(self, failures: int) -> float:
        return min(MAX_HOLD_SECONDS, self.delay(failures))

    def all_held(self, now: float) -> bool:
        return now < self.down[1]

    def held(self, change: Change, now: float) -> bool:
        entry = self.rejected.get(self._key(change))
        return entry is not None and now < entry[1]

    def outcome(self, change: Change, result: str, now: float) -> None:
        """What ``Reconciler.deliver`` returned for ``change``: ``ok``, ``rejected``, ``unavailable`` or
        ``skipped``."""
        key = self._key(change)
        if result == "ok":
            self.rejected.pop(key, None)
            self.down = (0, 0.0)
        elif result == "rejected":
            failures = self.rejected.get(key, (0, 0.0))[0] + 1
            self.rejected[key] = (failures, now + (self._wait(failures - 1) if failures > 1 else 0.0))
            self.down = (0, 0.0)
        elif result == "unavailable":
            passes = self.down[0] + 1
            self.down = (passes, now + self._wait(self.max_attempts + passes - 1))

    def keep_only(self, changes: Iterable[Change]) -> None:
        """Forget the holds of differences no longer planned (acknowledged otherwise, or gone)."""
        planned = {self._key(c) for c in changes}
        for key in [k for k in self.rejected if k not in planned]:
            del self.rejected[key]
