"""The one XID catalogue (gpu/xid_catalogue.py): both readers agree with it, its disagreements are written down, and
the GPU source needs no sink to read it."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys

from nvdaemon.gpu import xid_catalogue
from nvdaemon.gpu.events import xid_description, xid_event, xid_severity
from nvdaemon.gpu.xid_catalogue import GO_XID_SEVERITY, UNKNOWN_XID_ACTION, XID_CATALOGUE
from nvdaemon.nvml import GpuIdentity, XidNotice
from nvdaemon.sinks.nvsentinel.map import XidRecord, xid_health

RANK = {"info": 0, "warning": 1, "critical": 2}


def test_event_and_health_event_read_the_same_row() -> None:
    ident = GpuIdentity(index=0, uuid="GPU-0", pci_bus_id="00000000:3B:00.0")
    for code in [*XID_CATALOGUE, 4242]:
        entry = XID_CATALOGUE.get(code)
        event = xid_event(XidNotice(0, code), ident, node="n", seq=1, now=1.0)
        health = xid_health(XidRecord(xid=code, device="gpu0", pci="0000:3b:00.0"))
        action = entry.action if entry else UNKNOWN_XID_ACTION
        assert event.severity == xid_severity(code) == (entry.severity if entry else "warning")
        assert event.detail["description"] == xid_description(code)
        assert health.message.endswith(": " + xid_description(code))
        assert (health.recommended_action, health.is_fatal) == (action, action != "NONE")
        if entry:
            assert entry.fatal is health.is_fatal


def test_every_go_code_is_a_row_and_never_below_gos_severity() -> None:
    assert set(GO_XID_SEVERITY) <= set(XID_CATALOGUE)
    for code, entry in XID_CATALOGUE.items():
        assert RANK[entry.severity] >= RANK[GO_XID_SEVERITY.get(code, "warning")], code


def test_rows_where_severity_and_fatality_disagree_say_so_in_a_comment() -> None:
    """Agreement: critical with an action, or info with none. Every other row carries a comment line above it."""
    disagree = {
        c for c, e in XID_CATALOGUE.items() if (e.severity, e.fatal) not in {("critical", True), ("info", False)}
    }
    assert disagree == {45, 61, 63, 74, 92, 94}
    lines = inspect.getsource(xid_catalogue).splitlines()
    commented: set[int] = set()
    for i, line in enumerate(lines):
        row = re.match(r"\s+(\d+): XidEntry\(", line)
        if row and lines[i - 1].strip().startswith("#"):
            commented.add(int(row.group(1)))
    assert commented == disagree | {62, 140}  # 62 and 140 also say why they are above Go's "unknown"


def test_the_gpu_package_imports_no_sink() -> None:
    code = "import sys, nvdaemon.gpu, nvdaemon.gpu.events; print(' '.join(m for m in sys.modules if 'sinks' in m))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == []
