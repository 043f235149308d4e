"""The attribute reads of procfs's ``internal/util``, shared by node_exporter's sysfs collectors.

Every read goes through ``ctx.read`` (the cycle's shared cache; a missing file is ``NoData``, other errors propagate
as ``OSError``). A sysfs attribute is read as procfs's ``SysReadFile`` reads it: one read(2) into a 128-byte buffer,
so a longer attribute is cut there. ``sys_read_file`` gives those bytes untrimmed (hwmon trims only newlines from
them), ``sys_read_attr`` trims them as ``SysReadFile`` does. ``read_int_file`` is ``ReadUintFromFile`` /
``ReadIntFromFile``: the whole file, trimmed, base 10.
"""

from __future__ import annotations

from nvdaemon.collectors.base import HostPath, ParseError
from nvdaemon.compat.node_exporter.context import NodeContext
from nvdaemon.goparse import parse_int, parse_uint, trim_space

SYSFS_READ_MAX = 128  # the buffer of procfs's (and node_exporter's hwmon) single read()


def first_read(text: str) -> str:
    """An attribute's text as one 128-byte read(2) gives it: its first ``SYSFS_READ_MAX`` bytes."""
    if len(text) <= SYSFS_READ_MAX // 4:  # at most 4 bytes a character: within the buffer without encoding it
        return text
    raw = text.encode()
    return raw[:SYSFS_READ_MAX].decode(errors="replace") if len(raw) > SYSFS_READ_MAX else text


def attr_value(text: str) -> str:
    """procfs's ``SysReadFile`` of an attribute's text: its first 128 bytes, ``TrimSpace``'d."""
    return trim_space(first_read(text))


def sys_read_file(ctx: NodeContext, path: HostPath) -> str:
    """The first 128 bytes of a sysfs attribute, whitespace not trimmed."""
    return first_read(ctx.read(path))


def sys_read_attr(ctx: NodeContext, path: HostPath) -> str:
    """procfs's ``SysReadFile``: the first 128 bytes of a sysfs attribute, ``TrimSpace``'d."""
    return attr_value(ctx.read(path))


def read_int_file(ctx: NodeContext, path: HostPath, signed: bool = False) -> int:
    """procfs's ReadUintFromFile / ReadIntFromFile: the whole file, TrimSpace, base 10; ParseError names the file."""
    text = trim_space(ctx.read(path))
    try:
        return parse_int(text) if signed else parse_uint(text)
    except ParseError as exc:
        raise ParseError(f"{path}: {exc}") from None
