"""The Pod Security Standards (Baseline, Restricted) as checks over a rendered pod spec.

A small, literal transcription of https://kubernetes.io/docs/concepts/security/pod-security-standards/ (the controls
a DaemonSet can trip; Windows-only and AppArmor/SELinux controls are not used by the chart and not checked): each
function returns the names of the controls the pod violates, so a test can state exactly which ones a tier needs.
"""

from __future__ import annotations

from typing import Any

BASELINE_CAPABILITIES = {
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
}
RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}


def _containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*spec.get("initContainers", []), *spec.get("containers", []), *spec.get("ephemeralContainers", [])]


def _effective(spec: dict[str, Any], container: dict[str, Any], key: str) -> Any:
    ctx = container.get("securityContext") or {}
    if key in ctx:
        return ctx[key]
    return (spec.get("securityContext") or {}).get(key)


def baseline_violations(spec: dict[str, Any]) -> set[str]:
    found: set[str] = set()
    if any(spec.get(k) for k in ("hostNetwork", "hostPID", "hostIPC")):
        found.add("hostNamespaces")
    if any(v.get("hostPath") is not None for v in spec.get("volumes", [])):
        found.add("hostPathVolumes")
    for c in _containers(spec):
        ctx = c.get("securityContext") or {}
        if ctx.get("privileged"):
            found.add("privileged")
        if set((ctx.get("capabilities") or {}).get("add", [])) - BASELINE_CAPABILITIES:
            found.add("capabilities")
        if any(p.get("hostPort") for p in c.get("ports", [])):
            found.add("hostPorts")
        if ctx.get("procMount", "Default") != "Default":
            found.add("procMount")
        if (_effective(spec, c, "seccompProfile") or {}).get("type") == "Unconfined":
            found.add("seccomp")
    if (spec.get("securityContext") or {}).get("sysctls"):
        found.add("sysctls")
    return found


def restricted_violations(spec: dict[str, Any]) -> set[str]:
    """Restricted = Baseline plus these controls."""
    found = baseline_violations(spec)
    for v in spec.get("volumes", []):
        if not set(v) - {"name"} <= RESTRICTED_VOLUMES:
            found.add("volumeTypes")
    for c in _containers(spec):
        ctx = c.get("securityContext") or {}
        if ctx.get("allowPrivilegeEscalation") is not False:
            found.add("privilegeEscalation")
        if _effective(spec, c, "runAsNonRoot") is not True:
            found.add("runAsNonRoot")
        if _effective(spec, c, "runAsUser") == 0:
            found.add("runAsUser")
        if (_effective(spec, c, "seccompProfile") or {}).get("type") not in ("RuntimeDefault", "Localhost"):
            found.add("seccompProfile")
        caps = ctx.get("capabilities") or {}
        if "ALL" not in caps.get("drop", []) or set(caps.get("add", [])) - {"NET_BIND_SERVICE"}:
            found.add("capabilitiesRestricted")
    return found
