"""Generated NVSentinel stubs (``make proto`` from ``protos/health_event.proto``); committed, never edited by hand."""
