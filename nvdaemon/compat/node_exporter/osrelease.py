"""os: ``node_os_info`` and ``node_os_version`` from the host's os-release file (no unit; a version number).

node_exporter tries ``<rootfs>/etc/os-release``, then ``<rootfs>/usr/lib/os-release`` (then macOS's
SystemVersion.plist, which no Linux root has and is treated as absent here): a missing file moves on to the next,
none at all is ErrNoData, any other error fails the collector. The file is parsed with hashicorp/go-envparse's
rules (``KEY=value`` lines, ``#`` comments, single and double quotes, JSON-like escapes in double quotes, an
``export`` prefix); keys with an empty value count as unset. ``node_os_version`` is the leading ``major.minor``
of ``VERSION_ID``, exported only when above zero.

node_exporter caches the parse by (path, mtime) and records both before parsing, so a file that fails to parse
fails one scrape and is then served with empty labels until it changes; we keep the same state to match it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from nvdaemon.collectors.base import NotPresent, ParseError, read_bounded
from nvdaemon.compat.node_exporter.context import NodeContext
from nvdaemon.compat.node_exporter.family import Family

CANDIDATES = ("/etc/os-release", "/usr/lib/os-release")
OS_RELEASE_MAX = 64 * 1024  # a few hundred bytes in practice
INFO_HELP = (
    "A metric with a constant '1' value labeled by build_id, id, id_like, image_id, image_version, "
    "name, pretty_name, variant, variant_id, version, version_codename, version_id."
)
VERSION_HELP = "Metric containing the major.minor part of the OS version."
# label -> os-release key
LABELS = {
    "build_id": "BUILD_ID",
    "id": "ID",
    "id_like": "ID_LIKE",
    "image_id": "IMAGE_ID",
    "image_version": "IMAGE_VERSION",
    "name": "NAME",
    "pretty_name": "PRETTY_NAME",
    "variant": "VARIANT",
    "variant_id": "VARIANT_ID",
    "version": "VERSION",
    "version_codename": "VERSION_CODENAME",
    "version_id": "VERSION_ID",
}
_VERSION = re.compile(rb"^[0-9]+\.?[0-9]*")
_KEY = re.compile(rb"[A-Za-z_][A-Za-z0-9_./]*")
_HEX4 = re.compile(rb"[0-9a-fA-F]{4}")
_GO_SPACE = b" \t\n\v\f\r"
_ESCAPES = {ord('"'): b'"', ord("\\"): b"\\", ord("/"): b"/", ord("b"): b"\b", ord("f"): b"\f", ord("r"): b"\r"}
_ESCAPES |= {ord("n"): b"\n", ord("t"): b"\t"}


def _hex4(value: bytes, at: int) -> int:
    digits = value[at : at + 4]
    if len(digits) < 4:
        raise ParseError("incomplete hex sequence")
    if not _HEX4.fullmatch(digits):
        raise ParseError(f"invalid hex sequence {digits!r}")
    return int(digits, 16)


def _parse_value(value: bytes) -> bytes:
    """A value after ``=`` (already trimmed): quotes removed, escapes decoded, a trailing ``# comment`` cut."""
    out = bytearray()
    last_sig = 0  # length of out up to its last character that is not unquoted blank space
    mode = "normal"
    i = 0
    while i < len(value):
        v = value[i]
        if v < 32:
            raise ParseError(f"0x{v:02x} is an invalid value character")
        if v > 127:
            if mode == "escape":
                raise ParseError("multibyte characters disallowed in escape sequences")
            last_sig = len(out)  # before the byte, as go-envparse does: a "# comment" after it cuts that byte
            out.append(v)
        elif mode == "normal":
            if v == ord('"'):
                mode = "double"
            elif v == ord("'"):
                mode = "single"
            elif v == ord("#"):
                return bytes(out[:last_sig])
            else:
                out.append(v)
                if v not in (ord(" "), ord("\t")):
                    last_sig = len(out)
        elif mode == "double":
            if v == ord('"'):
                mode = "normal"
            elif v == ord("\\"):
                mode = "escape"
            else:
                out.append(v)
                last_sig = len(out)
        elif mode == "single":
            if v == ord("'"):
                mode = "normal"
            else:
                out.append(v)
                last_sig = len(out)
        else:  # escape
            if v == ord("u"):
                code = _hex4(value, i + 1)
                i += 4
                if 0xD800 <= code < 0xE000:  # a UTF-16 surrogate: its pair must follow as \uXXXX
                    if len(value) < i + 6 or value[i + 1 : i + 3] != b"\\u":
                        raise ParseError("incomplete Unicode surrogate pair")
                    low = _hex4(value, i + 3)
                    i += 6
                    ok = code < 0xDC00 and 0xDC00 <= low < 0xE000
                    code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00) if ok else 0xFFFD
                out += chr(code).encode("utf-8", "replace")
            elif v in _ESCAPES:
                out += _ESCAPES[v]
            else:
                raise ParseError(f"invalid escape sequence: {chr(v)!r}")
            last_sig = len(out)
            mode = "double"
        i += 1
    if mode != "normal":
        raise ParseError({"double": 'unmatched "', "single": "unmatched '"}.get(mode, "incomplete escape sequence"))
    return bytes(out)


