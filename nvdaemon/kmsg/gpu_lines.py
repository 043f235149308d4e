"""The NVIDIA driver's kernel log lines: XIDs, NVSwitch SXIDs, a GPU fallen off the bus, and recovery signals.
Pure: a message in, a ``GpuLine`` (or None) out.

Formats (the driver's own text, as NVSentinel's syslog-health-monitor and GPUd parse it):

- XID: ``NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.``; the PCI address may
  carry a function (``0000:b3:00.0``) and the rest may be absent (``NVRM: Xid (PCI:0000:3f:00): 46``).
- NVLink5 XIDs 144-150 name a unit, a severity and a link after the code:
  ``NVRM: Xid (PCI:0018:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 09 (0x025525c6 0x00000000 ...)``; the
  subcode is ``NETIR_LINK_EVT``, kept with the link and the first two registers (intrInfo, errorStatus).
- XID 154 (recovery action): ``... 154, GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)``.
  A change *to* None is the driver saying the GPU needs nothing any more: a recovery signal, not a fault.
- SXID: ``nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 24007, Fatal, Link 30 sourcetrack timeout error``.
- Fallen off the bus, one line: ``NVRM: GPU 0000:18:00.0: GPU has fallen off the bus.``; or three records:
  ``NVRM: The NVIDIA GPU 0000:b3:00.0`` / ``NVRM: (PCI ID: 10de:26b5) installed in this system has`` /
  ``NVRM: fallen off the bus and is not responding to commands.`` (``FallenOffLines`` joins them).
- GPU (re)initialised: ``NVRM: GPU at PCI:0000:3b:00: GPU-6e5a...``: the driver prints it when it brings a GPU up,
  at load and after a reset, so XIDs raised before it on that GPU are over (a recovery signal). NVSentinel's reset
  job's marker ``GPU reset executed: GPU-<uuid>[, success: true]`` counts too when it reaches the kernel log.

``PREFILTER`` is what a message must contain for any of these to match: one ``in`` test before any regular expression.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

Kind = Literal["xid", "sxid", "fallen_off", "recovered"]
PREFILTER = (b"NVRM: ", b"SXid", b"GPU reset executed")

_PCI = r"[0-9a-fA-F]{1,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?"
_XID = re.compile(rf"NVRM: Xid \((?:PCI:)?(?P<pci>{_PCI})\): (?P<xid>\d+)(?P<rest>.*)")
_NVL5 = re.compile(
    r"^,(?: pid=[^,]*,)?(?: name=[^,]*,)? (?P<unit>[A-Z0-9_]+(?:/[A-Z0-9_]+)?)\s+(?P<sev>Nonfatal|Fatal)\s+"
    r"(?P<xc>XC[01])\s+(?P<i>i\d+)\s+Link\s+(?P<link>-?\d+)\s+\((?P<intr>0x[0-9a-fA-F]+)\s+(?P<status>0x[0-9a-fA-F]+)"
)
_XID154_TO = re.compile(r"to 0x[0-9a-fA-F]+ \((?P<action>[^()]*)\)\s*$")
_SXID = re.compile(
    rf"nvidia-nvswitch(?P<switch>\d+): SXid \(PCI:(?P<pci>{_PCI})\): (?P<sxid>\d+),\s*(?P<sev>Fatal|Non-fatal)?"
    r",?\s*(?:Link (?P<link>-?\d+))?\s*(?P<rest>.*)"
)
_FALLEN_ONE = re.compile(rf"NVRM:\s+GPU (?P<pci>{_PCI}):\s+GPU has fallen off the bus")
# The driver prints the three lines with one call: one record whose message holds the newlines (escaped as \x0a).
_FALLEN_ONE_RECORD = re.compile(rf"NVRM:\s+The NVIDIA GPU (?P<pci>{_PCI})\b.*?fallen off the bus", re.S)
_FALLEN_HEAD = re.compile(rf"NVRM:\s+The NVIDIA GPU (?P<pci>{_PCI})\s*$")
_FALLEN_TAIL = "fallen off the bus and is not responding to commands"
_GPU_UP = re.compile(rf"NVRM: GPU at PCI:(?P<pci>{_PCI}): (?P<uuid>GPU-[0-9a-fA-F-]+)")
_RESET_DONE = re.compile(r"GPU reset executed: (?P<uuid>GPU-[0-9a-fA-F-]+)(?:, success: (?P<ok>true|false))?")


@dataclass(frozen=True)
class GpuLine:
    """One parsed line: what happened, to which GPU or switch, with the code and what else the line says."""

    kind: Kind
    pci: str = ""
    uuid: str = ""
    code: int = 0  # the XID or SXID
    switch: int = -1  # nvidia-nvswitch<N>
    fatal: bool = False  # SXID: the line says Fatal
    signal: str = ""  # recovered: gpu_initialised, reset_executed, xid154
    detail: dict[str, str] = field(default_factory=dict)


def parse_gpu_line(text: str) -> GpuLine | None:
    """The line as a GPU fault or recovery signal, or None when it is neither (or is malformed: a code that is not
    a number, no PCI address)."""
    m = _XID.search(text)
    if m is not None:
        xid, rest = int(m.group("xid")), m.group("rest")
        if xid == 154:
            to = _XID154_TO.search(rest)
            if to is not None and to.group("action").strip() == "None":
                return GpuLine("recovered", pci=m.group("pci"), code=154, signal="xid154")
        detail: dict[str, str] = {}
        nvl = _NVL5.match(rest) if 144 <= xid <= 150 else None
        if nvl is not None:
            detail = {
                "subcode": nvl.group("unit"),
                "link": nvl.group("link"),
                "severity": nvl.group("sev"),
                "intrinfo": nvl.group("intr"),
                "error_status": nvl.group("status"),
            }
        return GpuLine("xid", pci=m.group("pci"), code=xid, detail=detail)
    m = _SXID.search(text)
    if m is not None:
        detail = {"message": m.group("rest").strip()}
        if m.group("link") is not None:
            detail["link"] = m.group("link")
        return GpuLine(
            "sxid",
            pci=m.group("pci"),
            code=int(m.group("sxid")),
            switch=int(m.group("switch")),
            fatal=m.group("sev") == "Fatal",
            detail=detail,
        )
    m = _FALLEN_ONE.search(text) or _FALLEN_ONE_RECORD.search(text)
    if m is not None:
        return GpuLine("fallen_off", pci=m.group("pci"))
    m = _GPU_UP.search(text)
    if m is not None:
        return GpuLine("recovered", pci=m.group("pci"), uuid=m.group("uuid"), signal="gpu_initialised")
    m = _RESET_DONE.search(text)
    if m is not None and m.group("ok") != "false":
        return GpuLine("recovered", uuid=m.group("uuid"), signal="reset_executed")
    return None


class FallenOffLines:
    """The three-record form of "fallen off the bus": the GPU named by the first, the fault by the third."""

    def __init__(self) -> None:
        self.pci = ""

    def feed(self, text: str) -> GpuLine | None:
        head = _FALLEN_HEAD.search(text)
        if head is not None:
            self.pci = head.group("pci")
            return None
        if _FALLEN_TAIL in text and self.pci:
            pci, self.pci = self.pci, ""
            return GpuLine("fallen_off", pci=pci)
        return None
