"""The kernel log (``/dev/kmsg``) as a source of events: GPU XIDs, NVSwitch SXIDs, GPUs fallen off the bus, and
host kernel faults matched by ``kernelRules``. ``service.py`` is what the agent calls; ``source.py`` the task."""
