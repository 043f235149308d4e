"""The webhook sink: each ``sinks.webhook[]`` endpoint gets every event, signed, as a CloudEvent, at least once.

What it promises:

- durable: an event is committed to the endpoint's spool (``stateDir/spool.db``, ``synchronous=FULL``) before the
  engine's state is saved past it, so neither SIGTERM nor ``kill -9`` loses a committed event; a crash can only cause
  a duplicate, sent again under the same ``webhook-id``;
- ordered: one request in flight per endpoint, oldest pending event first, so a later event never overtakes an
  earlier one; each endpoint has its own copy and cursor, so a dead receiver never holds back a healthy one;
- retried: transient failures with capped, jittered backoff until ``maxAgeHours``, other refusals ``maxAttempts``
  times, then a dead letter kept in the spool (``nvdaemon spool list|retry``); a 410 disables the endpoint;
- counted: nothing accepted is lost without a count by reason (``nodevitals_webhook_dropped_total{sink,reason}``:
  spool overflow, a full or read-only stateDir past its memory bound, a damaged spool, events only in memory at
  stop) and a log line with the event ids.

Modules: ``endpoint`` (the sink, its ingest and sender tasks, ``build``), ``http`` (one exchange), ``signing``
(Standard Webhooks HMAC), ``url`` (names and loopback), ``metrics``, ``config`` (the checks ``check-config`` runs),
``cli`` (``nvdaemon spool``/``webhook test``), and the spool: ``spool`` (sqlite rows), ``spool_schema``,
``spool_io`` (for trio, quarantine) and ``spool_writer`` (ingest and its memory buffer). Nothing is imported here:
the config checks load ``config`` without httpx or sqlite.
"""
