"""Long-term history: allowlisted samples averaged per window into ``stateDir/history.db``, served by
``GET /v1/history/{metric}``.

- ``core``: the pure part (no I/O, no trio): window accumulation, value encoding, query parameters, re-downsampling.
- ``store``: the sqlite file (synchronous; used from worker threads).
- ``service``: the supervised task (a ``Sink`` named ``history`` that reads snapshots, not bus events).
"""
