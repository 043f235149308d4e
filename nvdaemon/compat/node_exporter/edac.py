"""edac: ``node_edac_*_errors_total`` from ``<sys>/devices/system/edac/mc/mc*`` (memory controllers, counts).

Per controller ``mc<N>``: ``ce_count``/``ue_count`` (corrected/uncorrected errors) give
``node_edac_{correctable,uncorrectable}_errors_total{controller}``; ``ce_noinfo_count``/``ue_noinfo_count`` (errors
the driver could not place) give the csrow families with ``csrow="unknown"``; each ``csrow<M>`` directory's
``ce_count``/``ue_count`` give ``node_edac_csrow_{correctable,uncorrectable}_errors_total{controller,csrow}``. The
newer per-DIMM/rank directories (``dimm<K>``, ``rank<K>``) are not read by node_exporter 1.5.

Every one of those files is required: a missing or malformed one (a csrow without ``ce_count``, for instance)
fails the collector after the series read before it were exported. No EDAC at all is a success with nothing.
"""

from __future__ import annotations

import os
import re

from nvdaemon.collectors.base import NotPresent, ParseError
from nvdaemon.compat.node_exporter.context import NodeContext
from nvdaemon.compat.node_exporter.family import Family, counter
from nvdaemon.compat.node_exporter.sysfs import read_int_file
from nvdaemon.goparse import glob_strings

_CONTROLLER = re.compile(r"mc[0-9].*", re.DOTALL)
_CSROW = re.compile(r"csrow[0-9].*", re.DOTALL)
# node_exporter takes the numbers from the whole path (unanchored, the last match of the greedy ".*").
_CONTROLLER_NUMBER = re.compile(r".*devices/system/edac/mc/mc([0-9]*)")
_CSROW_NUMBER = re.compile(r".*devices/system/edac/mc/mc[0-9]*/csrow([0-9]*)")


def read_count(ctx: NodeContext, path: str, where: str) -> int:
    """An unsigned count; a missing file is an error here (node_exporter logs it as one), not absent EDAC."""
    try:
        return read_int_file(ctx, path)
    except NotPresent as exc:
        raise ParseError(f"couldn't get {os.path.basename(path)} for {where}: no such file") from exc


def collect(ctx: NodeContext, out: list[Family]) -> None:
    ce = counter("node_edac_correctable_errors_total", "Total correctable memory errors.")
    ue = counter("node_edac_uncorrectable_errors_total", "Total uncorrectable memory errors.")
    row_ce = counter("node_edac_csrow_correctable_errors_total", "Total correctable memory errors for this csrow.")
    row_ue = counter("node_edac_csrow_uncorrectable_errors_total", "Total uncorrectable memory errors for this csrow.")
    out += [ce, ue, row_ce, row_ue]  # filled as the files are read: a failure keeps what came before it
    # Paths are built as strings: pathlib's joins took this collector from 0.21 to 0.30 ms a tick (16 files).
    for controller in glob_strings(str(ctx.sys("devices", "system", "edac", "mc")), _CONTROLLER):
        m = _CONTROLLER_NUMBER.search(controller)
        if m is None:
            raise ParseError(f"controller string didn't match regexp: {controller}")
        mc = m.group(1)
        where = f"controller {mc}"
        ce.add(read_count(ctx, f"{controller}/ce_count", where), controller=mc)
        row_ce.add(read_count(ctx, f"{controller}/ce_noinfo_count", where), controller=mc, csrow="unknown")
        ue.add(read_count(ctx, f"{controller}/ue_count", where), controller=mc)
        row_ue.add(read_count(ctx, f"{controller}/ue_noinfo_count", where), controller=mc, csrow="unknown")
        for csrow in glob_strings(controller, _CSROW):
            m = _CSROW_NUMBER.search(csrow)
            if m is None:
                raise ParseError(f"csrow string didn't match regexp: {csrow}")
            row = m.group(1)
            where = f"controller/csrow {mc}/{row}"
            row_ce.add(read_count(ctx, f"{csrow}/ce_count", where), controller=mc, csrow=row)
            row_ue.add(read_count(ctx, f"{csrow}/ue_count", where), controller=mc, csrow=row)
