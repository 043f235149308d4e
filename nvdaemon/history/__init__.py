"""Long-term history: allowlisted samples averaged per window into ``stateDir/history.db``, served by
``GET /v1/history/{metric}``.

- ``core``: the pure part (no I/O, no trio): window accumulation, value encoding, query parameters, re-downsampling.
- ``store``: the sqlite file (synchronous; used from worker threads).
- ``service``: the supervised task, a sink named ``history`` that the agent hands its snapshots to (a
  ``SnapshotConsumer``), not bus events. History depends on the core alone: the sinks' list builds it.
"""
