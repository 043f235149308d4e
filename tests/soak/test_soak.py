"""The soak (``bench/soak``, ``make soak``) shortened to 60 seconds of chaos: the slowest test of the suite (about
two minutes in all). Faults come and go on a fixture host, the webhook receiver and the platform-connector flap,
websocket clients connect, stall and leave, the config is reloaded by SIGHUP and the agent is SIGKILLed and restarted
half-way; the verdict must pass every check (see the module docstring of ``bench/soak`` for what each one means)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.soak import run_soak


@pytest.mark.e2e
def test_soak_60_seconds(tmp_path: Path) -> None:
    verdict = run_soak(60, tmp_path)
    print(verdict.render())
    failed = [f"{c.name}: {c.figures}" for c in verdict.checks if not c.ok]
    assert verdict.passed, "soak failed:\n" + "\n".join(failed) + f"\n(agent logs in {tmp_path})"
