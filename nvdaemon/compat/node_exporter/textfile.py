"""textfile: the families of the ``*.prom`` files in ``nodeExporter.textfileDirectory``, plus
``node_textfile_mtime_seconds{file}`` (mtime of each file read, whole seconds) and ``node_textfile_scrape_error``.

Files are read in name order and parsed with the Prometheus text format as node_exporter's parser (expfmt) reads
it (``nvdaemon/promtext.py``): a file that does not parse, or that carries client-side timestamps, is skipped whole
and sets ``node_textfile_scrape_error`` to 1, as does a directory that cannot be listed; the collector itself never
fails.
A family without HELP gets node_exporter's generated help ("Metric read from <files>"); series missing a label
that other series of their family have get it with an empty value. A family repeated in several files is joined
when HELP and TYPE agree; otherwise the later file's copy is dropped (node_exporter's registry refuses it).
Collisions with families the agent exports are resolved by ``surface._merge_textfile``.

Each file is read up to ``nodeExporter.textfileMaxBytes``; a larger one, or one that is not a regular file (a FIFO
would block the read), is skipped like a file that does not parse, and is also listed as an error of the agent's
``node_exporter.textfile`` collector (node_exporter has no such cap, so its scrape_error alone would not say why).

Summaries and histograms keep their type: ``x{quantile}``, ``x_sum``, ``x_count``, and ``x_bucket{le}`` with the
``+Inf`` bucket Go's encoder adds when a file leaves it out.
"""

from __future__ import annotations

import glob
import math
import os

from nvdaemon.collectors.base import FileTooLarge, NotRegularFile, read_bounded
from nvdaemon.compat.node_exporter.context import NodeContext
from nvdaemon.compat.node_exporter.family import Family, FamilyType, gauge, go_float
from nvdaemon.promtext import Metric, PromTextError, TextFamily, parse_text

MTIME_HELP = "Unixtime mtime of textfiles successfully read."
ERROR_HELP = "1 if there was an error opening or reading a file, 0 otherwise"


def go_clean(path: str) -> str:
    """Go's ``filepath.Clean`` for the joined paths node_exporter labels files with."""
    cleaned = os.path.normpath(path) if path else "."
    return "/" + cleaned.lstrip("/") if cleaned.startswith("//") else cleaned


