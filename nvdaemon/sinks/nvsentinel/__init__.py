"""The NVSentinel sink: the agent as an NVSentinel health monitor, publishing ``HealthEvent``s to the
platform-connector on the node's Unix socket (``sinks.nvsentinel``).

What it promises: it is a reconciler, not a queue. The platform-connector's view of this node converges on ours:
every difference between the *desired* health (active conditions, XIDs raised since boot, GPUs lost) and what the
platform-connector acknowledged (persisted in ``stateDir/nvsentinel.json``) is sent, and *reported* advances only
after the call returned OK. So no event is queued and none can pile up: a missing socket or a refused call leaves the
difference standing, sent again on a later tick with a fresh timestamp (retryable answers with backoff within a
pass, and backoff across ticks); what was acknowledged survives restarts, and XIDs clear only on a reboot. Every skip
and failed send is counted (``nvsentinel_health_events_publisher_*``, the differences still open in
``nodevitals_nvsentinel_pending``) and shown in ``/v1/status``.

Modules: ``sink`` (the supervised sink), ``reconciler`` (desired against reported), ``map`` (conditions to
HealthEvents), ``wire`` (the grpcio call, in a worker thread), ``socket`` (the socket gate and its streaks),
``hold`` (backoff across ticks), ``state`` (the state file), ``config`` (the checks ``check-config`` runs). Nothing
is imported here: loading a config must not load grpcio or protobuf.
"""
