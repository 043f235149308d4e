"""``make soak``: the agent under sustained chaos for ``SOAK_SECONDS`` (default 600), then a verdict.

The real agent (``nvdaemon run``, a subprocess) runs on a copy of ``fixtures/hosts/faulty`` (plus 64 cloned PCI
devices, so a burst of correctable AER errors makes 64 ENTERs and 64 EXITs at once) with ``intervalSeconds: 1`` and
its ``stateDir`` in the soak's work directory. While it runs:

- **faults**: every 1.5-3 s the host's files change: load high/low, the CPU package hot/cool (critical), memory
  pressure up/down, a fatal AER error on one device (critical; a rate rule, so ENTER then EXIT), a correctable burst;
- **webhook receiver** (``bench/soak/receiver.py``) flaps: ok, 500s, hangs longer than ``timeoutSeconds``, down;
- **platform-connector** (``tests/nvsentinel/connector.py``, real gRPC on a Unix socket) restarts, and rotates its
  token: it accepts the new one 1-3 s before the agent's token file has it;
- **websocket clients** (``bench/soak/clients.py``): one reader that stays, one that disconnects and resumes with
  ``since=`` every few seconds, one that reads slowly through tiny socket buffers (the agent's sends to it block),
  and a client that never reads (it must be cut with 1013, nobody waiting for it);
- **SIGHUP** every 5-10 s with a harmless config change (the load threshold 16 <-> 17, which the toggled load
  crosses either way; a rule that never fires added or removed);
- **SIGKILL** half-way, then a restart on the same stateDir;
- **a reload storm** (``bench/soak/storm.py``) at 80% of the run: 200 SIGHUPs in 10 s alternating two configs that
  differ only in the webhook endpoint's ``timeoutSeconds``, so every reload applied replaces the endpoint, with a
  correctable burst at its start and half-way;
- **a full stateDir** (``bench/soak/disk.py``; root only, else skipped and said so in the verdict): the stateDir is
  a 128 MiB tmpfs of its own; at 60% of the run a ballast file fills it to the last byte for a tenth of the run (at
  least 8 s), then is deleted.

Then the chaos stops (receiver ok, connector up with the agent's token, files frozen with the CPU still hot), the
agent drains, and the soak checks (figures for each; any FAIL makes the verdict fail):

1. every event the engine emitted and made durable was acked by the receiver (by id); duplicates are counted and
   allowed only across the kill (or right after the receiver cut the connection the ack went out on);
2. the receiver's view (the last phase per condition and device) equals the engine's active conditions;
3. the platform-connector's node conditions equal the engine's active critical conditions;
4. the never-reading client was cut as slow and got the 1013 close frame once it read, the agent dropped every
   such connection, and the readers saw every event of a run in order, with no gap or duplicate, across their
   ``since=`` resumes too;
5. every SIGHUP was applied (``reloads.ok``), none rejected;
6. no task is stuck restarting: all running at the end, no restart while the agent settled, ``/healthz`` 200;
7. RSS and open fds did not grow after the warm-up (per agent process: the SIGKILL restart starts a new baseline);
8. SIGTERM: exit 0 within ``shutdownGraceSeconds``; afterwards the spool holds no pending event and no dead letter;
9. emitted = delivered + counted drops, exactly: every emitted event was acked, or dropped and logged by id (the
   webhook logs each drop with its ids), or lost with the kill; the last run's drop counters equal its logged drops;
10. the full stateDir showed (the endpoint ``degraded`` with ``stateWritable`` false, ``nodevitals_sink_state_writable``
    0) and was recovered from (writable again, nothing left ``unspooled``);
11. the reload storm: every SIGHUP sent and answered (reloads applied, none rejected; check 5 counts them too),
    ``/healthz`` 200 each time it was asked during the storm, ``nodevitals_delivery_dropped_total`` never went down;
    checks 1 and 9 cover its events (a duplicate is allowed where an ack's connection was closed by the agent right
    after it, a request cancelled by the replacement; check 7 measures the run from the storm's end).

Where "every event the engine emitted" comes from: the agent logs each event (logger ``nvdaemon.events``, JSON with
the event) in ``Agent.emit`` *before* publishing it to the bus, so the two runs' logs list every event emitted, by
id and seq. Not all of them must arrive: the agent saves its engine state (``engine.json``) only once the webhook
spool has committed every event up to that state's seq, so a SIGKILL can lose an event that was emitted but not yet
spooled; the engine then never saved the transition and detects it again after the restart (at-least-once, as
designed). The events that must arrive are therefore: every event of the final run (SIGTERM drains the bus into the
spool), every event of the killed run with a seq up to the seq of the ``engine.json`` found after the kill, and
every event found in the spool after the kill (read before the restart), less the events a run dropped and logged
by id (e.g. held in memory past its bound while the stateDir was full). Anything else from the killed run is
reported as "lost with the kill"; check 2 then shows the restart re-detected what mattered.

Modules: ``host`` (the fixture host and its faults), ``receiver`` and ``clients`` (the webhook receiver and the
websocket clients), ``runner`` (the agent process, the chaos, the drain), ``verdict`` (the records and the checks).
"""

from __future__ import annotations

from bench.soak.runner import run_soak
from bench.soak.verdict import Check, Verdict

__all__ = ["Check", "Verdict", "run_soak"]