def parse_os_release(data: bytes) -> dict[str, str]:
    """go-envparse's ``Parse``: key -> value, empty values left out; ParseError names the line."""
    env: dict[str, str] = {}
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    for lineno, raw in enumerate(lines, 1):
        line = raw.removesuffix(b"\r").strip(_GO_SPACE)
        if not line or line.startswith(b"#"):
            continue
        if b"=" not in line:
            raise ParseError(f"error on line {lineno}: missing =")
        key, value = (part.strip(_GO_SPACE) for part in line.split(b"=", 1))
        if len(key) > len(b"export "):
            key = key.removeprefix(b"export ")
        if not key:
            raise ParseError(f"error on line {lineno}: empty key")
        if not _KEY.fullmatch(key):
            raise ParseError(f"error on line {lineno}: invalid key {key[:40]!r}")
        try:
            parsed = _parse_value(value)
        except ParseError as exc:
            raise ParseError(f"error on line {lineno}: {exc}") from None
        if parsed:
            env[key.decode("ascii")] = parsed.decode("utf-8", "replace")
    return env


def major_minor(version_id: str) -> float:
    m = _VERSION.match(version_id.encode())
    return float(m.group().decode()) if m else 0.0


@dataclass
class OSRelease:
    """The cached release: the file it came from, its mtime, its fields and version (node_exporter's state)."""

    path: str = ""
    mtime_ns: int = -1
    fields: dict[str, str] = field(default_factory=dict)
    version: float = 0.0

    def update(self, path: Path) -> None:
        """Re-read ``path`` unless it is the cached file, unchanged; FileNotFoundError when it is absent."""
        mtime = os.stat(path).st_mtime_ns
        if str(path) == self.path and mtime == self.mtime_ns:
            return
        data = read_bounded(path, OS_RELEASE_MAX)
        self.path, self.mtime_ns = str(path), mtime
        self.fields = {}  # what node_exporter keeps when the parse below fails
        self.fields = parse_os_release(data)
        self.version = major_minor(self.fields.get("VERSION_ID", ""))


class OSCollector:
    def __init__(self) -> None:
        self.release = OSRelease()

    def collect(self, ctx: NodeContext, out: list[Family]) -> None:
        for path in CANDIDATES:
            try:
                self.release.update(ctx.rootfs(path))
                break
            except FileNotFoundError:
                continue
        else:
            raise NotPresent("no os-release file found: " + ",".join(CANDIDATES))
        fields = self.release.fields
        labels = {label: fields.get(key, "") for label, key in LABELS.items()}
        out.append(Family("node_os_info", INFO_HELP, "gauge").add(1.0, labels))
        if self.release.version > 0:
            version_labels = {"id": labels["id"], "id_like": labels["id_like"], "name": labels["name"]}
            out.append(Family("node_os_version", VERSION_HELP, "gauge").add(self.release.version, version_labels))


def make() -> OSCollector:
    return OSCollector()
