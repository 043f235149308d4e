"""The one XID catalogue: per code its description, its event severity, NVIDIA's recommended action and fatality.

Pure data and lookups, no imports. Two readers, two audiences:

- the GPU source (``gpu/events.py``) puts ``description`` and ``severity`` on the XID event every webhook, stream
  and history receiver sees;
- the NVSentinel sink (``sinks/nvsentinel/map.py``) sends ``action`` as the HealthEvent's recommendedAction and
  ``fatal`` as isFatal (``sinks.nvsentinel.xidActions`` overrides the action, and fatality follows it).

Severity is the Go agent's table (nodevitals-contract.md §3, ``GO_XID_SEVERITY``): info for 13, 31, 43; warning
for 63, 74, 92, 94 and every code it does not list; critical for 48, 64, 79, 95, 119, 120. Of the codes Go leaves
to "unknown", 62 (micro-controller halt) and 140 (unrecovered ECC) are critical, since the GPU needs a reset; 45
and 61 stay warning. The rule for such codes: raise above Go's answer, never lower it, so a receiver that alerted
on a severity under the Go agent still alerts.

Action and fatality follow NVIDIA, not the Go table, so the two columns disagree on purpose where the Go agent's
severity predates the catalogue; each such row says so. The action sources (every entry names one; ``XID_SOURCES``
says what each means):

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

Fatal means "the action is not NONE", as NVSentinel's own monitors send it. A code that is not in the table gets
``UNKNOWN_XID_SEVERITY`` (warning, the Go agent's) and ``UNKNOWN_XID_ACTION`` (CONTACT_SUPPORT: fatal, so a human
looks, never an automatic reboot), which is also what NVSentinel's syslog monitor does for a code its catalogue
does not list (``pkg/xid/parser/csv.go``). An entry whose action cannot be sourced must use ``UNSOURCED`` and
CONTACT_SUPPORT; none does today (61, 74 and 140, once "not yet checked", are in the catalogue copy above).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, NamedTuple

Severity = Literal["info", "warning", "critical"]

UNSOURCED = "unsourced"
XID_SOURCES: dict[str, str] = {
    "nvidia-xid-catalogue": "NVIDIA XID catalogue resolution bucket, mapped as NVSentinel's syslog monitor maps it",
    "nvidia-xid-catalogue-nonfatal": "NVIDIA XID catalogue: non-fatal, the action follows the accompanying XID",
    UNSOURCED: "no source found: CONTACT_SUPPORT until one is",
}
UNKNOWN_XID_DESCRIPTION = "unknown XID"
UNKNOWN_XID_SEVERITY: Severity = "warning"
UNKNOWN_XID_ACTION = "CONTACT_SUPPORT"
NO_ACTION = "NONE"
# Every RecommendedAction name (health_event.proto; sinks/nvsentinel/map.py's RECOMMENDED_ACTIONS has their numbers):
# a bucket spelled as one is that action.
ACTION_NAMES = frozenset(
    {"NONE", "COMPONENT_RESET", "CONTACT_SUPPORT", "RUN_FIELDDIAG", "RESTART_VM", "RESTART_BM", "REPLACE_VM"}
    | {"RUN_DCGMEUD", "CUSTOM", "UNKNOWN"}
)

# The Go agent's severity table, as the contract gives it (§3); codes it does not list are UNKNOWN_XID_SEVERITY.
GO_XID_SEVERITY: dict[int, Severity] = {
    **dict.fromkeys((13, 31, 43), "info"),
    **dict.fromkeys((63, 74, 92, 94), "warning"),
    **dict.fromkeys((48, 64, 79, 95, 119, 120), "critical"),
}


class XidEntry(NamedTuple):
    description: str  # on the event (detail.description) and in the HealthEvent's message
    severity: Severity  # the event's severity (webhook, stream, history, rules on events)
    action: str  # the RecommendedAction name sent to NVSentinel
    bucket: str  # the catalogue's resolution bucket (immediate action) for the code
    source: str  # where the action comes from: a key of XID_SOURCES

    @property
    def fatal(self) -> bool:
        """NVSentinel's isFatal for the catalogue's action (an ``xidActions`` override moves it: ``is_fatal``)."""
        return is_fatal(self.action)


_CAT = "nvidia-xid-catalogue"
_NONFATAL = "nvidia-xid-catalogue-nonfatal"
# Rows where severity and action disagree say why; every other row is critical with a reset or info with NONE.
XID_CATALOGUE: dict[int, XidEntry] = {
    13: XidEntry("graphics engine exception", "info", "NONE", "RESTART_APP", _CAT),
    31: XidEntry("GPU memory page fault", "info", "NONE", "RESTART_APP", _CAT),
    43: XidEntry("GPU stopped processing", "info", "NONE", "IGNORE", _CAT),
    # warning (not in Go's table) but no action: it follows the XID it accompanies, reported on its own
    45: XidEntry("preemptive cleanup, due to previous errors", "warning", "NONE", "WORKFLOW_XID_45", _NONFATAL),
    48: XidEntry("double bit ECC error", "critical", "COMPONENT_RESET", "WORKFLOW_XID_48", _CAT),
    # fatal (CONTACT_SUPPORT) but only warning: Go does not list it and we do not raise it without a reset to ask for
    61: XidEntry(
        "internal micro-controller breakpoint/warning",
        "warning",
        "CONTACT_SUPPORT",
        "UNEXPECTED_ERR_REPORT_ISSUE",
        _CAT,
    ),
    # critical above Go's "unknown" (warning): the GPU needs a reset
    62: XidEntry("internal micro-controller halt", "critical", "COMPONENT_RESET", "RESET_GPU", _CAT),
    # warning (Go) but no action: NVIDIA says the recording event needs none
    63: XidEntry("ECC page retirement or row remapping recording event", "warning", "NONE", "IGNORE", _CAT),
    64: XidEntry(
        "ECC page retirement or row remapper recording failure", "critical", "COMPONENT_RESET", "RESET_GPU", _CAT
    ),
    # fatal (CONTACT_SUPPORT) but warning (Go): kept at Go's severity, never lowered nor silently raised
    74: XidEntry("NVLink error", "warning", "CONTACT_SUPPORT", "WORKFLOW_NVLINK_ERR", _CAT),
    79: XidEntry("GPU has fallen off the bus", "critical", "RESTART_BM", "RESTART_BM", _CAT),
    # warning (Go) but no action: NVIDIA ignores a high single-bit rate on its own
    92: XidEntry("high single-bit ECC error rate", "warning", "NONE", "IGNORE", _CAT),
    # warning (Go) but no action: a contained error ends the application, not the GPU
    94: XidEntry("contained ECC error", "warning", "NONE", "RESTART_APP", _CAT),
    95: XidEntry("uncontained ECC error", "critical", "COMPONENT_RESET", "RESET_GPU", _CAT),
    119: XidEntry("GSP RPC timeout", "critical", "COMPONENT_RESET", "RESET_GPU", _CAT),
    120: XidEntry("GSP error", "critical", "COMPONENT_RESET", "RESET_GPU", _CAT),
    # critical above Go's "unknown" (warning): the GPU needs a reset
    140: XidEntry("unrecovered ECC error", "critical", "COMPONENT_RESET", "RESET_GPU", _CAT),
}
XID_ACTIONS: dict[int, str] = {xid: e.action for xid, e in XID_CATALOGUE.items()}
XID_DESCRIPTIONS: dict[int, str] = {xid: e.description for xid, e in XID_CATALOGUE.items()}
XID_SEVERITY: dict[int, Severity] = {xid: e.severity for xid, e in XID_CATALOGUE.items()}


def xid_description(xid: int) -> str:
    entry = XID_CATALOGUE.get(xid)
    return entry.description if entry else UNKNOWN_XID_DESCRIPTION


def xid_severity(xid: int) -> Severity:
    """The event severity: the catalogue's (which holds every code of Go's table), else warning."""
    entry = XID_CATALOGUE.get(xid)
    return entry.severity if entry else UNKNOWN_XID_SEVERITY


def xid_action(xid: int, overrides: Mapping[str, str] | None = None) -> str:
    """``sinks.nvsentinel.xidActions`` first, then the catalogue, else ``UNKNOWN_XID_ACTION``."""
    if overrides and str(xid) in overrides:
        return overrides[str(xid)]
    entry = XID_CATALOGUE.get(xid)
    return entry.action if entry else UNKNOWN_XID_ACTION


def is_fatal(action: str) -> bool:
    """isFatal for a recommended action: every action but NONE asks a human or a remediation to act."""
    return action != NO_ACTION


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