def _trunc_seconds(ns: int) -> float:
    """``float(mtime.UnixNano() / 1e9)`` in Go's integer division: whole seconds, truncated toward zero."""
    return float(ns // 1_000_000_000 if ns >= 0 else -((-ns) // 1_000_000_000))


# path -> (the bytes last read from it, their families), for the files of the last listing. A file is read every
# time (its mtime can stay the same across a rewrite within the file system's timestamp granularity) but parsed
# only when its bytes differ from the last read's: parsing was 0.3 of the collector's 0.4 ms a tick on a node
# whose files do not change between ticks. The families are shared between ticks and never changed after parsing.
_parsed: dict[str, tuple[bytes, dict[str, TextFamily]]] = {}


def _parse(path: str, data: bytes, parsed: dict[str, tuple[bytes, dict[str, TextFamily]]]) -> dict[str, TextFamily]:
    """``parse_text(data)``, or the families of the same bytes read from ``path`` last time; ``parsed`` gets them."""
    known = _parsed.get(path)
    families = known[1] if known is not None and known[0] == data else parse_text(data)
    parsed[path] = (data, families)
    return families


def _read_file(
    path: str, limit: int, parsed: dict[str, tuple[bytes, dict[str, TextFamily]]] | None = None
) -> tuple[dict[str, TextFamily], float]:
    """A file's families and mtime. A directory named ``*.prom`` reads as an empty file: node_exporter's parser
    takes the read error it meets at the start of the first line for the end of the input."""
    try:
        data = read_bounded(path, limit)
    except IsADirectoryError:
        return {}, _trunc_seconds(os.stat(path).st_mtime_ns)
    families = parse_text(data) if parsed is None else _parse(path, data, parsed)
    return families, _trunc_seconds(os.stat(path).st_mtime_ns)


def read_directory(
    pattern: str, limit: int = 4 << 20, refused: list[str] | None = None
) -> tuple[list[tuple[str, dict[str, TextFamily], float]], bool]:
    """(path, families, mtime) per ``*.prom`` file read, and whether anything failed on the way; files over
    ``limit`` bytes or not regular files are also described in ``refused``."""
    global _parsed
    errored = False
    parsed: dict[str, tuple[bytes, dict[str, TextFamily]]] = {}
    dirs = sorted(glob.glob(pattern, include_hidden=True)) if pattern else []
    read: list[tuple[str, dict[str, TextFamily], float]] = []
    for directory in dirs or [pattern]:
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            errored = errored or directory != ""  # no directory configured is no error
            continue
        for name in names:
            if not name.endswith(".prom"):
                continue
            path = go_clean(os.path.join(directory, name))
            try:
                families, mtime = _read_file(path, limit, parsed)
            except (FileTooLarge, NotRegularFile) as exc:
                errored = True
                if refused is not None:
                    refused.append(f"textfile {path}: {exc.strerror}")
                continue
            except (OSError, PromTextError):
                errored = True
                continue
            read.append((path, families, mtime))
    _parsed = parsed  # the files of this listing only: a removed file's bytes are not kept
    return read, errored


def _with_all_labels(metrics: list[Metric]) -> list[tuple[Metric, dict[str, str]]]:
    """Each metric with every label name of its family (absent ones empty), as node_exporter fills them."""
    names = {n for m in metrics for n, _ in m.labels}
    return [(m, {n: "" for n in names} | dict(m.labels)) for m in metrics]


def _uint64(value: float) -> float:
    """Counts are stored as uint64 by node_exporter's parser (fractions dropped)."""
    return float(max(0, int(value))) if math.isfinite(value) else 0.0


def convert(fam: TextFamily, help: str) -> Family:
    """Our family for one parsed family (a summary or histogram with its _sum/_count/_bucket series)."""
    if fam.type in ("counter", "gauge", "untyped"):
        kind: FamilyType = fam.type  # type: ignore[assignment]
        out = Family(fam.name, help, kind)
        for m, labels in _with_all_labels(fam.metrics):
            out.add(m.value, labels)
        return out
    kind = "summary" if fam.type == "summary" else "histogram"
    out = Family(fam.name, help, kind)
    for m, labels in _with_all_labels(fam.metrics):
        count = _uint64(m.count)
        if kind == "summary":
            for q in sorted(m.quantiles):
                out.add(m.quantiles[q], labels, quantile=go_float(q))
        else:
            bounds = sorted(m.buckets)
            for b in bounds:
                out.add_suffixed("_bucket", _uint64(m.buckets[b]), {**labels, "le": go_float(b)})
            if not bounds or not math.isinf(bounds[-1]):  # Go's text encoder adds the +Inf bucket
                out.add_suffixed("_bucket", count, {**labels, "le": "+Inf"})
        out.add_suffixed("_sum", m.sum, labels)
        out.add_suffixed("_count", count, labels)
    return out


def collect(ctx: NodeContext, out: list[Family]) -> None:
    options = ctx.options
    read, errored = read_directory(options.textfile_directory, options.textfile_max_bytes, ctx.errors)
    files_of: dict[str, list[str]] = {}
    for path, families, _ in read:
        for name in families:
            files_of.setdefault(name, []).append(path)
    joined: dict[str, Family] = {}
    for _, families, _ in read:
        for fam in families.values():
            help = fam.help if fam.help is not None else "Metric read from " + ", ".join(files_of[fam.name])
            converted = convert(fam, help)
            have = joined.get(converted.name)
            if have is None:
                joined[converted.name] = converted
            elif (have.help, have.type) == (converted.help, converted.type):
                have.samples.extend(converted.samples)
            # else: node_exporter's registry refuses the later copy (inconsistent HELP or TYPE)
    out.extend(joined.values())
    if read:
        mtimes = Family("node_textfile_mtime_seconds", MTIME_HELP, "gauge")
        for path, _, mtime in read:
            mtimes.add(mtime, file=path)
        out.append(mtimes)
    out.append(gauge("node_textfile_scrape_error", ERROR_HELP, 1.0 if errored else 0.0))
