"""The XID catalogue the NVSentinel sink acts on: per XID, the recommended action and where that action comes from.

Pure data, no imports from the rest of the sink (``nvsentinel_map`` and ``nvdaemon/gpu/events.py`` read it).

Sources (every entry names one; ``XID_SOURCES`` says what each means):

- ``nvidia-xid-catalogue``: NVIDIA's XID catalogue for Ampere and newer GPUs
  (https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, column "Resolution Bucket (Immediate
  Action)"), read from the copy NVSentinel ships (NVIDIA/NVSentinel
  ``distros/kubernetes/nvsentinel/charts/gpu-health-monitor/xiderrorsmapping.csv``: code, mnemonic, bucket, fatality),
  with the bucket turned into a RecommendedAction the way NVSentinel's syslog monitor does it
  (``health-monitors/syslog-health-monitor/pkg/common/common.go`` ``MapActionStringToProto``): a bucket that is an
  action name is that action; RESTART_APP and IGNORE are NONE; RESET_GPU, WORKFLOW_XID_48 and RESET_FABRIC are
  COMPONENT_RESET; any other bucket (UNEXPECTED_ERR_REPORT_ISSUE, WORKFLOW_NVLINK_ERR, ...) is CONTACT_SUPPORT.
- ``nvidia-xid-catalogue-nonfatal``: the catalogue marks the code non-fatal and its bucket is a workflow that defers
  to the XID it accompanies (which we report on its own), so no action of its own: NONE. NVSentinel's syslog monitor
  (at the revision read) has no case for that bucket and sends CONTACT_SUPPORT; ``xidActions`` restores that.

A code that is not in the table gets ``UNKNOWN_XID_ACTION`` (CONTACT_SUPPORT: fatal, so a human looks, never an
automatic reboot), which is also what NVSentinel's syslog monitor does for a code its catalogue does not list
(``pkg/xid/parser/csv.go``). An entry whose action cannot be sourced must use ``UNSOURCED`` and CONTACT_SUPPORT;
none does today (61, 74 and 140, once "not yet checked", are in the catalogue copy above).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

UNSOURCED = "unsourced"
XID_SOURCES: dict[str, str] = {
    "nvidia-xid-catalogue": "NVIDIA XID catalogue resolution bucket, mapped as NVSentinel's syslog monitor maps it",
    "nvidia-xid-catalogue-nonfatal": "NVIDIA XID catalogue: non-fatal, the action follows the accompanying XID",
    UNSOURCED: "no source found: CONTACT_SUPPORT until one is",
}
UNKNOWN_XID_ACTION = "CONTACT_SUPPORT"
# Every RecommendedAction name (health_event.proto; nvsentinel_map.RECOMMENDED_ACTIONS has their numbers): a bucket
# spelled as one is that action.
ACTION_NAMES = frozenset(
    {"NONE", "COMPONENT_RESET", "CONTACT_SUPPORT", "RUN_FIELDDIAG", "RESTART_VM", "RESTART_BM", "REPLACE_VM"}
    | {"RUN_DCGMEUD", "CUSTOM", "UNKNOWN"}
)


class XidEntry(NamedTuple):
    action: str  # the RecommendedAction name sent to NVSentinel
    bucket: str  # the catalogue's resolution bucket (immediate action) for the code
    source: str  # a key of XID_SOURCES
    description: str


_CAT = "nvidia-xid-catalogue"
XID_CATALOGUE: dict[int, XidEntry] = {
    13: XidEntry("NONE", "RESTART_APP", _CAT, "graphics engine exception"),
    31: XidEntry("NONE", "RESTART_APP", _CAT, "GPU memory page fault"),
    43: XidEntry("NONE", "IGNORE", _CAT, "GPU stopped processing"),
    45: XidEntry(
        "NONE", "WORKFLOW_XID_45", "nvidia-xid-catalogue-nonfatal", "preemptive cleanup, due to previous errors"
    ),
    48: XidEntry("COMPONENT_RESET", "WORKFLOW_XID_48", _CAT, "double bit ECC error"),
    61: XidEntry(
        "CONTACT_SUPPORT", "UNEXPECTED_ERR_REPORT_ISSUE", _CAT, "internal micro-controller breakpoint/warning"
    ),
    62: XidEntry("COMPONENT_RESET", "RESET_GPU", _CAT, "internal micro-controller halt"),
    63: XidEntry("NONE", "IGNORE", _CAT, "ECC page retirement or row remapping recording event"),
    64: XidEntry("COMPONENT_RESET", "RESET_GPU", _CAT, "ECC page retirement or row remapper recording failure"),
    74: XidEntry("CONTACT_SUPPORT", "WORKFLOW_NVLINK_ERR", _CAT, "NVLink error"),
    79: XidEntry("RESTART_BM", "RESTART_BM", _CAT, "GPU has fallen off the bus"),
    92: XidEntry("NONE", "IGNORE", _CAT, "high single-bit ECC error rate"),
    94: XidEntry("NONE", "RESTART_APP", _CAT, "contained ECC error"),
    95: XidEntry("COMPONENT_RESET", "RESET_GPU", _CAT, "uncontained ECC error"),
    119: XidEntry("COMPONENT_RESET", "RESET_GPU", _CAT, "GSP RPC timeout"),
    120: XidEntry("COMPONENT_RESET", "RESET_GPU", _CAT, "GSP error"),
    140: XidEntry("COMPONENT_RESET", "RESET_GPU", _CAT, "unrecovered ECC error"),
}
XID_ACTIONS: dict[int, str] = {xid: e.action for xid, e in XID_CATALOGUE.items()}
XID_DESCRIPTIONS: dict[int, str] = {xid: e.description for xid, e in XID_CATALOGUE.items()}


def bucket_action(bucket: str) -> str:
    """A catalogue resolution bucket as a RecommendedAction, NVSentinel's syslog monitor's rule (see above)."""
    bucket = bucket.strip()
    if bucket in ACTION_NAMES:
        return bucket
    if bucket in ("RESTART_APP", "IGNORE"):
        return "NONE"
    if bucket in ("RESET_GPU", "WORKFLOW_XID_48", "RESET_FABRIC"):
        return "COMPONENT_RESET"
    return "CONTACT_SUPPORT"


def xid_action(xid: int, overrides: Mapping[str, str] | None = None) -> str:
    """``sinks.nvsentinel.xidActions`` first, then the catalogue, else ``UNKNOWN_XID_ACTION``."""
    if overrides and str(xid) in overrides:
        return overrides[str(xid)]
    entry = XID_CATALOGUE.get(xid)
    return entry.action if entry else UNKNOWN_XID_ACTION
