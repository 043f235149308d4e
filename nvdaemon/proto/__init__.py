"""Generated stubs (``make proto``): NVSentinel from ``protos/health_event.proto``, the kubelet's pod-resources API
from ``protos/podresources.proto``; committed, never edited by hand."""
